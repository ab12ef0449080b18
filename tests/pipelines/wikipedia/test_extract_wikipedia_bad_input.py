"""Bad input: one job over a folder of bad files (truncated bz2, malformed XML, broken markup,
invalid UTF-8, an empty file, a 50 MB single line); each case checked on its own."""

from __future__ import annotations

import collections
import re
import tracemalloc
from pathlib import Path

import pytest

from common.errors import BadRecord
from pipelines.wikipedia.dump import Page, iter_pages, plan_splits
from tests.pipelines.wikipedia.wiki_runs import (
    ARTICLES,
    RESIDUE,
    dead_letters,
    read_documents,
    run_job,
)

# ---------------------------------------------------------------------------------------------
# Bad input: one job over a folder of bad files; each case checked on its own

GIANT_PAGE_ID = 999999999


BROKEN_MARKUP = (
    "'''Broken''' page with [[Link|bold link]] text.\n\n"
    "Second paragraph with a [[link that never closes.\n\n"
    "{|\n| a cell\n|-\n! header\nThird paragraph after an unclosed table.\n\n"
    "Fourth <ref>an unclosed reference and ]] and |} strays.\n\n"
    "Fifth {{Infobox never closed\n| name = value\n<!-- an unclosed comment\nhidden")


def page_span(xml: bytes, title: str) -> tuple[int, int]:
    start = xml.rindex(b"<page>", 0, xml.index(f"<title>{title}</title>".encode()))
    return start, xml.index(b"</page>", start) + len(b"</page>")


def replace_in_page(xml: bytes, title: str, old: bytes, new: bytes) -> bytes:
    start, end = page_span(xml, title)
    page = xml[start:end]
    assert old in page
    return xml[:start] + page.replace(old, new, 1) + xml[end:]


def replace_text(xml: bytes, title: str, wikitext: str) -> bytes:
    start, end = page_span(xml, title)
    page = xml[start:end]
    escaped = wikitext.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    page = re.sub(rb"(<text[^>]*>).*?(</text>)", lambda m: m.group(1) + escaped.encode() +
                  m.group(2), page, flags=re.DOTALL)
    return xml[:start] + page + xml[end:]


