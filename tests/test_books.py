"""Books extraction: the pure functions on hand cases and real books, the Beam job, bad input."""
from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from common import errors, storage
from pipelines import extract_books
from pipelines.books import cleaning
from pipelines.corpus.documents import DOCUMENT_SCHEMA

BOOK_NAMES = ["austen-emma", "austen-persuasion", "austen-sense", "blake-poems",
              "chesterton-ball", "chesterton-brown", "chesterton-thursday",
              "melville-moby_dick", "shakespeare-caesar", "shakespeare-hamlet",
              "shakespeare-macbeth", "whitman-leaves"]
# Headings seen in the shared books: none may survive as a passage.
KNOWN_HEADINGS = ["VOLUME I", "CHAPTER I", "CHAPTER XVIII", "Chapter 1", "Chapter 24",
                  "CHAPTER 1", "CHAPTER 135", "Loomings.", "ETYMOLOGY.", "EXTRACTS.", "Epilogue",
                  "I. A DISCUSSION SOMEWHAT IN THE AIR", "I. The Absence of Mr Glass",
                  "THE TWO POETS OF SAFFRON PARK", "[BOOK I. INSCRIPTIONS]",
                  "Actus Primus. Scoena Prima.", "Actus Secundus.", "Scena Secunda.", "FINIS",
                  "THE END", "Finis", "SONGS OF INNOCENCE", "[Emma by Jane Austen 1816]"]
HEADING_SHAPE = re.compile(r"^(CHAPTER|Chapter|VOLUME|BOOK|Actus|Scena|Scoena)\b\S*\s+\S+\.?$")
# Word for word, as they appear (unwrapped) in the books.
KNOWN_PASSAGES = {
    "austen-emma": "Emma Woodhouse, handsome, clever, and rich, with a comfortable home and "
                   "happy disposition, seemed to unite some of the best blessings of existence; "
                   "and had lived nearly twenty-one years in the world with very little to "
                   "distress or vex her.",
    "austen-persuasion": "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, "
                         "for his own amusement, never took up any book but the Baronetage;",
    "melville-moby_dick": "Call me Ishmael. Some years ago--never mind how long precisely--having "
                          "little or no money in my purse, and nothing particular to interest me "
                          "on shore, I thought I would sail about a little and see the watery "
                          "part of the world.",
    "shakespeare-caesar": "Ant. Cæsar, my Lord",
    "chesterton-ball": "Bruneti\u00e8re",
    "chesterton-brown": "THE consulting-rooms of Dr Orion Hood, the eminent criminologist and "
                        "specialist in certain moral disorders, lay along the sea-front at "
                        "Scarborough,",
}


# ---------------------------------------------------------------- decoding and line ends

def test_decode_utf8_bom_utf16_and_single_byte_fallbacks():
    assert cleaning.decode_book("Cæsar".encode()) == cleaning.DecodedText("Cæsar", "utf-8")
    assert cleaning.decode_book(b"\xef\xbb\xbfEmma") == cleaning.DecodedText("Emma", "utf-8-sig")
    assert cleaning.decode_book("Cæsar".encode("utf-16")) == cleaning.DecodedText("Cæsar", "utf-16")
    cp1252 = cleaning.decode_book(b"C\xe6sar \x93quoted\x94")
    assert cp1252 == cleaning.DecodedText("Cæsar \u201cquoted\u201d", "cp1252") and cp1252.fell_back
    # 0x81 is undefined in CP1252: Latin-1 takes every byte.
    assert cleaning.decode_book(b"a\x81b") == cleaning.DecodedText("a\x81b", "latin-1")
    assert not cleaning.decode_book(b"plain").fell_back


def test_newlines_crlf_and_cr():
    assert cleaning.normalize_newlines("a\r\nb\rc\n") == "a\nb\nc\n"


def test_control_fraction_counts_binary_bytes_only():
    assert cleaning.control_fraction(b"") == 0.0
    assert cleaning.control_fraction(b"tab\there\r\nform\x0cfeed") == 0.0
    assert cleaning.control_fraction(b"\x00\x00ab") == 0.5


# ---------------------------------------------------------------- Gutenberg header and footer

MODERN = """The Project Gutenberg EBook of Tiny Tales, by A. Writer

Title: Tiny Tales

Author: A. Writer

*** START OF THE PROJECT GUTENBERG EBOOK TINY TALES ***

CHAPTER I

It was a dark
and stormy night.

*** END OF THE PROJECT GUTENBERG EBOOK TINY TALES ***

This file should be named tiny10.txt
"""

OLD = """It began
in spring.

End of the Project Gutenberg EBook of Old Tales, by B. Writer

*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*
"""

OLD_TOP_LICENCE = """**The Project Gutenberg Etext of Older Tales**
Small print...
*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*

The text starts here.
End of The Project Gutenberg Etext of Older Tales
"""


