"""Pure functions that turn one book text file (bytes) into a title and clean passages.

BooksCorpus is distributed as one plain-text book per file; Project Gutenberg texts add a licence
header and footer, chapter headings and hard-wrapped lines. `extract_book` undoes all of that:

    bytes --decode_book--> text --normalize_newlines--> --strip_gutenberg--> body
          --split_paragraphs--> paragraphs --is_heading? drop--> passages (one per paragraph)

Nothing here touches Beam or the filesystem; `pipelines/extract_books.py` wires it.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass, field

# Bytes that never occur in a text file: C0 controls except \t \n \v \f \r, and ESC/SUB are rare
# but legal in old DOS texts, so only the clearly binary ones count.
_CONTROL_BYTES = bytes([*range(0x09), *range(0x0E, 0x1A), *range(0x1C, 0x20)])

# Project Gutenberg markers, matched against one stripped line (case-insensitive).
# Header end: "*** START OF THE PROJECT GUTENBERG EBOOK X ***" (2000s+) and the 1990s
# "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*" that closes a top licence.
_HEADER_END = re.compile(
    r"^\*{2,}\s*START OF (THE|THIS) PROJECT GUTENBERG"
    r"|^\*END\*\s*THE SMALL PRINT", re.IGNORECASE)
# Footer start: "*** END OF THE PROJECT GUTENBERG EBOOK X ***", "End of Project Gutenberg's X",
# "End of the Project Gutenberg EBook of X", "End of The Project Gutenberg Etext of X", and a
# licence placed after the text ("***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***").
_FOOTER_START = re.compile(
    r"^\*{2,}\s*END OF (THE|THIS) PROJECT GUTENBERG"
    r"|^End of (the |this )?Project Gutenberg"
    r"|^\*{2,}\s*START\*{0,2}\s*THE SMALL PRINT", re.IGNORECASE)
_PG_TITLE = re.compile(r"^Title:\s*(?P<title>\S.*)$")
_BRACKETED = re.compile(r"^\[(?P<inner>[^\[\]]+)\]$")

# Chapter headings. A heading is a short paragraph of one line; see `is_heading`.
# Roman numerals in capitals only: case-insensitive, "did", "mix" and "civil" would be numerals.
_NUMBER = (r"(?:the\s+)?(?:(?-i:[IVXLCDM]+)|\d+|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
           r"|thirteen|fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty"
           r"|first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|last"
           # Latin ordinals of the First Folio ("Actus Primus. Scoena Prima.")
           r"|prim[au]s?|secund[au]s?|terti[au]s?|quart[au]s?|quint[au]s?|sext[au]s?"
           r"|septim[au]s?)")
_NUMBERED_HEADING = re.compile(
    r"^(?P<word>chapter|chap|book|volume|vol|part|act|actus|scene|scena|scoena|scaena|canto|stave"
    r"|section|letter|epilogue|prologue)\.?\s+" + _NUMBER + r"\b[.:]?"
    # nothing more, or a title in capitals ("CHAPTER 1. Loomings."), not prose ("Part one of ...")
    r"(?:\s*|\s+[\"'(]*(?-i:[A-Z0-9]).*)$",
    re.IGNORECASE)
# A numeral alone ("XIV", "IV.", "12"); number words alone are too often dialogue.
_NUMBER_ALONE = re.compile(r"^(?:[IVXLCDM]+|\d+)[.:]?$")
# "I. A DISCUSSION SOMEWHAT IN THE AIR", "IV. The Dagger with Wings": a numbered title line.
_ROMAN_TITLE = re.compile(r"^[IVXLC]+\.\s+[A-Z][^.!?]*$")
_END_MARK = re.compile(r"^(?:finis\b.*|the end\.?)$", re.IGNORECASE)
_NAMED_SECTION = re.compile(r"^(?:epilogue|prologue|preface|introduction|contents|appendix"
                            r"|etymology|extracts|dedication)\.?$", re.IGNORECASE)
_QUOTES = "\"'`\u2018\u2019\u201c\u201d("
MAX_HEADING_CHARS = 100
MAX_HEADING_WORDS = 12
# A chapter's own title ("CHAPTER 1" then "Loomings.") is a short line right after the heading.
MAX_CHAPTER_TITLE_WORDS = 8
# Paragraphs longer than this are never unwrapped (see `_paragraph`): the cap on --max_passage_chars.
MAX_UNWRAP_CHARS = 10_000_000


class BadBookError(ValueError):
    """The whole file is unusable (empty, binary, no text): becomes one dead letter."""

    def __init__(self, record: str, reason: str):
        super().__init__(f"{record}: {reason}")
        self.record = record
        self.reason = reason


@dataclass(frozen=True)
class DecodedText:
    text: str
    encoding: str  # "utf-8", "utf-8-sig", "utf-16", "cp1252" or "latin-1"

    @property
    def fell_back(self) -> bool:
        """True when the bytes were not valid UTF-8 and a single-byte code page was used."""
        return self.encoding in ("cp1252", "latin-1")


@dataclass(frozen=True)
class Paragraph:
    text: str  # lines joined by one space, whitespace runs collapsed
    line: int  # 1-based line number of its first line in the normalised text
    raw_chars: int  # characters before unwrapping (what the passage-length guard checks)
    num_lines: int = 1  # lines before unwrapping: a heading is always a single line


@dataclass(frozen=True)
class BookConfig:
    """Limits that decide when input is bad rather than text."""
    max_passage_chars: int = 50_000
    """--max_passage_chars: a paragraph longer than this is set aside as a dead letter (lost line
    breaks or a non-text file); the longest paragraph in the shared books has under 15,000."""
    max_control_fraction: float = 0.01
    """--max_control_fraction: a file with more than this share of binary control bytes (NUL etc.)
    is not text and is set aside whole."""

    def __post_init__(self):
        if not 1 <= self.max_passage_chars <= MAX_UNWRAP_CHARS:
            raise ValueError(f"--max_passage_chars must be in [1, {MAX_UNWRAP_CHARS}], "
                             f"got {self.max_passage_chars}")
        if not 0.0 <= self.max_control_fraction <= 1.0:
            raise ValueError(f"--max_control_fraction must be in [0, 1], got {self.max_control_fraction}")


@dataclass(frozen=True)
class Book:
    title: str | None  # the first bracketed line ("[Emma by Jane Austen 1816]") or PG "Title:"
    passages: tuple[str, ...]
    encoding: str
    fell_back: bool
    headings_dropped: int
    header_stripped: bool
    footer_stripped: bool
    bad_paragraphs: tuple[tuple[str, str], ...] = field(default=())  # (record, reason)


def control_fraction(data: bytes) -> float:
    """Share of bytes that are binary control characters (NUL, BEL, ...), 0.0 for empty input."""
    if not data:
        return 0.0
    return (len(data) - len(data.translate(None, _CONTROL_BYTES))) / len(data)


def decode_book(data: bytes) -> DecodedText:
    """Decode with a BOM if present, else UTF-8, else CP1252, else Latin-1 (which never fails).

    Single-byte fallbacks are how pre-Unicode Gutenberg texts were written (e.g. 0xE6 for "æ").
    """
    if data.startswith(codecs.BOM_UTF8):
        return DecodedText(data[len(codecs.BOM_UTF8):].decode("utf-8", errors="replace"), "utf-8-sig")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return DecodedText(data.decode("utf-16", errors="replace"), "utf-16")
    try:
        return DecodedText(data.decode("utf-8"), "utf-8")
    except UnicodeDecodeError:
        pass
    try:
        return DecodedText(data.decode("cp1252"), "cp1252")
    except UnicodeDecodeError:  # 0x81, 0x8D, 0x8F, 0x90, 0x9D are undefined in CP1252
        return DecodedText(data.decode("latin-1"), "latin-1")


def normalize_newlines(text: str) -> str:
    """CRLF (DOS) and lone CR (classic Mac) line ends become LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


