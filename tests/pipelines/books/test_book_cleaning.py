"""Books extraction's pure functions on hand cases and real books: decoding, Gutenberg headers and
footers, headings and paragraphs, bad input."""

from __future__ import annotations

import re
import tracemalloc

import pytest

from pipelines.books import cleaning as books
from tests.pipelines.books.book_names import BOOK_NAMES

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
    assert books.decode_book("Cæsar".encode()) == books.DecodedText("Cæsar", "utf-8")
    assert books.decode_book(b"\xef\xbb\xbfEmma") == books.DecodedText("Emma", "utf-8-sig")
    assert books.decode_book("Cæsar".encode("utf-16")) == books.DecodedText("Cæsar", "utf-16")
    cp1252 = books.decode_book(b"C\xe6sar \x93quoted\x94")
    assert cp1252 == books.DecodedText("Cæsar \u201cquoted\u201d", "cp1252") and cp1252.fell_back
    # 0x81 is undefined in CP1252: Latin-1 takes every byte.
    assert books.decode_book(b"a\x81b") == books.DecodedText("a\x81b", "latin-1")
    assert not books.decode_book(b"plain").fell_back


def test_newlines_crlf_and_cr():
    assert books.normalize_newlines("a\r\nb\rc\n") == "a\nb\nc\n"


def test_control_fraction_counts_binary_bytes_only():
    assert books.control_fraction(b"") == 0.0
    assert books.control_fraction(b"tab\there\r\nform\x0cfeed") == 0.0
    assert books.control_fraction(b"\x00\x00ab") == 0.5


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
    body = books.strip_gutenberg(MODERN.split("\n"))
    assert body.header_stripped and body.footer_stripped
    assert body.title == "Tiny Tales"
    assert [line for line in body.lines if line] == ["CHAPTER I", "It was a dark", "and stormy night."]
    assert body.first_line == 8


def test_strip_gutenberg_older_styles():
    old = books.strip_gutenberg(OLD.split("\n"))
    assert (old.header_stripped, old.footer_stripped) == (False, True)
    assert [line for line in old.lines if line] == ["It began", "in spring."]
    top = books.strip_gutenberg(OLD_TOP_LICENCE.split("\n"))
    assert (top.header_stripped, top.footer_stripped) == (True, True)
    assert [line for line in top.lines if line] == ["The text starts here."]


def test_extract_modern_gutenberg_book_exactly():
    book = books.extract_book(MODERN.replace("\n", "\r\n").encode())
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
    assert books.is_heading(line)


@pytest.mark.parametrize("line", [
    "Part of her meaning was to conceal some favourite thoughts of", '"DEAR SIR,',
    "He said no more.", "Chapter and verse were quoted at him until he gave in.",
    "Bookish people are odd.", "I. wonder", "Part one of the plan was simple.",
    "Book did not matter.", "The end of it.", "A" * 120])
def test_prose_lines_are_not_headings(line):
    assert not books.is_heading(line)


def test_paragraphs_unwrap_hard_wrapped_lines():
    lines = ["  First line", "second   line.", "", " ", "Next", "para.", "", ""]
    assert books.split_paragraphs(lines, first_line=10) == [
        books.Paragraph("First line second line.", 10, 26, 2),
        books.Paragraph("Next para.", 14, 9, 2)]


def test_chapter_title_after_chapter_heading_is_dropped():
    text = "[Tale by Me 1900]\n\nCHAPTER 1\n\nLoomings.\n\nCall me Ishmael.\nSome years ago.\n"
    book = books.extract_book(text.encode())
    assert book.title == "Tale by Me 1900"
    assert book.passages == ("Call me Ishmael. Some years ago.",)
    assert book.headings_dropped == 2


# ---------------------------------------------------------------- bad input (pure)

def test_empty_and_whitespace_files_are_bad():
    with pytest.raises(books.BadBookError, match="empty file"):
        books.extract_book(b"")
    with pytest.raises(books.BadBookError, match="only whitespace"):
        books.extract_book(b" \r\n\n\t")


def test_binary_garbage_is_bad():
    garbage = bytes(range(256)) * 64 + b"\x00" * 4096
    with pytest.raises(books.BadBookError, match=r"binary, not text: 2[0-9]\.\d% of bytes"):
        books.extract_book(garbage)


