"""Pure functions that turn one book text file (bytes) into a title and clean passages.

BooksCorpus is distributed as one plain-text book per file; Project Gutenberg texts add a licence
header and footer, chapter headings and hard-wrapped lines. `extract_book` undoes all of that:

    bytes --decode_book--> text --remove_controls--> --normalize_newlines--> --strip_gutenberg-->
    body --split_paragraphs--> paragraphs --select_passages--> passages (one per paragraph)

`select_passages` keeps what reads as the book's sentences and counts what it drops: headings,
transcriber's notes about the etext, a title page after a Gutenberg header (front matter), a
table of contents or cast list; a long verse paragraph with no stanza breaks is cut into
passages that end where a sentence ends. Old etexts (1990s) are as common as new ones: their
licence ("small print") may open the file or follow the text, and their footers vary ("*End of
The Project Gutenberg Etext of X", "****End of E-Text****").

Nothing here touches Beam or the filesystem; `pipelines/extract_books.py` wires it.
"""
from __future__ import annotations

import codecs
import math
import re
from dataclasses import dataclass, field

from common.settings import check

# Bytes that never occur in a text file: C0 controls except \t \n \v \f \r, and ESC/SUB are rare
# but legal in old DOS texts, so only the clearly binary ones count.
_CONTROL_BYTES = bytes([*range(0x09), *range(0x0E, 0x1A), *range(0x1C, 0x20)])
# Characters removed from the decoded text: every C0 control but tab and the line ends, and DEL.
# DOS texts end with SUB (0x1A, Ctrl-Z, end of file); old etexts hold a stray SO (0x0E) or a form
# feed (0x0C, a page break: it becomes a line end, so the lines around it stay apart).
_TEXT_CONTROLS = {c: None for c in (*range(0x09), 0x0B, *range(0x0E, 0x20), 0x7F)}
_TEXT_CONTROLS[0x0C] = "\n"

