"""The Wikipedia extraction job on the real enwiki excerpt: exact counts, schema, clean passages,
the manifest, idempotent reruns; the DoFn, the pure parts and the options."""

from __future__ import annotations

import collections
import hashlib
import re

import pytest

from common import storage
from common.errors import BadRecord, NoOutputError
from pipelines import extract_wikipedia
from pipelines.wikipedia.dump import Page, iter_pages, plan_splits
from tests.pipelines.wikipedia.wiki_runs import (
    ARTICLES,
    NUM_PASSAGES,
    RESIDUE,
    dead_letters,
    file_bytes,
    read_documents,
    run_job,
)

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