def test_only_headings_is_bad():
    with pytest.raises(books.BadBookError, match="no text left"):
        books.extract_book(b"CHAPTER I\n\nCHAPTER II\n")


def test_50mb_single_line_is_set_aside_with_flat_memory():
    huge = b"word " * (10 * 1024 * 1024)  # 50 MiB, no line break
    data = b"[Huge by Nobody]\n\nA real first paragraph.\n\n" + huge + b"\n\nThe end of it.\n"
    tracemalloc.start()
    book = books.extract_book(data)
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
    for bad in (0, books.MAX_UNWRAP_CHARS + 1):
        with pytest.raises(ValueError, match="--max_passage_chars must be in"):
            books.BookConfig(max_passage_chars=bad)
    huge = b"word " * (books.MAX_UNWRAP_CHARS // 5 + 1)  # 10,000,005 characters, one line
    book = books.extract_book(b"Before.\n\n" + huge + b"\n\nAfter.\n",
                              books.BookConfig(max_passage_chars=books.MAX_UNWRAP_CHARS))
    assert book.passages == ("Before.", "After.")
    assert book.bad_paragraphs == (("paragraph at line 3", (
        "paragraph of 10000005 characters exceeds --max_passage_chars=10000000 (line breaks "
        "lost, or not a book)")),)


# ---------------------------------------------------------------- real books (pure)

@pytest.fixture(scope="module")
def shared_books(shared_data):
    return {name: books.extract_book((shared_data / "books" / f"{name}.txt").read_bytes())
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


def test_paragraphs_over_max_passage_chars_are_cut_at_sentence_ends(shared_books, shared_data):
    """Whitman's four verse paragraphs and Emma's 14,659-character one over a 5,000-character
    limit: cut into passages under it that end sentences; not a word is lost."""
    limit = books.BookConfig(max_passage_chars=5000)
    for name, splits in (("whitman-leaves", 4), ("austen-emma", 1)):
        book = books.extract_book((shared_data / "books" / f"{name}.txt").read_bytes(), limit)
        whole = shared_books[name]
        assert (book.bad_paragraphs, book.long_paragraphs_split) == ((), splits)
        assert whole.long_paragraphs_split == 0
        assert max(len(p) for p in book.passages) <= 5000 < max(len(p) for p in whole.passages)
        assert " ".join(book.passages) == " ".join(whole.passages)
    emma = books.extract_book((shared_data / "books" / "austen-emma.txt").read_bytes(), limit)
    cut = [p for p in emma.passages if p not in shared_books["austen-emma"].passages]
    assert [len(p) for p in cut] == [4912, 4921, 4943]
    assert all(p.endswith((".", "!", "?", '"')) for p in cut)


def test_a_long_paragraph_without_a_space_to_cut_at_is_set_aside():
    run_on = "x" * 10_000
    book = books.extract_book(f"Before.\n\n{run_on}\n\nAfter.\n".encode(),
                              books.BookConfig(max_passage_chars=5000))
    assert book.passages == ("Before.", "After.") and book.long_paragraphs_split == 0
    assert book.bad_paragraphs == (("paragraph at line 3", (
        "paragraph of 10000 characters exceeds --max_passage_chars=5000 and holds 10000 "
        "characters without a space (not a book)")),)
    words = books.extract_book(f"Before.\n\n{'word ' * 2000}\n".encode(),
                               books.BookConfig(max_passage_chars=5000))
    assert [len(p) for p in words.passages] == [7, 4999, 4999]
    assert (words.bad_paragraphs, words.long_paragraphs_split) == ((), 1)


def test_a_verse_paragraph_over_the_default_limit_is_kept(shared_data):
    """Paradise Lost's longest verse paragraph has 50,128 characters: Whitman's lines without
    their stanza breaks, to 50,000 characters and more, stand in for it."""
    lines = [" ".join(line.split()) for line in (shared_data / "books" / "whitman-leaves.txt")
             .read_text().splitlines()[1:] if line.strip()]
    count = next(n for n in range(len(lines)) if len(" ".join(lines[:n])) > 50_000)
    book = books.extract_book(("\n".join(lines[:count]) + "\n").encode())
    assert (count, book.bad_paragraphs, book.long_paragraphs_split) == (1061, (), 1)
    assert " ".join(book.passages).split() == " ".join(lines[:count]).split()
    assert max(len(p) for p in book.passages) <= 50_000