def single_line_with_giant_page(xml: bytes, size: int) -> bytes:
    """The dump on one line (newlines as &#10;) with a `size`-byte one-line page in the middle."""
    prose = (b"Berlin is the capital and largest city of Germany by both area and population. ")
    giant = (f"<page><title>Giant</title><ns>0</ns><id>{GIANT_PAGE_ID}</id><revision><id>1</id>"
             "<text xml:space=\"preserve\">").encode()
    giant += prose * (size // len(prose)) + b"</text></revision></page>"
    middle, _ = page_span(xml, "IBM")
    return (xml[:middle] + giant + xml[middle:]).replace(b"\n", b"&#10;")


@pytest.fixture(scope="module")
def bad_inputs(dump, dump_xml, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad_inputs")
    raw = dump.read_bytes()
    files = {
        "truncated.xml.bz2": raw[: int(len(raw) * 0.6)],
        "malformed.xml": replace_in_page(
            replace_in_page(dump_xml, "Dahlak SC", b"</title>", b"</titel>"),
            "Ingoldiomyces", b"</page>", b""),
        "broken_markup.xml": replace_text(dump_xml, "Borysthenia goldfussiana", BROKEN_MARKUP),
        "invalid_utf8.xml": replace_in_page(dump_xml, "Ingoldiomyces", b"monotypic",
                                            b"mono\xff\xfe\xfdtypic"),
        "empty.xml": b"",
        "single_line.xml": single_line_with_giant_page(dump_xml, 50 << 20),
    }
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return {name: folder / name for name in files}


@pytest.fixture(scope="module")
def bad_output(bad_inputs, tmp_path_factory) -> tuple[Path, dict, dict, dict]:
    output = tmp_path_factory.mktemp("bad_out")
    folder = next(iter(bad_inputs.values())).parent
    manifest = run_job(folder, output)
    docs = collections.defaultdict(dict)
    for row in read_documents(output):
        docs[Path(row["source_file"]).name][row["title"]] = row["passages"]
    bad = collections.defaultdict(list)
    for record in dead_letters(output):
        bad[Path(record["file"]).name].append(record)
    return output, manifest, docs, bad


def test_bad_inputs_job_finishes_and_counts_every_bad_record(bad_output):
    _output, manifest, docs, bad = bad_output
    assert manifest["counts"]["bad_records"] == 5 == sum(len(v) for v in bad.values())
    assert sorted(bad) == ["empty.xml", "malformed.xml", "single_line.xml", "truncated.xml.bz2"]
    assert manifest["counts"]["articles_kept"] == 9 + 21 + 23 + 23 + 23
    residue = [p for by_title in docs.values() for ps in by_title.values() for p in ps
               if RESIDUE.search(p)]
    assert residue == []


def test_truncated_bz2_keeps_pages_before_the_cut(bad_output, bad_inputs):
    _, _, docs, bad = bad_output
    assert sorted(docs["truncated.xml.bz2"]) == sorted(ARTICLES[:9])  # up to Ferdinand Piëch
    assert bad["truncated.xml.bz2"] == [{
        "file": str(bad_inputs["truncated.xml.bz2"]), "record": "bz2 stream at byte 0",
        "reason": "truncated: the file ends before the bz2 end-of-stream marker; the page in "
                  "progress (page 40379651 'IBM') and the pages in the stream are lost"}]


def test_malformed_xml_pages_are_dead_letters_and_neighbours_kept(bad_output, bad_inputs):
    _, _, docs, bad = bad_output
    assert sorted(docs["malformed.xml"]) == sorted(set(ARTICLES) - {"Dahlak SC", "Ingoldiomyces"})
    records = bad["malformed.xml"]
    assert [(r["file"], r["record"]) for r in records] == [
        (str(bad_inputs["malformed.xml"]), "page 17340400"),
        (str(bad_inputs["malformed.xml"]), "page 24755840")]
    assert records[0]["reason"].startswith("malformed XML: mismatched tag: line 2")
    assert records[1]["reason"] == ("malformed XML: <page> not closed before the next <page> "
                                    "(title 'Ingoldiomyces')")


def test_broken_markup_page_kept_without_residue(bad_output):
    _, _, docs, bad = bad_output
    assert "broken_markup.xml" not in bad
    assert len(docs["broken_markup.xml"]) == 23
    assert docs["broken_markup.xml"]["Borysthenia goldfussiana"] == [
        "Broken page with bold link text.",
        "Second paragraph with a link that never closes.",
        "Third paragraph after an unclosed table.",
        "Fourth an unclosed reference and and strays.",
        "Fifth",
    ]


def test_invalid_utf8_bytes_are_replaced_and_counted_the_page_kept(bad_output, job_output):
    """Three bytes that are not UTF-8 in one word of a page: each becomes U+FFFD (which BERT's
    tokenizer drops), counted; the page's every other character is as in the clean dump."""
    _, manifest, docs, bad = bad_output
    assert "invalid_utf8.xml" not in bad
    clean = {row["title"]: row["passages"] for row in read_documents(job_output[0])}
    assert docs["invalid_utf8.xml"].keys() == clean.keys()
    repaired = docs["invalid_utf8.xml"]["Ingoldiomyces"]
    assert [p.replace("mono\ufffd\ufffd\ufffdtypic", "monotypic") for p in repaired] == \
        clean["Ingoldiomyces"]
    assert sum(p.count("\ufffd") for p in repaired) == 3
    assert (manifest["counts"]["pages_with_invalid_utf8"],
            manifest["counts"]["invalid_utf8_bytes_replaced"]) == (1, 3)


def test_empty_file_is_a_dead_letter(bad_output, bad_inputs):
    _, manifest, docs, bad = bad_output
    assert "empty.xml" not in docs
    assert bad["empty.xml"] == [{"file": str(bad_inputs["empty.xml"]), "record": "file",
                                 "reason": "empty file (0 bytes)"}]
    assert {"path": str(bad_inputs["empty.xml"]), "size_bytes": 0} in manifest["inputs"]


def test_single_line_50mb_file_giant_page_set_aside_rest_kept(bad_output, bad_inputs, job_output):
    _, _, docs, bad = bad_output
    assert bad_inputs["single_line.xml"].stat().st_size > 50 << 20
    assert b"\n" not in bad_inputs["single_line.xml"].read_bytes()
    assert bad["single_line.xml"] == [{
        "file": str(bad_inputs["single_line.xml"]), "record": f"page {GIANT_PAGE_ID}",
        "reason": "page larger than --max_page_bytes=16777216 (title 'Giant')"}]
    expected = {row["title"]: row["passages"] for row in read_documents(job_output[0])}
    assert docs["single_line.xml"] == expected  # &#10; newlines read as newlines


def test_single_line_50mb_file_reads_in_flat_memory(bad_inputs):
    path = str(bad_inputs["single_line.xml"])
    tracemalloc.start()
    try:
        items = [item for split in plan_splits(path, 1 << 30)
                 for item in iter_pages(split, max_page_bytes=1 << 20)]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    pages = [i for i in items if isinstance(i, Page)]
    assert len(pages) == 27 and [i.record for i in items if isinstance(i, BadRecord)] == [
        f"page {GIANT_PAGE_ID}"]
    # One 1 MiB read chunk + at most one page (the dump's largest is 227 KB): far below 50 MB.
    assert peak < 8 << 20, peak