def test_strip_gutenberg_modern_markers_and_title():
    body = cleaning.strip_gutenberg(MODERN.split("\n"))
    assert body.header_stripped and body.footer_stripped
    assert body.title == "Tiny Tales"
    assert [line for line in body.lines if line] == ["CHAPTER I", "It was a dark", "and stormy night."]
    assert body.first_line == 8


def test_strip_gutenberg_older_styles():
    old = cleaning.strip_gutenberg(OLD.split("\n"))
    assert (old.header_stripped, old.footer_stripped) == (False, True)
    assert [line for line in old.lines if line] == ["It began", "in spring."]
    top = cleaning.strip_gutenberg(OLD_TOP_LICENCE.split("\n"))
    assert (top.header_stripped, top.footer_stripped) == (True, True)
    assert [line for line in top.lines if line] == ["The text starts here."]


def test_extract_modern_gutenberg_book_exactly():
    book = cleaning.extract_book(MODERN.replace("\n", "\r\n").encode())
    assert book.passages == ("It was a dark and stormy night.",)
    assert book.title == "Tiny Tales"
    assert book.headings_dropped == 1
    assert (book.encoding, book.fell_back) == ("utf-8", False)


# ---------------------------------------------------------------- headings and paragraphs

@pytest.mark.parametrize("line", [
    "CHAPTER I", "Chapter 1.", "CHAPTER XIV.", "BOOK ONE", "Book the First", "VOLUME II", "XIV",
    "IV.", "12", "PART THE LAST", "Actus Primus. Scoena Prima.", "Scena Secunda.",
    "I. The Absence of Mr Glass", "II. THE RELIGION OF THE STIPENDIARY MAGISTRATE",
    "THE TWO POETS OF SAFFRON PARK", "[BOOK I. INSCRIPTIONS]", "ETYMOLOGY.", "Epilogue",
    "FINIS. THE TRAGEDIE OF MACBETH.", "THE END"])
def test_heading_lines_are_headings(line):
    assert cleaning.is_heading(line)


@pytest.mark.parametrize("line", [
    "Part of her meaning was to conceal some favourite thoughts of", '"DEAR SIR,',
    "He said no more.", "Chapter and verse were quoted at him until he gave in.",
    "Bookish people are odd.", "I. wonder", "Part one of the plan was simple.",
    "Book did not matter.", "The end of it.", "A" * 120])
def test_prose_lines_are_not_headings(line):
    assert not cleaning.is_heading(line)


def test_paragraphs_unwrap_hard_wrapped_lines():
    lines = ["  First line", "second   line.", "", " ", "Next", "para.", "", ""]
    assert cleaning.split_paragraphs(lines, first_line=10) == [
        cleaning.Paragraph("First line second line.", 10, 26, 2),
        cleaning.Paragraph("Next para.", 14, 9, 2)]


def test_chapter_title_after_chapter_heading_is_dropped():
    text = "[Tale by Me 1900]\n\nCHAPTER 1\n\nLoomings.\n\nCall me Ishmael.\nSome years ago.\n"
    book = cleaning.extract_book(text.encode())
    assert book.title == "Tale by Me 1900"
    assert book.passages == ("Call me Ishmael. Some years ago.",)
    assert book.headings_dropped == 2


# ---------------------------------------------------------------- bad input (pure)

def test_empty_and_whitespace_files_are_bad():
    with pytest.raises(cleaning.BadBookError, match="empty file"):
        cleaning.extract_book(b"")
    with pytest.raises(cleaning.BadBookError, match="only whitespace"):
        cleaning.extract_book(b" \r\n\n\t")


def test_binary_garbage_is_bad():
    garbage = bytes(range(256)) * 64 + b"\x00" * 4096
    with pytest.raises(cleaning.BadBookError, match=r"binary, not text: 2[0-9]\.\d% of bytes"):
        cleaning.extract_book(garbage)


def test_only_headings_is_bad():
    with pytest.raises(cleaning.BadBookError, match="no text left"):
        cleaning.extract_book(b"CHAPTER I\n\nCHAPTER II\n")


def test_50mb_single_line_is_set_aside_with_flat_memory():
    huge = b"word " * (10 * 1024 * 1024)  # 50 MiB, no line break
    data = b"[Huge by Nobody]\n\nA real first paragraph.\n\n" + huge + b"\n\nThe end of it.\n"
    tracemalloc.start()
    book = cleaning.extract_book(data)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert book.passages == ("A real first paragraph.", "The end of it.")
    reason = (f"paragraph of {len(huge)} characters exceeds --max_passage_chars=50000 "
              "(line breaks lost, or not a book)")
    assert book.bad_paragraphs == (("paragraph at line 5", reason),)
    # The input itself is 50 MiB; decoding and line splitting hold a few copies, never a word list.
    assert peak < 4 * len(data), f"peak {peak / 2**20:.0f} MiB"


