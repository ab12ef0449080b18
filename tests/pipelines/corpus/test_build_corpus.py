"""build_corpus: dedupe across sources, sentences, the Parquet corpus and the reference text format."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from common import errors, storage
from pipelines import build_corpus, extract_books, extract_wikipedia, parquet_io
from pipelines.corpus import build as corpus_build
from pipelines.corpus.documents import CORPUS_SCHEMA, DOCUMENT_SCHEMA
from pipelines.corpus.sentences import split_passages

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "sample"
CORPUS = "corpus-00000-of-00001"


def doc(doc_id: str, passages: list[str], source_file: str = "f.txt", title: str = "T") -> dict:
    return {"doc_id": doc_id, "source": doc_id.split("/")[0], "source_file": source_file,
            "title": title, "passages": passages}


def write_documents(folder: Path, docs: list[dict]) -> Path:
    """A documents folder as an extraction job leaves it: shard + manifest."""
    parquet_io.write_shard(str(folder), "documents", 0, 1, docs, DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0123456789abcdef"})
    return folder


def read_corpus(folder: Path) -> list[dict]:
    return pq.read_table(folder / f"{CORPUS}.parquet").to_pylist()


# ---------------------------------------------------------------- pure functions

def test_normalisation_ignores_case_width_and_whitespace():
    a = doc("books/a", ["The  ﬁrst\tline.", "Ｓecond   LINE."])
    b = doc("books/b", ["the first line. second line."])
    assert corpus_build.normalized_text(a["passages"]) == "the first line. second line."
    assert corpus_build.dedupe_key(a) == corpus_build.dedupe_key(b)
    assert corpus_build.dedupe_key(a) != corpus_build.dedupe_key(doc("books/c", ["the first line."]))


def test_keep_first_is_the_smallest_doc_id():
    kept, removed = corpus_build.keep_first([doc("wiki/9", ["x"]), doc("books/z", ["x"]),
                                             doc("books/a", ["x"], "b.txt")])
    assert kept["doc_id"] == "books/a"
    assert [r["doc_id"] for r in removed] == ["books/z", "wiki/9"]


def test_keep_first_is_the_same_whatever_the_order_of_ties():
    # Same doc_id and source_file (a folder given twice, re-extracted differently): the order
    # GroupByKey delivers them in must not decide which one is kept.
    a = doc("books/a", ["Version one."], title="A")
    b = doc("books/a", ["Version two."], title="A")
    c = doc("books/a", ["Version one."], title="B")
    for records in ([a, b, c], [c, b, a], [b, c, a]):
        kept, removed = corpus_build.keep_first(records)
        assert kept == a and removed == [b, c]


def test_reference_text_format():
    assert parquet_io.reference_text([["A.", "B."], ["C."]]) == "A.\nB.\n\nC.\n\n"
    assert parquet_io.reference_text([]) == ""


# ---------------------------------------------------------------- the composite

def test_build_corpus_composite_dedupes_and_sets_aside():
    docs = [doc("books/b", ["Hello there.  Mr. Smith left."], "b.txt"),
            doc("wiki/1", ["HELLO there. mr. smith   left."], "w.xml"),
            doc("books/a", ["Other text. Fine."], "a.txt"),
            doc("books/empty", ["   "], "e.txt")]
    with test_pipeline.TestPipeline() as p:
        built = p | beam.Create(docs) | build_corpus.BuildCorpus()
        assert_that(built["corpus"], equal_to([
            {**doc("books/a", ["Other text. Fine."], "a.txt"), "sentences": ["Other text.", "Fine."]},
            {**doc("books/b", ["Hello there.  Mr. Smith left."], "b.txt"),
             "sentences": ["Hello there.", "Mr. Smith left."]}]), label="corpus")
        assert_that(built["duplicates"], equal_to([json.dumps(
            {"removed": "wiki/1", "removed_file": "w.xml", "kept": "books/b", "kept_file": "b.txt"})]),
            label="duplicates")
        assert_that(built["dead_letter"], equal_to([json.dumps(
            {"file": "e.txt", "record": "books/empty", "reason": "document has no sentence"})]),
            label="dead")


# ---------------------------------------------------------------- the job

def test_text_output_is_the_reference_format_exactly(tmp_path):
    docs_dir = write_documents(tmp_path / "docs", [
        doc("wiki/12", ["Mr. Smith came. He left."], "w.xml"),
        doc("books/a", ["First one. Second one.", "Third, in a\nnew paragraph."], "a.txt"),
        doc("books/b", ["Only sentence here"], "b.txt")])
    out = tmp_path / "corpus"
    manifest = build_corpus.main(["--input", str(docs_dir), "--output", str(out), "--text_output"])
    assert (out / f"{CORPUS}.txt").read_text(encoding="utf-8") == (
        "First one.\nSecond one.\nThird, in a new paragraph.\n"
        "\n"
        "Only sentence here\n"
        "\n"
        "Mr. Smith came.\nHe left.\n"
        "\n")  # a file's last document ends too: the reference reads on across files
    rows = read_corpus(out)
    assert [r["doc_id"] for r in rows] == ["books/a", "books/b", "wiki/12"]
    assert rows[0]["sentences"] == ["First one.", "Second one.", "Third, in a new paragraph."]
    assert pq.read_schema(out / f"{CORPUS}.parquet") == CORPUS_SCHEMA
    assert manifest["counts"] == {
        "input_files": 1, "documents_read": 3, "duplicates_removed": 0, "doc_id_conflicts": 0,
        "documents_without_sentences": 0, "near_duplicates_removed": 0, "quality_dropped": 0,
        "bad_records": 0, "documents": 3, "passages": 4, "sentences": 6}
    assert manifest["input_config_hashes"] == {str(docs_dir): "0123456789abcdef"}
    assert [o["path"] for o in manifest["outputs"]] == [
        f"{CORPUS}.parquet", f"{CORPUS}.txt", "dead_letter/dead_letter-00000-of-00001.jsonl",
        "duplicates/duplicates-00000-of-00001.jsonl"]


def _shouting_copy(src: Path, dst: Path) -> None:
    """The same book in title case ("Hence: Home You Idle Creatures"), with doubled spaces, extra
    blank lines, CRLF line ends and UTF-8 instead of Latin-1. (Not lower case: headings such as
    "Actus Primus." are told from prose by their capitals.)"""
    text = src.read_bytes().decode("cp1252").title().replace(" ", "  ").replace("\n\n", "\n\n\n")
    dst.write_bytes(text.replace("\n", "\r\n").encode("utf-8"))


@pytest.fixture(scope="module")
def two_book_folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("dedupe")
    a, b = root / "books_a", root / "books_b"
    a.mkdir()
    b.mkdir()
    for name in ("austen-emma.txt", "shakespeare-caesar.txt"):
        shutil.copy(SAMPLE / "books" / name, a / name)
    shutil.copy(SAMPLE / "books" / "melville-moby_dick.txt", b / "melville-moby_dick.txt")
    _shouting_copy(SAMPLE / "books" / "shakespeare-caesar.txt", b / "shakespeare-caesar-copy.txt")
    for folder in (a, b):
        extract_books.main(["--input", str(folder), "--output", str(root / f"docs_{folder.name}")])
    return root


def test_duplicate_book_across_folders_is_removed_and_counted(two_book_folders, tmp_path):
    root = two_book_folders
    inputs = f"{root / 'docs_books_a'},{root / 'docs_books_b'}"
    out = tmp_path / "corpus"
    manifest = build_corpus.main(["--input", inputs, "--output", str(out), "--text_output"])
    counts = manifest["counts"]
    assert (counts["input_files"], counts["documents_read"], counts["duplicates_removed"],
            counts["documents"]) == (2, 4, 1, 3)
    rows = read_corpus(out)
    assert [r["doc_id"] for r in rows] == ["books/austen-emma", "books/melville-moby_dick",
                                           "books/shakespeare-caesar"]
    assert (out / "duplicates" / "duplicates-00000-of-00001.jsonl").read_text().splitlines() == [
        json.dumps({"removed": "books/shakespeare-caesar-copy",
                    "removed_file": str(root / "books_b" / "shakespeare-caesar-copy.txt"),
                    "kept": "books/shakespeare-caesar",
                    "kept_file": str(root / "books_a" / "shakespeare-caesar.txt")})]
    # The text format: one block per document, in Parquet order, no blank line inside a block.
    text = (out / f"{CORPUS}.txt").read_text(encoding="utf-8")
    assert text.endswith(".\n\n")
    blocks = text[:-2].split("\n\n")
    assert [block.split("\n") for block in blocks] == [r["sentences"] for r in rows]
    assert all(line.strip() == line and line for b in blocks for line in b.split("\n"))
    assert counts["sentences"] == sum(len(r["sentences"]) for r in rows) == text.count("\n") - 3
    for row in rows:
        assert row["sentences"] == split_passages(row["passages"])


def test_rerun_in_two_processes_is_byte_identical(two_book_folders, tmp_path):
    root = two_book_folders
    inputs = f"{root / 'docs_books_a'},{root / 'docs_books_b'}"
    first, again = tmp_path / "first", tmp_path / "again"
    m1 = build_corpus.main(["--input", inputs, "--output", str(first), "--text_output"])
    m2 = build_corpus.main(["--input", inputs, "--output", str(again), "--text_output",
                           "--direct_num_workers=2", "--direct_running_mode=multi_processing"])
    assert m1["outputs"] == m2["outputs"] and m1["config_hash"] == m2["config_hash"]
    for entry in m1["outputs"]:
        assert (first / entry["path"]).read_bytes() == (again / entry["path"]).read_bytes()


def test_wikipedia_and_books_sample_together(tmp_path):
    wiki, books_docs, out = tmp_path / "wiki", tmp_path / "books", tmp_path / "corpus"
    extract_wikipedia.main(["--input", str(SAMPLE / "wiki"), "--output", str(wiki)])
    extract_books.main(["--input", str(SAMPLE / "books"), "--output", str(books_docs)])
    manifest = build_corpus.main(["--input", f"{wiki},{books_docs}", "--output", str(out),
                                 "--num_shards", "2"])
    rows = [r for i in range(2)
            for r in pq.read_table(out / f"corpus-0000{i}-of-00002.parquet").to_pylist()]
    sources = sorted(r["source"] for r in rows)
    assert sources == ["books"] * 4 + ["wikipedia"] * 7
    assert manifest["counts"]["documents"] == 11 and manifest["counts"]["duplicates_removed"] == 0
    assert {r["doc_id"] for r in rows} >= {"books/austen-emma", "books/shakespeare-caesar"}
    assert all(r["sentences"] for r in rows)


def test_doc_id_conflict_is_a_dead_letter(tmp_path):
    a = write_documents(tmp_path / "a", [doc("books/same", ["One text."], "x/same.txt")])
    b = write_documents(tmp_path / "b", [doc("books/same", ["Another text."], "y/same.txt")])
    out = tmp_path / "corpus"
    manifest = build_corpus.main(["--input", f"{a},{b}", "--output", str(out)])
    assert manifest["counts"]["doc_id_conflicts"] == 1 and manifest["counts"]["documents"] == 1
    assert [r["source_file"] for r in read_corpus(out)] == ["x/same.txt"]
    (letter,) = (out / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text().splitlines()
    assert json.loads(letter) == {
        "file": "y/same.txt", "record": "books/same",
        "reason": "doc_id also used by x/same.txt for a different text (kept that one)"}


def test_unfinished_input_folder_is_refused(tmp_path):
    folder = tmp_path / "docs"
    parquet_io.write_shard(str(folder), "documents", 0, 1, [doc("books/a", ["A."])], DOCUMENT_SCHEMA)
    with pytest.raises(FileNotFoundError, match="has no manifest.json"):
        build_corpus.main(["--input", str(folder), "--output", str(tmp_path / "out")])


def test_corrupt_parquet_is_a_dead_letter_and_the_rest_kept(tmp_path):
    folder = write_documents(tmp_path / "docs", [doc("books/a", ["Good text."], "a.txt")])
    broken = folder / "documents-broken.parquet"
    broken.write_bytes(b"PAR1 this is not parquet")
    out = tmp_path / "corpus"
    manifest = build_corpus.main(["--input", str(folder), "--output", str(out)])
    assert (manifest["counts"]["bad_records"], manifest["counts"]["documents"]) == (1, 1)
    (letter,) = (out / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text().splitlines()
    letter = json.loads(letter)
    assert (letter["file"], letter["record"]) == (str(broken), "rows after 0")
    assert letter["reason"].startswith("unreadable Parquet: ")


def test_no_document_left_fails_the_run_without_a_manifest(tmp_path):
    """Every document set aside or removed: a failure, not an empty corpus. (The two texts are
    both empty after normalisation: one is a duplicate, the kept one has no sentence.)"""
    folder = write_documents(tmp_path / "docs", [doc("books/a", ["   "], "a.txt"),
                                                 doc("books/b", [], "b.txt")])
    out = tmp_path / "corpus"
    with pytest.raises(errors.NoOutputError, match=(
            r"^0 documents \(2 read\) from --input .*docs: 1 bad record\(s\) set aside in "
            r".*corpus/dead_letter/dead_letter-00000-of-00001.jsonl \(first: a.txt books/a: "
            r"document has no sentence\); no manifest written$")):
        build_corpus.main(["--input", str(folder), "--output", str(out)])
    assert not (out / "manifest.json").exists()