@dataclass(frozen=True)
class GutenbergBody:
    lines: list[str]
    first_line: int  # 1-based number of lines[0] in the whole text
    header_stripped: bool
    footer_stripped: bool
    title: str | None  # "Title: ..." from the header, if there was one


def strip_gutenberg(lines: list[str]) -> GutenbergBody:
    """Drop the Project Gutenberg licence header and footer, keeping the text between them."""
    footer = _first_match(_FOOTER_START, lines, 0)
    header_end = _last_match(_HEADER_END, lines, 0, len(lines) if footer is None else footer)
    start = 0 if header_end is None else header_end + 1
    if footer is not None and footer < start:
        footer = None
    title = None
    if header_end is not None:
        title = next((m.group("title").strip() for line in lines[:header_end]
                      if (m := _PG_TITLE.match(line.strip()))), None)
    end = len(lines) if footer is None else footer
    return GutenbergBody(lines[start:end], start + 1, header_end is not None, footer is not None, title)


def _first_match(pattern: re.Pattern, lines: list[str], start: int) -> int | None:
    return next((i for i in range(start, len(lines)) if pattern.match(lines[i].strip())), None)


def _last_match(pattern: re.Pattern, lines: list[str], start: int, end: int) -> int | None:
    return next((i for i in range(end - 1, start - 1, -1) if pattern.match(lines[i].strip())), None)


def split_paragraphs(lines: list[str], first_line: int = 1) -> list[Paragraph]:
    """Blank-line separated paragraphs, hard-wrapped lines unwrapped into one line each."""
    paragraphs: list[Paragraph] = []
    block: list[str] = []
    block_start = first_line
    for number, line in enumerate(lines, start=first_line):
        if line.strip():
            if not block:
                block_start = number
            block.append(line)
        elif block:
            paragraphs.append(_paragraph(block, block_start))
            block = []
    if block:
        paragraphs.append(_paragraph(block, block_start))
    return paragraphs