def test_max_passage_chars_is_capped_so_no_paragraph_becomes_an_empty_passage():
    # Above MAX_UNWRAP_CHARS a paragraph is not unwrapped (its text is ""): it must be set aside.
    for bad in (0, cleaning.MAX_UNWRAP_CHARS + 1):
        with pytest.raises(ValueError, match="--max_passage_chars must be in"):
            cleaning.BookConfig(max_passage_chars=bad)
    huge = b"word " * (cleaning.MAX_UNWRAP_CHARS // 5 + 1)  # 10,000,005 characters, one line
    book = cleaning.extract_book(b"Before.\n\n" + huge + b"\n\nAfter.\n",
                              cleaning.BookConfig(max_passage_chars=cleaning.MAX_UNWRAP_CHARS))
    assert book.passages == ("Before.", "After.")
    assert book.bad_paragraphs == (("paragraph at line 3", (
        "paragraph of 10000005 characters exceeds --max_passage_chars=10000000 (line breaks "
        "lost, or not a book)")),)


# ---------------------------------------------------------------- real books (pure)

@pytest.fixture(scope="module")
def shared_books(shared_data):
    return {name: cleaning.extract_book((shared_data / "books" / f"{name}.txt").read_bytes())
            for name in BOOK_NAMES}


def test_real_books_encodings_titles_and_counts(shared_books):
    fell_back = sorted(name for name, book in shared_books.items() if book.fell_back)
    # SOURCES.md names caesar only; chesterton-ball has Latin-1 "Bruneti\xe8re" too.
    assert fell_back == ["chesterton-ball", "shakespeare-caesar"]
    assert shared_books["austen-emma"].title == "Emma by Jane Austen 1816"
    assert shared_books["melville-moby_dick"].title == "Moby Dick by Herman Melville 1851"
    # whitman-leaves has one verse paragraph of 167 lines without stanza breaks, cut into
    # passages of sentences.
    assert {n: len(b.passages) for n, b in shared_books.items()} == {
        "austen-emma": 2310, "austen-persuasion": 1006, "austen-sense": 1808,
        "blake-poems": 229, "chesterton-ball": 1521, "chesterton-brown": 1146,
        "chesterton-thursday": 1256, "melville-moby_dick": 2515, "shakespeare-caesar": 737,
        "shakespeare-hamlet": 943, "shakespeare-macbeth": 649, "whitman-leaves": 2442}
    assert {n: b.verse_paragraphs_split for n, b in shared_books.items()
            if b.verse_paragraphs_split} == {"whitman-leaves": 1}
    assert all(not b.bad_paragraphs for b in shared_books.values())


def test_real_books_have_no_cr_headings_or_licence(shared_books):
    for name, book in shared_books.items():
        for passage in book.passages:
            assert "\r" not in passage and "\n" not in passage, name
            assert passage == passage.strip() and "  " not in passage, name
            assert passage not in KNOWN_HEADINGS, (name, passage)
            assert not HEADING_SHAPE.match(passage), (name, passage)
    ball = shared_books["chesterton-ball"]
    assert ball.footer_stripped
    assert not any("Project Gutenberg" in p or "SMALL PRINT" in p for p in ball.passages)
    assert ball.passages[-1].endswith("his sword and Turnbull's, fallen haphazard in the "
                                      "pattern of a cross.")


def test_real_books_known_text_word_for_word(shared_books):
    for name, text in KNOWN_PASSAGES.items():
        assert any(text in p for p in shared_books[name].passages), name
    assert shared_books["austen-emma"].passages[0] == KNOWN_PASSAGES["austen-emma"]
    assert shared_books["melville-moby_dick"].passages[0] == \
        "(Supplied by a Late Consumptive Usher to a Grammar School)"


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
        "list_blocks_dropped": 0, "verse_paragraphs_split": 1, "files_excluded": 1}
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
                   | beam.ParDo(extract_books.ExtractBookFn(cleaning.BookConfig()))
                   .with_outputs("dead_letter", main="documents"))
        assert_that(results.documents, equal_to([{
            "doc_id": "books/tale", "source": "books", "source_file": str(tmp_path / "tale.txt"),
            "title": "Tale by Me 1900", "passages": ["Once upon a time."]}]), label="docs")
        assert_that(results.dead_letter, equal_to([json.dumps(
            {"file": str(tmp_path / "blank.txt"), "record": "file", "reason": "empty file"})]),
            label="dead")


def test_rerun_into_the_same_folder_leaves_no_stale_shard(tmp_path):
    sample = Path(__file__).resolve().parents[1] / "data" / "sample" / "books"
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
