"""The Wikipedia extraction job and dump reader on the real enwiki excerpt, good and bad.

The Beam job really runs (DirectRunner, once with two worker processes). Bad inputs are built in
tmp_path from the real dump: a truncated .bz2, malformed XML, broken markup, invalid UTF-8, an
empty file and a 50 MB single-line file.
"""
from __future__ import annotations

import bz2
import collections
import hashlib
import itertools
import json
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from common import storage
from common.errors import BadRecord, NoOutputError
from pipelines import extract_wikipedia
from pipelines.corpus.documents import DOCUMENT_SCHEMA
from pipelines.wikipedia.dump import Page, bz2_stream_offsets, iter_pages, plan_splits

DUMP = "wiki/enwiki-dbpedia-minidump-pages-articles.xml.bz2"
REPO = Path(__file__).resolve().parents[1]
# The 23 articles of the dump: 27 pages minus 2 redirects, 1 disambiguation, 1 Category page.
ARTICLES = [
    "? (film)", "Angela Merkel", "Arthur Schopenhauer", "Asda", "Atlantic Ocean", "Berlin",
    "Borysthenia goldfussiana", "Dahlak SC", "Ferdinand Piëch", "IBM", "IKEA", "Ingoldiomyces",
    "Jim Pewter", "Kerala Agricultural University", "Marian Breland Bailey", "Mini (Mark I)",
    "N.EX.T", "Ranma ½", "Redd Kross", 'Ren & Stimpy "Adult Party Cartoon"', "Samsung",
    "The Ren & Stimpy Show", "Vehicle registration plates of China",
]
NUM_PASSAGES = 1185  # as tests/test_wikitext.py counts them on the same dump
RESIDUE = re.compile(r"\[\[|\]\]|\{\{|\}\}|\{\||\|\}|'''|==|<!--|-->|</?[A-Za-z][^<>]*>"
                     r"|&(?:[a-z]+|#\d+);|(?m:^[*#;:|!])")


# The debug preset: one split per bz2 stream, 4-document row groups.
DEBUG_ARGS = [f"--{name}={value}" for name, value in
              sorted(vars(extract_wikipedia.tiny()).items())]


def run_job(input_path, output, *extra) -> dict:
    return extract_wikipedia.main(["--input", str(input_path), "--output", str(output), *extra])


def read_documents(output: Path) -> list[dict]:
    rows = []
    for path in sorted(output.glob("documents-*.parquet")):
        table = pq.read_table(path)
        assert table.schema.equals(DOCUMENT_SCHEMA, check_metadata=False), path
        rows.extend(table.to_pylist())
    return rows


def dead_letters(output: Path) -> list[dict]:
    files = sorted((output / "dead_letter").glob("*.jsonl"))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