def _paragraph(block: list[str], line: int) -> Paragraph:
    raw_chars = sum(len(b) for b in block)
    # Collapsing a huge block would build a huge word list; the length guard rejects it anyway
    # (BookConfig caps --max_passage_chars at MAX_UNWRAP_CHARS, so "" never becomes a passage).
    text = " ".join(" ".join(block).split()) if raw_chars <= MAX_UNWRAP_CHARS else ""
    return Paragraph(text, line, raw_chars, len(block))


def heading_kind(text: str) -> str | None:
    """Which kind of heading a one-line paragraph is ("numbered", "roman", ...), or None."""
    if len(text) > MAX_HEADING_CHARS or len(text.split()) > MAX_HEADING_WORDS:
        return None
    if m := _NUMBERED_HEADING.match(text):
        return "chapter" if m.group("word").lower().startswith("chap") else "numbered"
    if _NUMBER_ALONE.match(text):
        return "numbered"
    if _ROMAN_TITLE.match(text):
        return "roman title"
    if _BRACKETED.match(text):
        return "bracketed"
    if _END_MARK.match(text) or _NAMED_SECTION.match(text):
        return "section"
    # All capitals: a section title ("THE TWO POETS OF SAFFRON PARK"); a quoted line in capitals
    # ('"DEAR SIR,') is the start of a letter inside the story, so it stays.
    if text[0] not in _QUOTES and any(c.isalpha() for c in text) \
            and not any(c.islower() for c in text):
        return "capitals"
    return None


def is_heading(text: str) -> bool:
    return heading_kind(text) is not None


def book_title(lines: list[str]) -> tuple[str | None, int]:
    """The first non-blank line when it is bracketed (NLTK/BooksCorpus style), and its index."""
    for i, line in enumerate(lines):
        if line.strip():
            m = _BRACKETED.match(line.strip())
            return (" ".join(m.group("inner").split()), i) if m else (None, -1)
    return None, -1


def select_passages(paragraphs: list[Paragraph], config: BookConfig
                    ) -> tuple[list[str], int, list[tuple[str, str]]]:
    """Drop headings (and a chapter's short title line right after a "CHAPTER n" line) and set
    aside over-long paragraphs. Returns (passages, headings dropped, bad paragraphs)."""
    passages: list[str] = []
    bad: list[tuple[str, str]] = []
    dropped = 0
    after_chapter = False
    for p in paragraphs:
        if p.raw_chars > config.max_passage_chars:
            reason = (f"paragraph of {p.raw_chars} characters exceeds --max_passage_chars="
                      f"{config.max_passage_chars} (line breaks lost, or not a book)")
            bad.append((f"paragraph at line {p.line}", reason))
            after_chapter = False
            continue
        kind = heading_kind(p.text) if p.num_lines == 1 else None
        if kind is None and after_chapter and _is_chapter_title(p):
            kind = "chapter title"
        if kind is not None:
            dropped += 1
            after_chapter = kind == "chapter"
            continue
        after_chapter = False
        passages.append(p.text)
    return passages, dropped, bad


def _is_chapter_title(p: Paragraph) -> bool:
    # A one-line first paragraph of a chapter ('"Yes," said he.') is dropped too: rare, and
    # telling it from "Loomings." would take a language model.
    return p.num_lines == 1 and len(p.text) <= 60 and len(p.text.split()) <= MAX_CHAPTER_TITLE_WORDS


def extract_book(data: bytes, config: BookConfig = BookConfig()) -> Book:
    """Bytes of one book file -> title and passages. Raises BadBookError for an unusable file."""
    if not data.strip():
        raise BadBookError("file", "empty file" if not data else "file holds only whitespace")
    decoded = decode_book(data)
    if decoded.encoding != "utf-16":
        share = control_fraction(data)
        if share > config.max_control_fraction:
            raise BadBookError("file", f"binary, not text: {share:.1%} of bytes are control "
                                       f"characters such as NUL (--max_control_fraction="
                                       f"{config.max_control_fraction})")
    lines = normalize_newlines(decoded.text).split("\n")
    body = strip_gutenberg(lines)
    title, title_index = book_title(body.lines)
    body_lines = list(body.lines)
    if title_index >= 0:
        body_lines[title_index] = ""  # the title is metadata, not a passage
    paragraphs = split_paragraphs(body_lines, body.first_line)
    passages, dropped, bad = select_passages(paragraphs, config)
    if not passages and not bad:
        raise BadBookError("file", "no text left after removing the Project Gutenberg header, "
                                   "footer and headings")
    return Book(title=title or body.title, passages=tuple(passages), encoding=decoded.encoding,
                fell_back=decoded.fell_back, headings_dropped=dropped,
                header_stripped=body.header_stripped, footer_stripped=body.footer_stripped,
                bad_paragraphs=tuple(bad))