# Project Gutenberg markers, matched against one stripped line (case-insensitive).
# Header end: "*** START OF THE PROJECT GUTENBERG EBOOK X ***" (2000s+).
_START_MARKER = re.compile(r"^\*{2,}\s*START OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
# The end of the 1990s licence ("small print"), at the top of an etext or after its text:
# "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*", and the 2001-02 forms
# "**END THE SMALL PRINT! ...*END**", "*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*...".
_SMALL_PRINT_END = re.compile(r"^\*+\s*END\b[*\s]*THE SMALL PRINT", re.IGNORECASE)
# Where the text ends: "*** END OF THE PROJECT GUTENBERG EBOOK X ***", "End of Project
# Gutenberg's X", "End of the Project Gutenberg EBook of X", "*End of The Project Gutenberg Etext
# of X", "***End of Project Gutenberg 10th Edition of X***", and an etext's own "****End of
# E-Text****" before the transcriber's comments.
_FOOTER_LINE = re.compile(
    r"^\*{2,}\s*END OF (THE|THIS) PROJECT GUTENBERG"
    r"|^\**\s*End of (the |this )?Project Gutenberg"
    r"|^\**\s*End of (the |this )?E-?Text\W*$", re.IGNORECASE)
# A licence placed after the text ("***START**THE SMALL PRINT!**FOR PUBLIC DOMAIN EBOOKS**START***")
# starts the footer too; at the top of an etext the same line opens the header's licence.
_SMALL_PRINT_START = re.compile(r"^\*{2,}\s*START\*{0,2}\s*THE SMALL PRINT", re.IGNORECASE)
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
# Transcriber's notes: a paragraph that names the etext or Project Gutenberg is about the file,
# not part of the book ("This etext was prepared by ...", a repeated "The Project Gutenberg Etext
# of X" banner, "[Portions of this header are copyright ...]").
_FILE_NOTE = re.compile(r"\b(?:project gutenberg|e-?texts?|e-?books?"
                        r"|electronic (?:book|edition|text|version))\b", re.IGNORECASE)
# Production credits near the start ("Scanning and first proofing by X", "Produced by X, Y and
# the Online Distributed Proofreading Team."): only among the first CREDIT_PARAGRAPHS.
_CREDIT = re.compile(r"\b(?:produced|prepared|scanned|scanning|transcribed|proofed|proofing"
                     r"|proofread)\b.*\bby\b|\bdistributed proofread", re.IGNORECASE)
CREDIT_PARAGRAPHS = 10
MAX_CREDIT_LINES = 3
# Lists are not sentences: a table of contents or a play's cast list (the paragraphs after such a
# heading, up to the first that reads as text), and tab-aligned blocks. (Space-aligned columns
# are left alone: indented verse and quoted tables in prose have them too.)
_LIST_HEADING = re.compile(r"^(?:table of )?contents|^dramatis person\w*|^persons represented"
                           r"|^characters(?: in the play)?|^(?:list of )?illustrations",
                           re.IGNORECASE)
_LIST_HEADING_LINE = re.compile(_LIST_HEADING.pattern + r"\W*$", re.IGNORECASE)
_COLUMN_GAP = re.compile(r"\S\t+\S")
MAX_LIST_ENTRY_WORDS = 12
# Verse with no blank lines between stanzas: a paragraph of verse over MAX_VERSE_WORDS words
# is cut after the line that ends a sentence once a passage holds VERSE_PASSAGE_WORDS words (at
# the latest at MAX_VERSE_WORDS, at a line end). The longest speech in the shared plays has 461.
MAX_VERSE_WORDS = 500
VERSE_PASSAGE_WORDS = 100
# Front matter: the title page's lines ("by", "Series One", "Translated by CJ Hogarth") after a
# Project Gutenberg header, before the first paragraph that reads as text, among the first
# FRONT_MATTER_PARAGRAPHS.
FRONT_MATTER_PARAGRAPHS = 20
MIN_CENTRED_INDENT = 4  # a title page's lines are centred: most of a paragraph's lines indented
MIN_TEXT_WORDS = 6
_TEXT_END = re.compile(r"[.!?:;,][\"'\u2019\u201d)\]_]*$|\)$")
MIN_VERSE_CAPITALS = 0.8  # share of lines that start with a capital: hard-wrapped prose has ~0.2
_SENTENCE_END = re.compile(r"[.!?][\"'\u2019\u201d)\]]*$")
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
    lines: tuple[str, ...] = field(default=(), compare=False)  # stripped, before unwrapping
    indented_lines: int = field(default=0, compare=False)  # lines indented by 4+ (centred)


@dataclass(frozen=True)
class BookConfig:
    """Limits that decide when input is bad rather than text."""
    max_passage_chars: int = 50_000
    """A paragraph longer than this is cut at sentence ends (a longer sentence at clause or
    word ends) into passages under it (counted: `long_paragraphs_split`); one that holds a
    longer run without a space (not a book) is set aside as a dead letter. The longest
    paragraph in the shared books has under 15,000 characters; Paradise Lost has a verse
    paragraph of 50,128."""
    max_control_fraction: float = 0.01
    """A file with more than this share of binary control bytes (NUL etc.) is not text and is
    set aside whole."""

    def __post_init__(self):
        check(1 <= self.max_passage_chars <= MAX_UNWRAP_CHARS, "max_passage_chars",
              f"must be in [1, {MAX_UNWRAP_CHARS}], got {self.max_passage_chars}")
        check(0.0 <= self.max_control_fraction <= 1.0, "max_control_fraction",
              f"must be in [0, 1], got {self.max_control_fraction}")


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
    control_chars_removed: int = 0  # Ctrl-Z, SO, ... (a form feed counts, and becomes a line end)
    transcriber_notes_dropped: int = 0  # paragraphs about the etext, production credits
    list_blocks_dropped: int = 0  # table of contents, cast list, column-aligned paragraphs
    verse_paragraphs_split: int = 0  # long verse paragraphs cut into passages of sentences
    front_matter_dropped: int = 0  # title-page paragraphs before the first that reads as text
    long_paragraphs_split: int = 0  # paragraphs over max_passage_chars cut at sentence ends


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


def remove_controls(text: str) -> tuple[str, int]:
    """Text without C0 control characters (tab and line ends stay; a form feed becomes a line
    end), and how many there were. Old DOS etexts end with Ctrl-Z (0x1A)."""
    clean = text.translate(_TEXT_CONTROLS)
    if len(clean) == len(text) and clean == text:
        return text, 0
    return clean, sum(1 for c in text if ord(c) in _TEXT_CONTROLS)


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
    """Drop the Project Gutenberg licence header and footer, keeping the text between them.

    The header ends at the last "*** START OF ..." marker before the text's end, else (1990s
    etexts) at the small print's END line when that licence comes first, in the first half of
    the file (after the text, the same small print is part of the footer). The footer starts at
    the first "End of ..." line or small-print START after the header.
    """
    text_end = _first_match(_FOOTER_LINE, lines, 0)
    limit = len(lines) if text_end is None else text_end
    header_end = _last_match(_START_MARKER, lines, 0, limit)
    if header_end is None:
        header_end = _first_match(_SMALL_PRINT_END, lines, 0, min(limit, (len(lines) + 1) // 2))
    start = 0 if header_end is None else header_end + 1
    footer = _first_match(_FOOTER_LINE, lines, start)
    licence = _first_match(_SMALL_PRINT_START, lines, start, len(lines) if footer is None else footer)
    footer = footer if licence is None else licence
    title = None
    if header_end is not None:
        title = next((m.group("title").strip() for line in lines[:header_end]
                      if (m := _PG_TITLE.match(line.strip()))), None)
    end = len(lines) if footer is None else footer
    return GutenbergBody(lines[start:end], start + 1, header_end is not None, footer is not None, title)


def _first_match(pattern: re.Pattern, lines: list[str], start: int, end: int | None = None
                 ) -> int | None:
    end = len(lines) if end is None else end
    return next((i for i in range(start, end) if pattern.match(lines[i].strip())), None)


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
    if raw_chars > MAX_UNWRAP_CHARS:
        return Paragraph("", line, raw_chars, len(block))
    return Paragraph(" ".join(" ".join(block).split()), line, raw_chars, len(block),
                     tuple(b.strip() for b in block),
                     sum(len(b) - len(b.lstrip()) >= MIN_CENTRED_INDENT for b in block))


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


@dataclass(frozen=True)
class Selection:
    """What `select_passages` kept and why it dropped the rest (each count is a counter)."""
    passages: list[str]
    headings_dropped: int = 0
    bad: list[tuple[str, str]] = field(default_factory=list)  # (record, reason)
    transcriber_notes_dropped: int = 0
    list_blocks_dropped: int = 0
    verse_paragraphs_split: int = 0
    front_matter_dropped: int = 0
    long_paragraphs_split: int = 0


def select_passages(paragraphs: list[Paragraph], config: BookConfig,
                    after_header: bool = False) -> Selection:
    """Drop headings (and a chapter's short title line right after a "CHAPTER n" line),
    transcriber's notes and lists; cut long verse into passages of whole sentences, and a
    paragraph over `max_passage_chars` into passages under it at sentence ends (set aside when
    it holds a longer run without a space, or is too long to unwrap). `after_header`: the text
    follows a Project Gutenberg header, so it opens with the book's title page (front matter,
    dropped up to the first paragraph of text)."""
    passages: list[str] = []
    bad: list[tuple[str, str]] = []
    dropped = notes = lists = verse = front = long = 0
    after_chapter = in_list = False
    in_front = after_header
    for index, p in enumerate(paragraphs):
        if p.raw_chars > config.max_passage_chars and not p.text:  # too long to unwrap
            reason = (f"paragraph of {p.raw_chars} characters exceeds --max_passage_chars="
                      f"{config.max_passage_chars} (line breaks lost, or not a book)")
            bad.append((f"paragraph at line {p.line}", reason))
            after_chapter = in_list = False
            continue
        if is_file_note(p) or (index < CREDIT_PARAGRAPHS and is_credit(p)):
            notes += 1
            continue
        kind = heading_kind(p.text) if p.num_lines == 1 else None
        if kind is None and after_chapter and _is_chapter_title(p):
            kind = "chapter title"
        if kind is not None:
            dropped += 1
            after_chapter = kind == "chapter"
            # A capitals line inside a cast list ("DUCHESS OF VANHOLT") does not end it.
            in_list = bool(_LIST_HEADING_LINE.match(p.text)) or (
                in_list and kind == "capitals")
            continue
        after_chapter = False
        in_front = in_front and index < FRONT_MATTER_PARAGRAPHS and not reads_as_text(p)
        if in_front:
            front += 1
            continue
        in_list = (in_list or bool(_LIST_HEADING.match(p.text))) and is_list(p)
        if in_list or is_column_block(p):
            lists += 1
            continue
        pieces = split_verse(p)
        cut = [c for piece in pieces for c in split_long(piece, config.max_passage_chars)]
        longest = max(len(c) for c in cut)
        if longest > config.max_passage_chars:
            bad.append((f"paragraph at line {p.line}", (
                f"paragraph of {max(p.raw_chars, len(p.text))} characters exceeds "
                f"--max_passage_chars={config.max_passage_chars} and holds {longest} "
                "characters without a space (not a book)")))
            continue
        verse += len(pieces) > 1
        long += len(cut) > len(pieces)
        passages.extend(cut)
    return Selection(passages, dropped, bad, notes, lists, verse, front, long)


def split_long(text: str, max_chars: int) -> list[str]:
    """`text` cut at sentence ends into the fewest passages of about equal size, each at most
    `max_chars` (a longer sentence is cut at its last clause end, else word end, within it;
    a longer run without a space is a passage of its own); [text] when it is short enough.
    The passages hold the words of `text`, in order."""
    if len(text) <= max_chars:
        return [text]
    from pipelines.corpus.sentences import split_sentences

    target = len(text) / math.ceil(len(text) / max_chars)
    pieces: list[str] = []
    current: list[str] = []
    size = 0
    for sentence in (cut for whole in split_sentences(text)
                     for cut in _cut_sentence(whole, max_chars)):
        if current and size + 1 + len(sentence) > max_chars:
            pieces.append(" ".join(current))
            current, size = [], 0
        current.append(sentence)
        size += len(sentence) + (len(current) > 1)
        if size >= target:
            pieces.append(" ".join(current))
            current, size = [], 0
    if current:
        pieces.append(" ".join(current))
    return pieces


_CLAUSE_END = re.compile(r"[;:,]\s")


def _cut_sentence(sentence: str, max_chars: int) -> list[str]:
    """A sentence over `max_chars` (Whitman's catalogues run to 6,000 characters) -> pieces
    at most that long, cut after the last clause end (";", ":", ",") within the limit, else at
    its last space; a run with no space in it stays whole."""
    pieces = []
    while len(sentence) > max_chars:
        window = sentence[:max_chars + 1]
        clause = [m.end() for m in _CLAUSE_END.finditer(window)]
        cut = clause[-1] if clause else window.rfind(" ") + 1
        if cut <= 0:
            break
        pieces.append(sentence[:cut].rstrip())
        sentence = sentence[cut:].lstrip()
    return [*pieces, sentence] if sentence else pieces


def reads_as_text(p: Paragraph) -> bool:
    """Not a title-page line: MIN_TEXT_WORDS words or more, more lower-case than capital
    letters, ending as a sentence (or a clause, or a parenthesis) does, and not centred."""
    letters = [c for c in p.text if c.isalpha()]
    return len(p.text.split()) >= MIN_TEXT_WORDS and bool(_TEXT_END.search(p.text)) \
        and 2 * sum(c.islower() for c in letters) > len(letters) \
        and 2 * p.indented_lines <= p.num_lines


def is_file_note(p: Paragraph) -> bool:
    """A paragraph about the etext (names Project Gutenberg, an etext or an electronic edition)."""
    return bool(_FILE_NOTE.search(p.text))


def is_credit(p: Paragraph) -> bool:
    """A short production credit ("Scanning and first proofing by ...")."""
    return p.num_lines <= MAX_CREDIT_LINES and bool(_CREDIT.search(p.text))


def is_list(p: Paragraph) -> bool:
    """Every line reads as a list entry: short, and not a line that a sentence runs on from
    (verse and prose lines end in commas and semicolons, or are long); a single line that reads
    as a sentence is text."""
    lines = p.lines or (p.text,)
    if len(lines) == 1 and reads_as_text(p):
        return False
    return all(len(line.split()) <= MAX_LIST_ENTRY_WORDS and not line.endswith((",", ";"))
               for line in lines)


def is_column_block(p: Paragraph) -> bool:
    """At least three lines, half of them with two entries a tab apart."""
    return p.num_lines >= 3 and 2 * sum(bool(_COLUMN_GAP.search(line)) for line in p.lines) \
        >= p.num_lines


def is_verse(p: Paragraph) -> bool:
    """Most lines start with a capital letter (after quotes and brackets), as verse lines do."""
    if p.num_lines < 4 or not p.lines:
        return False
    capitals = sum(line.lstrip(_QUOTES + "[")[:1].isupper() for line in p.lines)
    return capitals >= MIN_VERSE_CAPITALS * p.num_lines


def split_verse(p: Paragraph) -> list[str]:
    """A verse paragraph over MAX_VERSE_WORDS words -> passages of whole sentences (each ends at
    a line that ends a sentence, once it holds VERSE_PASSAGE_WORDS words); else [p.text]."""
    if len(p.text.split()) <= MAX_VERSE_WORDS or not is_verse(p):
        return [p.text]
    pieces: list[str] = []
    current: list[str] = []
    words = 0
    for line in p.lines:
        current.append(line)
        words += len(line.split())
        if (words >= VERSE_PASSAGE_WORDS and _SENTENCE_END.search(line)) or words >= MAX_VERSE_WORDS:
            pieces.append(" ".join(" ".join(current).split()))
            current, words = [], 0
    if current:
        pieces.append(" ".join(" ".join(current).split()))
    return pieces


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
    text, controls = remove_controls(decoded.text)
    lines = normalize_newlines(text).split("\n")
    body = strip_gutenberg(lines)
    title, title_index = book_title(body.lines)
    body_lines = list(body.lines)
    if title_index >= 0:
        body_lines[title_index] = ""  # the title is metadata, not a passage
    paragraphs = split_paragraphs(body_lines, body.first_line)
    selection = select_passages(paragraphs, config, after_header=body.header_stripped)
    if not selection.passages and not selection.bad:
        raise BadBookError("file", "no text left after removing the Project Gutenberg header, "
                                   "footer and headings")
    return Book(title=title or body.title, passages=tuple(selection.passages),
                encoding=decoded.encoding, fell_back=decoded.fell_back,
                headings_dropped=selection.headings_dropped,
                header_stripped=body.header_stripped, footer_stripped=body.footer_stripped,
                bad_paragraphs=tuple(selection.bad), control_chars_removed=controls,
                transcriber_notes_dropped=selection.transcriber_notes_dropped,
                list_blocks_dropped=selection.list_blocks_dropped,
                verse_paragraphs_split=selection.verse_paragraphs_split,
                front_matter_dropped=selection.front_matter_dropped,
                long_paragraphs_split=selection.long_paragraphs_split)