def file_bytes(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def without_source(rows: list[dict]) -> list[dict]:
    return sorted(({k: v for k, v in row.items() if k != "source_file"} for row in rows),
                  key=lambda row: row["doc_id"])


@pytest.fixture(scope="module")
def dump(shared_data) -> Path:
    return shared_data / DUMP


@pytest.fixture(scope="module")
def dump_xml(dump) -> bytes:
    return bz2.decompress(dump.read_bytes())


@pytest.fixture(scope="module")
def job_output(dump, tmp_path_factory) -> tuple[Path, dict]:
    output = tmp_path_factory.mktemp("wiki_out")
    return output, run_job(dump, output)


# ---------------------------------------------------------------------------------------------
# The job on the real dump

def test_job_counts_exactly(job_output, dump):
    _, manifest = job_output
    counts = manifest["counts"]
    assert {k: counts[k] for k in ("pages_read", "articles_kept", "skipped_redirect",
                                   "skipped_disambiguation", "skipped_namespace", "skipped_empty",
                                   "bad_records", "passages", "passages_residue_dropped")} == {
        "pages_read": 27, "articles_kept": 23, "skipped_redirect": 2,
        "skipped_disambiguation": 1, "skipped_namespace": 1, "skipped_empty": 0,
        "bad_records": 0, "passages": NUM_PASSAGES, "passages_residue_dropped": 0}
    assert counts["page_bytes"] == 1547257  # the XML of the 27 <page> elements
    # Kerala Agricultural University's list line "*College of Forestry, ..., [[Thrissur]".
    assert (counts["templates_unclosed"], counts["links_unclosed"]) == (0, 1)
    assert manifest["inputs"] == [{"path": str(dump), "size_bytes": 421382}]


def test_job_documents_schema_ids_and_titles(job_output, dump):
    output, _manifest = job_output
    rows = read_documents(output)
    assert sorted(row["title"] for row in rows) == sorted(ARTICLES)
    by_title = {row["title"]: row for row in rows}
    assert by_title["Angela Merkel"]["doc_id"] == "wiki/72671"
    assert by_title["Berlin"]["doc_id"] == "wiki/3354"
    assert by_title["Atlantic Ocean"]["doc_id"] == "wiki/698"
    assert {row["source"] for row in rows} == {"wikipedia"}
    assert {row["source_file"] for row in rows} == {str(dump)}
    assert sum(len(row["passages"]) for row in rows) == NUM_PASSAGES
    assert len({row["doc_id"] for row in rows}) == 23


def test_job_passages_are_clean_and_known_sentences_present(job_output):
    output, _ = job_output
    by_title = {row["title"]: row["passages"] for row in read_documents(output)}
    residue = [p for passages in by_title.values() for p in passages if RESIDUE.search(p)]
    assert residue == []
    assert ("IKEA is a Swedish-origin Dutch-headquartered multinational conglomerate that designs "
            "and sells ready-to-assemble furniture, kitchen appliances and home accessories, among "
            "other goods and home services.") in by_title["IKEA"][0]
    assert by_title["Berlin"][0].startswith(
        "Berlin is the capital and largest city of Germany by both area and population. Its 3.7 "
        "million inhabitants make it the European Union's most populous city, according to "
        "population within city limits.")
    assert by_title["Dahlak SC"] == ["Dahlak is an Eritrean football club based in Asmara."]


def test_job_manifest_lists_outputs_with_sha256_and_is_written_last(job_output):
    output, manifest = job_output
    assert manifest == storage.read_manifest(str(output))
    assert manifest["config"]["split_bytes"] == extract_wikipedia.WikipediaConfig().split_bytes
    assert manifest["config_hash"] == storage.config_hash(manifest["config"])
    assert [o["path"] for o in manifest["outputs"]] == ["documents-00000-of-00001.parquet"]
    for entry in manifest["outputs"]:
        data = (output / entry["path"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
        assert len(data) == entry["size_bytes"] and entry["num_documents"] == 23
    assert dead_letters(output) == []
    assert (output / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text() == ""
    assert not [p for p in output.rglob("*") if p.name.startswith(".")]  # no temp files left


def test_rerun_is_idempotent_byte_for_byte(job_output, dump):
    output, manifest = job_output
    before = file_bytes(output)
    assert run_job(dump, output) == manifest
    assert file_bytes(output) == before


# ---------------------------------------------------------------------------------------------
# Multistream: one split per bz2 stream gives the same documents

def build_multistream(xml: bytes, folder: Path, pages_per_stream: int = 5) -> Path:
    """A pages-articles-multistream.xml.bz2 as Wikimedia builds it: header, N pages, footer."""
    starts = [m.start() for m in re.finditer(rb"<page>", xml)]
    footer = xml.rindex(b"</mediawiki>")
    cuts = [0, *starts[::pages_per_stream], footer, len(xml)]
    path = folder / "mini-multistream.xml.bz2"
    path.write_bytes(b"".join(bz2.compress(xml[a:b]) for a, b in itertools.pairwise(cuts)))
    return path


def test_reader_per_stream_splits_equal_plain_file(dump_xml, tmp_path):
    plain = tmp_path / "mini.xml"
    plain.write_bytes(dump_xml)
    expected = [p for s in plan_splits(str(plain), 1 << 30) for p in iter_pages(s)]
    assert len(expected) == 27 and all(isinstance(p, Page) for p in expected)

    multistream = build_multistream(dump_xml, tmp_path)
    splits = plan_splits(str(multistream), 0)
    assert len(splits) == 8  # header, 6 streams of <= 5 pages, footer
    assert [p for s in splits for p in iter_pages(s)] == expected
    # pbzip2-style streams cut mid-page: each page still read exactly once.
    cut = tmp_path / "pbzip2.xml.bz2"
    cut.write_bytes(b"".join(bz2.compress(dump_xml[i:i + 100_000])
                             for i in range(0, len(dump_xml), 100_000)))
    assert len(plan_splits(str(cut), 0)) == 16
    assert [p for s in plan_splits(str(cut), 0) for p in iter_pages(s)] == expected
    # Byte ranges of the plain file, cut anywhere, too.
    assert [p for s in plan_splits(str(plain), 40_000) for p in iter_pages(s)] == expected


def test_reader_tags_cut_by_any_chunk_boundary(dump_xml, tmp_path):
    plain = tmp_path / "mini.xml"
    plain.write_bytes(dump_xml)
    expected = [p for s in plan_splits(str(plain), 1 << 30) for p in iter_pages(s)]
    # 7-byte reads cut every "<page>"/"</page>" tag somewhere; 61 and 4099 land elsewhere.
    for chunk_bytes, split_bytes in ((7, 1 << 30), (61, 40_000), (4099, 40_000)):
        got = [p for s in plan_splits(str(plain), split_bytes)
               for p in iter_pages(s, chunk_bytes=chunk_bytes)]
        assert got == expected, chunk_bytes
    multistream = build_multistream(dump_xml, tmp_path)
    assert [p for s in plan_splits(str(multistream), 0)
            for p in iter_pages(s, chunk_bytes=61)] == expected


def test_corrupt_stream_costs_only_its_own_pages(dump_xml, tmp_path):
    multistream = build_multistream(dump_xml, tmp_path)
    offsets = bz2_stream_offsets(str(multistream))
    data = bytearray(multistream.read_bytes())
    data[(offsets[3] + offsets[4]) // 2] ^= 0x55  # the stream of pages 11-15
    multistream.write_bytes(bytes(data))
    [split] = plan_splits(str(multistream), 1 << 30)  # one split reads all 8 streams
    items = list(iter_pages(split))
    titles = [i.title for i in items if isinstance(i, Page)]
    lost = ["Ferdinand Piëch", "Food (disambiguation)", "IBM", "IKEA", "Ingoldiomyces"]
    assert len(titles) == 22 and not set(lost) & set(titles)
    assert "Jim Pewter" in titles and "Dahlak SC" in titles  # the neighbours either side
    assert [i for i in items if isinstance(i, BadRecord)] == [BadRecord(
        str(multistream), f"bz2 stream at byte {offsets[3]}",
        "corrupt compressed data (Invalid data stream); the pages in it are lost")]


def test_multistream_index_file_gives_the_same_stream_offsets(dump_xml, tmp_path):
    multistream = build_multistream(dump_xml, tmp_path)
    scanned = bz2_stream_offsets(str(multistream))
    index_lines = [f"{offset}:{n}:Title {n}" for n, offset in enumerate(scanned[1:-1])]
    index = tmp_path / "mini-multistream-index.txt.bz2"
    index.write_bytes(bz2.compress("\n".join(index_lines).encode() + b"\n"))
    # The index lists page streams only; the footer stream then joins the last split.
    assert bz2_stream_offsets(str(multistream)) == scanned[:-1]


@pytest.fixture(scope="module")
def multistream_output(dump_xml, tmp_path_factory) -> tuple[Path, Path, dict]:
    folder = tmp_path_factory.mktemp("multistream")
    path = build_multistream(dump_xml, folder)
    output = folder / "out"
    return path, output, run_job(path, output, *DEBUG_ARGS)


def test_job_multistream_per_stream_same_documents(multistream_output, job_output):
    _path, output, manifest = multistream_output
    assert len(manifest["outputs"]) == 8
    assert manifest["config"]["row_group_docs"] == 4
    row_groups = [pq.ParquetFile(output / o["path"]).num_row_groups for o in manifest["outputs"]]
    # Articles per stream of 5 pages: 4, 4, 4, 5, 4, 2 (the header and footer streams: none).
    assert row_groups == [0, 1, 1, 1, 2, 1, 1, 0]
    assert manifest["counts"] == job_output[1]["counts"]
    assert without_source(read_documents(output)) == without_source(read_documents(job_output[0]))


def test_job_command_line_multi_processing_gives_the_same_bytes(multistream_output, tmp_path):
    # `python pipelines/extract_wikipedia.py ...` as a user types it: two worker processes
    # must unpickle the job's classes, so the script must not define them in __main__.
    path, output, manifest = multistream_output
    parallel = tmp_path / "parallel"
    command = [sys.executable, str(REPO / "pipelines" / "extract_wikipedia.py"),
               "--input", str(path), "--output", str(parallel), *DEBUG_ARGS,
               "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert storage.read_manifest(str(parallel)) == manifest
    assert file_bytes(parallel) == file_bytes(output)


def test_rerun_with_another_split_plan_removes_stale_shards(multistream_output, tmp_path):
    path, output, _ = multistream_output
    folder = tmp_path / "restale"
    for name, data in file_bytes(output).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    manifest = run_job(path, folder)  # default split_bytes: one split for this small file
    assert sorted(p.name for p in folder.glob("documents-*")) == [
        "documents-00000-of-00001.parquet"]
    assert manifest["counts"]["articles_kept"] == 23


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
        "invalid_utf8.xml": replace_in_page(dump_xml, "Ingoldiomyces", b"Tilletiaceae",
                                            b"Tille\xff\xfetiaceae"),
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
    assert manifest["counts"]["bad_records"] == 6 == sum(len(v) for v in bad.values())
    assert sorted(bad) == ["empty.xml", "invalid_utf8.xml", "malformed.xml", "single_line.xml",
                           "truncated.xml.bz2"]
    assert manifest["counts"]["articles_kept"] == 9 + 21 + 23 + 22 + 23
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


def test_invalid_utf8_page_is_a_dead_letter(bad_output, bad_inputs):
    _, _, docs, bad = bad_output
    assert sorted(docs["invalid_utf8.xml"]) == sorted(set(ARTICLES) - {"Ingoldiomyces"})
    [record] = bad["invalid_utf8.xml"]
    assert record["file"] == str(bad_inputs["invalid_utf8.xml"])
    assert record["record"] == "page 24755840"
    assert re.fullmatch(r"invalid UTF-8 at byte \d+ of the page \(b'\\xff\\xfeti'\) "
                        r"\(title 'Ingoldiomyces'\)", record["reason"]), record["reason"]


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


def test_extract_dofn_emits_split_results_and_beam_counters(dump, tmp_path):
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    splits = list(enumerate(plan_splits(str(dump), 1 << 30)))
    dofn = extract_wikipedia.ExtractDoFn(str(tmp_path), len(splits),
                                         extract_wikipedia.WikipediaConfig())
    expected = {"pages_read": 27, "page_bytes": 1547257, "articles_kept": 23,
                "skipped_redirect": 2, "skipped_disambiguation": 1, "skipped_namespace": 1,
                "passages": NUM_PASSAGES}
    pipeline = TestPipeline()
    results = (pipeline | beam.Create(splits) | beam.ParDo(dofn)
               | beam.Map(lambda r: (r.output, r.num_documents, r.bad_records)))
    assert_that(results, equal_to([("documents-00000-of-00001.parquet", 23, ())]))
    result = pipeline.run()
    result.wait_until_finish()
    query = result.metrics().query(MetricsFilter().with_namespace("extract_wikipedia"))
    counters = {c.key.metric.name: c.committed for c in query["counters"]}
    assert {name: counters[name] for name in expected} == expected


# ---------------------------------------------------------------------------------------------
# Pure parts and options

def test_page_document_counts_skip_reasons_exactly():
    counts: collections.Counter[str] = collections.Counter()

    def counter(name, value=1):
        counts[name] += value

    def page(title, text, ns=0, redirect=False):
        return Page(page_id=7, title=title, namespace=ns, redirect=redirect, text=text,
                    source_bytes=100)

    assert extract_wikipedia.page_document(page("Talk:X", "Hi.", ns=1), "f", counter) is None
    assert extract_wikipedia.page_document(page("X", "#REDIRECT [[Y]]"), "f", counter) is None
    assert extract_wikipedia.page_document(page("X", "x", redirect=True), "f", counter) is None
    assert extract_wikipedia.page_document(page("X", "A.\n{{dab}}"), "f", counter) is None
    assert extract_wikipedia.page_document(page("X", "* only a list"), "f", counter) is None
    document = extract_wikipedia.page_document(page("X", "'''X''' is.\n\nTwo."), "f", counter)
    assert document.to_record() == {"doc_id": "wiki/7", "source": "wikipedia",
                                    "source_file": "f", "title": "X", "passages": ["X is.", "Two."]}
    assert dict(counts) == {"pages_read": 6, "page_bytes": 600, "skipped_namespace": 1,
                            "skipped_redirect": 2, "skipped_disambiguation": 1,
                            "skipped_empty": 1, "articles_kept": 1, "passages": 2}


def test_a_page_the_cleaner_fails_on_becomes_a_bad_record():
    broken = Page(page_id=5, title="Odd", namespace=0, redirect=False, text=None,
                  source_bytes=10)  # not a str: the cleaner raises TypeError
    record = extract_wikipedia.read_page(broken, "dump.xml", lambda name, value=1: None)
    assert isinstance(record, BadRecord)
    assert (record.file, record.record) == ("dump.xml", "page 5")
    assert record.reason.startswith("extraction failed: TypeError: ")
    assert record.reason.endswith("(title 'Odd')")


def test_parser_lists_job_options_and_config_validation_names_the_flag():
    help_text = extract_wikipedia.build_parser().format_help()
    for flag in ("--input", "--output", "--split_bytes", "--max_page_bytes", "--row_group_docs"):
        assert flag in help_text
    with pytest.raises(ValueError, match="--split_bytes"):
        extract_wikipedia.WikipediaConfig(split_bytes=-1)
    with pytest.raises(ValueError, match="--max_page_bytes"):
        extract_wikipedia.WikipediaConfig(max_page_bytes=10)


def test_missing_input_names_the_pattern(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        run_job(tmp_path / "nothing-here*.xml.bz2", tmp_path / "out")


def test_old_exports_without_ns_use_the_title_prefix(tmp_path):
    def page(page_id, title):
        return (f"<page><title>{title}</title><id>{page_id}</id><revision><id>1</id>"
                f"<text>Text of {title}.</text></revision></page>")
    dump = tmp_path / "old.xml"
    dump.write_text(f"<mediawiki>{page(1, 'Kill Bill: Volume 1')}{page(2, 'Talk:Berlin')}"
                    f"{page(3, 'Category:Cities')}</mediawiki>")
    pages = [p for s in plan_splits(str(dump), 1 << 30) for p in iter_pages(s)]
    assert [(p.page_id, p.namespace, p.text) for p in pages] == [
        (1, 0, "Text of Kill Bill: Volume 1."), (2, 1, "Text of Talk:Berlin."),
        (3, 1, "Text of Category:Cities.")]


def test_input_with_no_article_fails_naming_it_and_writes_no_manifest(shared_data, dump_xml,
                                                                       tmp_path):
    """A book (.txt) or a gzipped dump (a format the reader does not take) gives no article:
    the run fails with the reason instead of finishing "complete" and empty."""
    import gzip

    gz = tmp_path / "dump.xml.gz"
    gz.write_bytes(gzip.compress(dump_xml))
    for path in (shared_data / "books" / "shakespeare-caesar.txt", gz):
        out = tmp_path / f"out_{path.name}"
        with pytest.raises(NoOutputError, match=(
                rf"^0 documents \(0 pages read, 0 redirects, 0 empty\) from --input "
                rf"{re.escape(str(path))}: 1 bad record\(s\) set aside in "
                rf"{re.escape(str(out))}/dead_letter/dead_letter-00000-of-00001.jsonl \(first: "
                rf"{re.escape(str(path))} file: no <page> element: not a MediaWiki XML dump\); "
                "no manifest written$")):
            run_job(path, out)
        assert not (out / storage.MANIFEST_NAME).exists()



def test_a_folder_with_a_multistream_dump_and_its_index_reads_the_dump_once(
        multistream_output, job_output, tmp_path):
    """Wikimedia publishes the index beside the dump: the index is how the dump is cut, not
    a second input (read as a dump it would be a dead letter)."""
    path, _, _ = multistream_output
    folder = tmp_path / "dumps"
    (folder / "enwiki").mkdir(parents=True)
    dump = folder / "enwiki" / path.name
    dump.write_bytes(path.read_bytes())
    offsets = bz2_stream_offsets(str(dump))
    (folder / "enwiki" / "mini-multistream-index.txt.bz2").write_bytes(bz2.compress("".join(
        f"{offset}:{n}:Title {n}\n" for n, offset in enumerate(offsets[1:-1])).encode()))
    manifest = run_job(folder, tmp_path / "out", *DEBUG_ARGS)
    assert [i["path"] for i in manifest["inputs"]] == [str(dump)]
    assert manifest["counts"] == job_output[1]["counts"]


PARTITIONS = ("enwiki-20240101-pages-articles-multistream1.xml-p1p41242.bz2",
              "enwiki-20240101-pages-articles-multistream2.xml-p41243p151573.bz2")
PARTITION_INDEXES = ("enwiki-20240101-pages-articles-multistream-index1.txt-p1p41242.bz2",
                     "enwiki-20240101-pages-articles-multistream-index2.txt-p41243p151573.bz2")


def test_partitioned_dump_names_and_their_index_names():
    from pipelines.wikipedia.dump import index_name_for, is_index_file

    assert [index_name_for(f"gs://b/{name}") for name in PARTITIONS] == [
        f"gs://b/{name}" for name in PARTITION_INDEXES]
    assert index_name_for("enwiki-20240101-pages-articles-multistream.xml.bz2") == \
        "enwiki-20240101-pages-articles-multistream-index.txt.bz2"
    assert index_name_for("wiki2024.xml.bz2") == "wiki2024-index.txt.bz2"
    assert index_name_for("dump.xml") is None
    assert [is_index_file(n) for n in (*PARTITION_INDEXES, "a-multistream-index.txt.bz2",
                                       *PARTITIONS, "enwiki-pages-articles.xml.bz2",
                                       "index.txt.bz2")] == [True] * 3 + [False] * 4


def test_a_folder_of_partitioned_multistream_dumps_skips_their_indexes(
        multistream_output, job_output, tmp_path):
    """enwiki is published in partitions, each with its own index
    (...-multistream-index1.txt-p1p41242.bz2): each index cuts its partition and is no input."""
    path, _, _ = multistream_output
    folder = tmp_path / "enwiki"
    folder.mkdir()
    offsets = bz2_stream_offsets(str(path))
    for dump, index in zip(PARTITIONS, PARTITION_INDEXES):
        (folder / dump).write_bytes(path.read_bytes())
        (folder / index).write_bytes(bz2.compress("".join(
            f"{offset}:{n}:Title {n}\n" for n, offset in enumerate(offsets[1:-1])).encode()))
    # The index lists page streams only (no footer stream): read from it, not scanned.
    assert bz2_stream_offsets(str(folder / PARTITIONS[0])) == offsets[:-1]
    manifest = run_job(folder, tmp_path / "out", *DEBUG_ARGS)
    assert [i["path"] for i in manifest["inputs"]] == [str(folder / name) for name in PARTITIONS]
    assert [i["size_bytes"] for i in manifest["inputs"]] == [path.stat().st_size] * 2
    assert manifest["counts"] == {k: 2 * v for k, v in job_output[1]["counts"].items()}
    with pytest.raises(FileNotFoundError, match="holds only multistream index files"):
        run_job(folder / PARTITION_INDEXES[0], tmp_path / "out_index")
