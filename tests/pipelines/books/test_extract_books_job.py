"""The books extraction Beam job: counts and manifest on the shared books, byte-identical reruns,
the exclude option, bad inputs as dead letters, folders and same-named books."""

from __future__ import annotations

import json
import re
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from common import errors, storage
from pipelines import extract_books
from pipelines.books import cleaning as books
from pipelines.corpus.documents import DOCUMENT_SCHEMA
from tests.pipelines.books.book_names import BOOK_NAMES

# ---------------------------------------------------------------- the Beam job

def _read_docs(folder):
    return pq.read_table(folder / "documents-00000-of-00001.parquet").to_pylist()


@pytest.fixture(scope="module")
def shared_run(shared_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("books_docs")
    manifest = extract_books.main(["--input", str(shared_data / "books"), "--output", str(out)])
    return out, manifest


def test_job_on_shared_books_counts_and_manifest(shared_run, shared_data):
    out, manifest = shared_run
    docs = _read_docs(out)
    assert [d["doc_id"] for d in docs] == [f"books/{n}" for n in BOOK_NAMES]
    assert pq.read_schema(out / "documents-00000-of-00001.parquet") == DOCUMENT_SCHEMA
    assert manifest["counts"] == {
        "files_read": 12, "decoded_utf8": 10, "decoded_fallback": 2, "documents": 12,
        "passages": 16562, "headings_dropped": 610, "gutenberg_headers_stripped": 0,
        "gutenberg_footers_stripped": 1, "bad_records": 0, "passages_set_aside": 0,
        "control_chars_removed": 0, "transcriber_notes_dropped": 0, "front_matter_dropped": 0,
        "list_blocks_dropped": 0, "verse_paragraphs_split": 1, "long_paragraphs_split": 0,
        "files_excluded": 1}
    assert manifest["excluded_inputs"] == [str(shared_data / "books" / "README.nltk-gutenberg.txt")]
    assert json.loads((out / "manifest.json").read_text()) == manifest
    assert [o["path"] for o in manifest["outputs"]] == [
        "documents-00000-of-00001.parquet", "dead_letter/dead_letter-00000-of-00001.jsonl"]
    assert (out / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text() == ""
    emma = docs[0]
    assert (emma["source"], emma["title"]) == ("books", "Emma by Jane Austen 1816")
    assert emma["source_file"] == str(shared_data / "books" / "austen-emma.txt")
    assert not any("\r" in p for d in docs for p in d["passages"])


def test_job_rerun_is_byte_identical_in_two_worker_processes(shared_run, shared_data, tmp_path):
    first, _ = shared_run
    again = tmp_path / "again"
    extract_books.main(["--input", str(shared_data / "books"), "--output", str(again),
                       "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    for name in ["documents-00000-of-00001.parquet", "dead_letter/dead_letter-00000-of-00001.jsonl"]:
        assert (again / name).read_bytes() == (first / name).read_bytes(), name
    m1 = json.loads((first / "manifest.json").read_text())
    m2 = json.loads((again / "manifest.json").read_text())
    assert m1["config_hash"] == m2["config_hash"] and m1["outputs"] == m2["outputs"]


def test_exclude_option_decides_what_is_a_book(shared_data, tmp_path):
    manifest = extract_books.main(["--input", str(shared_data / "books" / "README*"),
                                  "--output", str(tmp_path), "--exclude", ""])
    assert manifest["counts"]["documents"] == 1 and manifest["counts"]["files_excluded"] == 0
    (readme,) = _read_docs(tmp_path)
    assert readme["doc_id"] == "books/README.nltk-gutenberg"
    with pytest.raises(FileNotFoundError, match="no book files left after --exclude"):
        extract_books.main(["--input", str(shared_data / "books" / "README*"),
                           "--output", str(tmp_path / "none")])


def test_bad_inputs_are_dead_letters_and_good_books_kept(tmp_path, shared_data):
    src = tmp_path / "in"
    src.mkdir()
    (src / "caesar.txt").write_bytes((shared_data / "books" / "shakespeare-caesar.txt").read_bytes())
    (src / "empty.txt").write_bytes(b"")
    (src / "garbage.txt").write_bytes(b"\x00\x01\x02\xff" * 50_000)
    (src / "oneline.txt").write_bytes(b"word " * (10 * 1024 * 1024))
    out = tmp_path / "out"
    manifest = extract_books.main(["--input", str(src), "--output", str(out), "--num_shards", "2",
                                  "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    counts = manifest["counts"]
    assert (counts["files_read"], counts["documents"], counts["bad_records"],
            counts["decoded_fallback"], counts["passages_set_aside"]) == (4, 1, 3, 1, 1)
    letters = [json.loads(line) for line in
               (out / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text().splitlines()]
    assert sorted(letters, key=lambda d: d["file"]) == [
        {"file": str(src / "empty.txt"), "record": "file", "reason": "empty file"},
        {"file": str(src / "garbage.txt"), "record": "file",
         "reason": "binary, not text: 75.0% of bytes are control characters such as NUL "
                   "(--max_control_fraction=0.01)"},
        {"file": str(src / "oneline.txt"), "record": "paragraph at line 1",
         "reason": "paragraph of 52428800 characters exceeds --max_passage_chars=50000 "
                   "(line breaks lost, or not a book)"}]
    docs = [row for i in range(2) for row in
            pq.read_table(out / f"documents-0000{i}-of-00002.parquet").to_pylist()]
    assert [d["doc_id"] for d in docs] == ["books/caesar"]
    assert len(docs[0]["passages"]) == 737


def test_duplicate_file_stems_are_refused(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "same.txt").write_text("Some text.\n")
    with pytest.raises(ValueError, match="would both be document 'books/same'"):
        extract_books.main(["--input", f"{tmp_path / 'a'},{tmp_path / 'b'}",
                           "--output", str(tmp_path / "out")])


def test_extract_fn_composite(tmp_path):
    (tmp_path / "tale.txt").write_bytes(b"[Tale by Me 1900]\r\n\r\nCHAPTER I\r\n\r\nOnce upon\r\na time.\r\n")
    (tmp_path / "blank.txt").write_bytes(b"")
    with test_pipeline.TestPipeline() as p:
        results = (p | beam.Create([storage.InputFile(str(tmp_path / name), 0, name)
                                    for name in ("tale.txt", "blank.txt")])
                   | beam.ParDo(extract_books.ExtractBookFn(books.BookConfig()))
                   .with_outputs("dead_letter", main="documents"))
        assert_that(results.documents, equal_to([{
            "doc_id": "books/tale", "source": "books", "source_file": str(tmp_path / "tale.txt"),
            "title": "Tale by Me 1900", "passages": ["Once upon a time."]}]), label="docs")
        assert_that(results.dead_letter, equal_to([json.dumps(
            {"file": str(tmp_path / "blank.txt"), "record": "file", "reason": "empty file"})]),
            label="dead")


def test_rerun_into_the_same_folder_leaves_no_stale_shard(tmp_path):
    sample = Path(__file__).resolve().parents[3] / "data" / "sample" / "books"
    out = tmp_path / "out"
    extract_books.main(["--input", str(sample), "--output", str(out), "--num_shards", "3"])
    manifest = extract_books.main(["--input", str(sample), "--output", str(out)])
    assert sorted(p.name for p in out.iterdir()) == [
        "dead_letter", "documents-00000-of-00001.parquet", "manifest.json"]
    assert manifest["counts"]["documents"] == 4 and manifest["counts"]["decoded_fallback"] == 2
    assert manifest["counts"]["gutenberg_footers_stripped"] == 1


def test_a_folder_input_reads_its_subfolders(shared_data, tmp_path):
    """books/fiction/caesar.txt and books/poetry/blake.txt are books too (sorted, deterministic);
    a dead_letter/ folder left by an earlier run is not."""
    src = tmp_path / "books"
    for name, book in [("crlf.txt", "austen-persuasion.txt"),
                       ("fiction/caesar.txt", "shakespeare-caesar.txt"),
                       ("poetry/blake.txt", "blake-poems.txt")]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes((shared_data / "books" / book).read_bytes())
    (src / "dead_letter").mkdir()
    (src / "dead_letter" / "dead_letter-00000-of-00001.jsonl").write_text('{"file": "x"}\n')
    manifest = extract_books.main(["--input", str(src), "--output", str(tmp_path / "out")])
    assert [i["path"] for i in manifest["inputs"]] == [
        str(src / "crlf.txt"), str(src / "fiction" / "caesar.txt"), str(src / "poetry" / "blake.txt")]
    assert [d["doc_id"] for d in _read_docs(tmp_path / "out")] == [
        "books/crlf", "books/fiction/caesar", "books/poetry/blake"]
    assert (manifest["counts"]["documents"], manifest["counts"]["files_excluded"]) == (3, 0)
    assert [i["bytes"] for i in manifest["inputs"]] == [
        (shared_data / "books" / book).stat().st_size
        for book in ("austen-persuasion.txt", "shakespeare-caesar.txt", "blake-poems.txt")]


def test_books_with_the_same_file_name_in_their_own_folders(shared_data, tmp_path):
    """`author/book/text.txt` trees (one folder per book, the text always text.txt): the doc_id
    is the path below the input folder, so every book is kept; a top-level file keeps its stem,
    and a glob names files below its folder."""
    src = tmp_path / "books"
    layout = [("austen/emma/text.txt", "austen-emma.txt"),
              ("austen/persuasion/text.txt", "austen-persuasion.txt"),
              ("blake/poems/text.txt", "blake-poems.txt"), ("caesar.txt", "shakespeare-caesar.txt")]
    for name, book in layout:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes((shared_data / "books" / book).read_bytes())
    manifest = extract_books.main(["--input", str(src), "--output", str(tmp_path / "out")])
    docs = _read_docs(tmp_path / "out")
    assert [(d["doc_id"], d["source_file"]) for d in docs] == [
        ("books/austen/emma/text", str(src / "austen/emma/text.txt")),
        ("books/austen/persuasion/text", str(src / "austen/persuasion/text.txt")),
        ("books/blake/poems/text", str(src / "blake/poems/text.txt")),
        ("books/caesar", str(src / "caesar.txt"))]
    assert [d["title"] for d in docs][:2] == ["Emma by Jane Austen 1816",
                                              "Persuasion by Jane Austen 1818"]
    assert manifest["counts"]["documents"] == 4
    files, _ = extract_books.select_inputs(extract_books.ExtractBooksConfig(
        input=str(src / "austen" / "*" / "text.txt"), output=str(tmp_path / "unused")))
    assert [extract_books.doc_id_for(f) for f in files] == [
        "books/emma/text", "books/persuasion/text"]


def test_only_bad_files_fail_the_run_without_a_manifest(shared_data, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    (src / "empty.txt").write_bytes(b"")
    (src / "weights.bin").write_bytes(b"\x00\x01\x02\xff" * 50_000)
    out = tmp_path / "out"
    with pytest.raises(errors.NoOutputError, match=(
            rf"^0 documents \(2 file\(s\) read\) from --input {re.escape(str(src))}: 2 bad "
            rf"record\(s\) set aside in {re.escape(str(out))}/dead_letter/dead_letter-00000-of-"
            rf"00001.jsonl \(first: {re.escape(str(src / 'empty.txt'))} file: empty file\); "
            "no manifest written$")):
        extract_books.main(["--input", str(src), "--output", str(out)])
    assert not (out / "manifest.json").exists()
    assert len((out / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text()
               .splitlines()) == 2
