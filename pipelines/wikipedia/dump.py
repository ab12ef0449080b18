"""Streaming reader for MediaWiki `pages-articles` XML dumps (.xml, .xml.bz2, multistream .bz2).

A dump is cut into `DumpSplit`s that workers read independently:
- a `.xml` file into byte ranges,
- a `.bz2` file into groups of whole bz2 streams (a multistream dump has one stream per 100
  pages; pbzip2/lbzip2 output is also many streams, with pages crossing stream boundaries).
A split owns the pages whose `<page>` tag starts inside its range, reads on past the range end
only to finish its last page, and skips the tail of a page begun in the range before, so every
page is read exactly once however the file is cut (the rule Hadoop uses for text splits).

Pages are found by scanning bytes for `<page>`/`</page>` (inside `<text>` wikitext is
XML-escaped, so the tags cannot occur there) and each page is parsed on its own with
ElementTree. Memory stays at one chunk plus one page (capped by `max_page_bytes`) whatever the
file size. A malformed page, a truncated file or a corrupt bz2 stream (reading resumes at the
next stream) costs only the pages affected: they come out as `BadRecord`s naming the file and
the record. A byte that is not UTF-8 costs only itself: it becomes U+FFFD, counted on its
`Page` (`invalid_bytes`).
"""
from __future__ import annotations

import bz2
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import BinaryIO

from common import storage
from common.errors import BadRecord

CHUNK_BYTES = 1 << 20
# A bz2 stream starts byte-aligned with "BZh" + block size digit + the block magic (pi in BCD).
# Inside compressed data blocks are bit-aligned, so a false match needs these 10 bytes by chance
# (about 2^-80 per position); a split starting at one would be reported as a bad stream.
_BZ2_STREAM_START = re.compile(rb"BZh[1-9]\x31\x41\x59\x26\x53\x59")
_PAGE_TAG = re.compile(rb"<page[\s>]|</page>")
_PAGE_ID = re.compile(rb"<id>\s*(\d+)\s*</id>")
_PAGE_TITLE = re.compile(rb"<title>([^<]{0,300})</title>")


@dataclass(frozen=True)
class DumpSplit:
    """A unit of work: the pages of `path` whose `<page>` starts in [start, end)."""
    path: str
    start: int  # byte offset in the file (bz2: the offset of the first stream)
    end: int  # exclusive; bz2: the offset of the first stream that belongs to the next split
    compressed: bool  # bz2 streams rather than raw XML bytes
    stream_offsets: tuple[int, ...] = ()  # bz2: where the streams after `start` begin


@dataclass(frozen=True)
class Page:
    """One `<page>` of the dump, XML-unescaped."""
    page_id: int
    title: str
    namespace: int
    redirect: bool  # the dump's <redirect title=...> flag
    text: str  # wikitext of the (last) revision
    source_bytes: int  # size of the page's XML, for throughput accounting
    invalid_bytes: int = 0  # bytes that were not UTF-8, each replaced by U+FFFD


class StreamError(Exception):
    """A bz2 stream that cannot be decompressed (corrupt or truncated)."""

    def __init__(self, offset: int, reason: str):
        super().__init__(f"bz2 stream at byte {offset}: {reason}")
        self.offset = offset
        self.reason = reason


# ---------------------------------------------------------------------------------------------
# Planning splits

def open_raw(path: str) -> BinaryIO:
    """The file's bytes as stored: Beam's filesystems would otherwise decompress `.bz2` paths."""
    if storage.is_remote(path):
        from apache_beam.io.filesystems import CompressionTypes, FileSystems
        return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)
    return open(path, "rb")


def is_bz2(path: str) -> bool:
    with open_raw(path) as f:
        return f.read(3) == b"BZh"


def bz2_stream_offsets(path: str, chunk_bytes: int = 8 * CHUNK_BYTES,
                       on_bytes: Callable[[int], object] = lambda n: None,
                       size: int | None = None) -> list[int]:
    """Byte offsets of the bz2 streams in `path` (a multistream index file is used if present).

    `on_bytes(n)` is told of every n bytes scanned (a progress bar's update); `size`: the
    file's size if the caller's listing gave it (else it is looked up).
    """
    index = _index_path(path)
    if index is not None:
        on_bytes(storage.file_size(path) if size is None else size)
        return _offsets_from_index(index)
    offsets: list[int] = []
    overlap = 9  # a stream header cut by a chunk boundary is found in the next chunk
    with open_raw(path) as f:
        base, tail = 0, b""
        while chunk := f.read(chunk_bytes):
            data = tail + chunk
            for match in _BZ2_STREAM_START.finditer(data):
                offset = base - len(tail) + match.start()
                if not offsets or offset > offsets[-1]:
                    offsets.append(offset)
            tail = data[-overlap:]
            base += len(chunk)
            on_bytes(len(chunk))
    return offsets or [0]


_PARTITION = re.compile(r"^(?P<stem>.*?)(?P<part>\d+)\.xml-(?P<pages>p\d+p\d+)\.bz2$")
"""A partitioned dump: enwiki-DATE-pages-articles-multistream1.xml-p1p41242.bz2."""
_INDEX_NAME = re.compile(r"-index(\.txt|\d+\.txt-p\d+p\d+)\.bz2$")
"""A multistream index: ...-multistream-index.txt.bz2, or a partition's
...-multistream-index1.txt-p1p41242.bz2 (one `offset:page_id:title` line per page)."""


def index_name_for(path: str) -> str | None:
    """The name Wikimedia gives the multistream index of dump `path`, or None (not a .bz2 dump):
    ...-multistream.xml.bz2 -> ...-multistream-index.txt.bz2 and
    ...-multistream1.xml-p1p41242.bz2 -> ...-multistream-index1.txt-p1p41242.bz2."""
    if match := _PARTITION.match(path):
        return f"{match['stem']}-index{match['part']}.txt-{match['pages']}.bz2"
    if path.endswith(".xml.bz2"):
        return path[: -len(".xml.bz2")] + "-index.txt.bz2"
    return None


def is_index_file(path: str) -> bool:
    """Whether `path` is named as a multistream index (how a dump is read, not a dump)."""
    return bool(_INDEX_NAME.search(path))


def _index_path(path: str) -> str | None:
    candidate = index_name_for(path)
    return candidate if candidate is not None and storage.exists(candidate) else None


def _offsets_from_index(index: str) -> list[int]:
    offsets = {0}  # the first stream holds <siteinfo> and is not listed
    with open_raw(index) as raw, bz2.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            offsets.add(int(line.split(":", 1)[0]))
    return sorted(offsets)


def plan_splits(path: str, split_bytes: int,
                on_bytes: Callable[[int], object] = lambda n: None,
                size: int | None = None) -> list[DumpSplit]:
    """Cut one dump file into splits of about `split_bytes` (bz2: whole streams, at least one).

    `split_bytes=0` makes each bz2 stream a split (and a plain .xml file one split). `size`: the
    file's size if the caller's listing gave it (else it is looked up).
    """
    size = storage.file_size(path) if size is None else size
    if size and is_bz2(path):
        offsets = bz2_stream_offsets(path, on_bytes=on_bytes, size=size)
        starts = [offsets[0]]
        for offset in offsets[1:]:
            if offset - starts[-1] >= split_bytes:
                starts.append(offset)
        ends = starts[1:] + [size]
        return [DumpSplit(path, s, e, True, tuple(o for o in offsets if s < o < e))
                for s, e in zip(starts, ends)]
    on_bytes(size)
    step = split_bytes if split_bytes > 0 else max(size, 1)  # 0: per bz2 stream; .xml whole
    starts = list(range(0, size, step)) or [0]
    return [DumpSplit(path, s, min(s + step, size), False) for s in starts]


# ---------------------------------------------------------------------------------------------
# Reading bytes: (data, owned) chunks, owned = inside the split's range

def _xml_chunks(f: BinaryIO, split: DumpSplit, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    f.seek(split.start)
    pos = split.start
    while chunk := f.read(chunk_bytes):
        owned_part = max(0, min(len(chunk), split.end - pos))
        if owned_part:
            yield chunk[:owned_part], True
        if owned_part < len(chunk):
            yield chunk[owned_part:], False
        pos += len(chunk)


def _bz2_chunks(f: BinaryIO, split: DumpSplit,
                chunk_bytes: int) -> Iterator[tuple[bytes | StreamError, bool]]:
    """Decompress consecutive streams from `split.start`; data of streams from `split.end` on is
    not owned (it is read only to finish a page). A stream that fails to decompress comes out
    as a `StreamError` item and reading resumes at the next known stream, so one corrupt stream
    costs its own pages, not the rest of the split."""
    position = split.start
    while position is not None:
        try:
            yield from _decompress_streams(f, position, split.end, chunk_bytes)
            return
        except StreamError as error:
            yield error, error.offset < split.end
            position = next((o for o in split.stream_offsets if o > error.offset), None)
            if position is not None and position >= split.end:
                return  # the next split reads on from there


def _decompress_streams(f: BinaryIO, start: int, end: int,
                        chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    f.seek(start)
    consumed = start  # file offset just after the compressed bytes fed so far
    stream_start = start
    decompressor = bz2.BZ2Decompressor()
    pending = b""
    while True:
        if not pending:
            pending = f.read(chunk_bytes)
            if not pending:
                break
            consumed += len(pending)
        try:
            out = decompressor.decompress(pending)
        except (OSError, EOFError) as error:
            raise StreamError(stream_start, f"corrupt compressed data ({error})") from error
        if out:
            yield out, stream_start < end
        if not decompressor.eof:
            pending = b""
            continue
        pending = decompressor.unused_data
        stream_start = consumed - len(pending)
        decompressor = bz2.BZ2Decompressor()
        if not pending:
            pending = f.read(chunk_bytes)
            consumed += len(pending)
            if not pending:
                return
    if decompressor.needs_input and stream_start < consumed:
        raise StreamError(stream_start, "truncated: the file ends before the bz2 end-of-stream "
                          "marker")


# ---------------------------------------------------------------------------------------------
# Finding and parsing pages

def iter_pages(split: DumpSplit, max_page_bytes: int = 16 << 20,
               chunk_bytes: int = CHUNK_BYTES) -> Iterator[Page | BadRecord]:
    """The pages a split owns, in file order, and a `BadRecord` for each page it cannot read."""
    if split.start == 0 and storage.file_size(split.path) == 0:
        yield BadRecord(split.path, "file", "empty file (0 bytes)")
        return
    with open_raw(split.path) as f:
        chunks = (_bz2_chunks if split.compressed else _xml_chunks)(f, split, chunk_bytes)
        yield from _scan_pages(chunks, split, max_page_bytes)


def _scan_pages(chunks: Iterator[tuple[bytes | StreamError, bool]], split: DumpSplit,
                max_page_bytes: int) -> Iterator[Page | BadRecord]:
    scanner = _PageScanner(split, max_page_bytes)
    for data, owned in chunks:
        if isinstance(data, StreamError):
            yield from scanner.stream_failed(data, owned)
        else:
            yield from scanner.feed(data, owned)
        if scanner.done:
            return
    yield from scanner.finish()


class _PageScanner:
    """Finds the `<page>...</page>` elements a split owns in its stream of byte chunks.

    Holds one page plus one chunk at most: bytes behind the scan are dropped as it goes, and a
    page growing past `max_page_bytes` is skipped (reported, not kept) to its `</page>`.
    """

    def __init__(self, split: DumpSplit, max_page_bytes: int):
        self.split, self.max_page_bytes = split, max_page_bytes
        self.buf = bytearray()
        self.base = 0  # offset of buf[0] in the split's (decompressed) bytes
        self.boundary: int | None = None  # offset where the split's own bytes end, once known
        self.page_start: int | None = None  # offset of the current page's "<page"
        self.oversized: BadRecord | None = None  # the record of a too-large page being skipped
        self.scan_from = 0  # buf index: no unseen tag starts before it
        self.pages_seen = 0
        self.done = False  # reached the first page of the next split

    def feed(self, data: bytes, owned: bool) -> Iterator[Page | BadRecord]:
        if not owned and self.boundary is None:
            self.boundary = self.base + len(self.buf)
        self.buf += data
        while not self.done and (match := _PAGE_TAG.search(self.buf, self.scan_from)):
            yield from self._on_tag(match)
        if not self.done:
            self._end_of_chunk()

    def stream_failed(self, error: StreamError, owned: bool) -> Iterator[BadRecord]:
        # The stream's pages and the page in progress are lost; reading goes on after it.
        yield _stream_bad_record(self.split, error, self._page_head(), owned)
        if self.oversized is not None:
            yield self.oversized
        self._discard(len(self.buf))
        self.page_start, self.oversized, self.scan_from = None, None, 0

    def finish(self) -> Iterator[BadRecord]:
        if self.page_start is not None:
            yield _bad_page(self._page_head(), self.split, self.page_start,
                            "truncated: the file ends inside the page")
        elif self.oversized is not None:
            yield self.oversized
        if (self.pages_seen == 0 and self.split.start == 0
                and self.split.end >= storage.file_size(self.split.path)):
            yield BadRecord(self.split.path, "file", "no <page> element: not a MediaWiki XML dump")

    def _on_tag(self, match: re.Match) -> Iterator[Page | BadRecord]:
        if self.oversized is not None:
            yield self.oversized  # its </page> or the next <page>: the skip is over
            self.oversized = None
        if match.group().startswith(b"</"):
            if self.page_start is not None:
                yield _finish_page(self._page_bytes(match.end()), self.split, self.page_start)
            self.page_start = None
        else:
            if self.page_start is not None:
                yield _bad_page(self._page_bytes(match.start()), self.split, self.page_start,
                                "malformed XML: <page> not closed before the next <page>")
            self.pages_seen += 1
            self.page_start = self.base + match.start()
            if self.boundary is not None and self.page_start >= self.boundary:
                self.page_start, self.done = None, True  # the next split's first page
                return
        self.scan_from = match.end()
        self._discard(self.scan_from if self.page_start is None else self.page_start - self.base)

    def _end_of_chunk(self) -> None:
        # A tag cut by the chunk end starts in its last 7 bytes.
        self.scan_from = max(self.scan_from, len(self.buf) - 8)
        if self.page_start is None:
            if (self.boundary is not None and self.base + self.scan_from >= self.boundary
                    and self.oversized is None):
                self.done = True  # past the split's range and not inside a page
            self._discard(self.scan_from)
        elif len(self.buf) - (self.page_start - self.base) > self.max_page_bytes:
            self.oversized = _bad_page(self._page_head(), self.split, self.page_start,
                                       f"page larger than --max_page_bytes={self.max_page_bytes}")
            self.page_start = None
            self._discard(self.scan_from)

    def _discard(self, upto: int) -> None:
        del self.buf[:upto]
        self.base += upto
        self.scan_from = max(0, self.scan_from - upto)

    def _page_bytes(self, end: int) -> bytes:
        return bytes(self.buf[self.page_start - self.base:end])

    def _page_head(self) -> bytes:
        """The start of the page in progress (enough for its id and title); b"" if none."""
        if self.page_start is None:
            return b""
        start = self.page_start - self.base
        return bytes(self.buf[start:start + 4096])


def _stream_bad_record(split: DumpSplit, error: StreamError, page_head: bytes,
                       owned: bool) -> BadRecord:
    record = f"bz2 stream at byte {error.offset}"
    if not page_head:
        return BadRecord(split.path, record, error.reason + "; the pages in it are lost")
    lost = _describe(page_head)
    if not owned:  # the next split reports the stream itself
        return BadRecord(split.path, lost.split(" '")[0], f"continues into the {record}, which "
                         f"cannot be read: {error.reason}")
    return BadRecord(split.path, record, f"{error.reason}; the page in progress ({lost}) and the "
                     "pages in the stream are lost")


def _describe(raw: bytes) -> str:
    page_id = _PAGE_ID.search(raw)
    title = _PAGE_TITLE.search(raw)
    parts = [f"page {int(page_id.group(1))}" if page_id else "page of unknown id"]
    if title:
        parts.append(repr(title.group(1).decode("utf-8", "replace")))
    return " ".join(parts)


def _bad_page(raw: bytes, split: DumpSplit, offset: int, reason: str) -> BadRecord:
    page_id = _PAGE_ID.search(raw)
    if page_id:
        record = f"page {int(page_id.group(1))}"
    elif split.compressed:
        record = f"page at decompressed byte {offset} of the bz2 streams from byte {split.start}"
    else:
        record = f"page at byte {split.start + offset}"
    title = _PAGE_TITLE.search(raw)
    if title:
        reason += f" (title {title.group(1).decode('utf-8', 'replace')!r})"
    return BadRecord(split.path, record, reason)


_ESCAPED_BYTE = re.compile("[\udc80-\udcff]")
"""A byte that was not UTF-8, as the "surrogateescape" decoding keeps it."""


def decode_page(raw: bytes) -> tuple[str, int]:
    """(the page's text, how many of its bytes were not UTF-8): each such byte becomes U+FFFD,
    so a few bad bytes cost a character each, not the page (BERT's tokenizer drops U+FFFD)."""
    try:
        return raw.decode("utf-8"), 0
    except UnicodeDecodeError:
        text, invalid = _ESCAPED_BYTE.subn("\ufffd", raw.decode("utf-8", "surrogateescape"))
        return text, invalid


def _finish_page(raw: bytes, split: DumpSplit, offset: int) -> Page | BadRecord:
    text, invalid = decode_page(raw)
    try:
        element = ET.fromstring(text)
    except ET.ParseError as error:
        return _bad_page(raw, split, offset, f"malformed XML: {error}")
    page = _page_from_element(element, raw, split, offset)
    return replace(page, invalid_bytes=invalid) if isinstance(page, Page) and invalid else page


# Exports before schema 0.5 have no <ns>: the title's prefix tells ("Kill Bill: Volume 1" is 0).
_NAMESPACE_PREFIXES = frozenset({
    "talk", "user", "wikipedia", "file", "image", "mediawiki", "template", "help", "category",
    "portal", "book", "draft", "timedtext", "module", "special", "media"})


def _guess_namespace(title: str) -> int:
    """0 for an article, else 1: some other namespace (the old schema does not say which)."""
    prefix = title.split(":", 1)[0].strip().lower() if ":" in title else ""
    return 1 if prefix in _NAMESPACE_PREFIXES or prefix.endswith(" talk") else 0


def _page_from_element(element: ET.Element, raw: bytes, split: DumpSplit,
                       offset: int) -> Page | BadRecord:
    page_id, title, namespace = (element.findtext(tag) for tag in ("id", "title", "ns"))
    revisions = element.findall("revision")
    if not (page_id and page_id.strip().isdigit()) or title is None or not revisions:
        return _bad_page(raw, split, offset, "malformed page: missing <id>, <title> or <revision>")
    try:
        ns = int(namespace) if namespace is not None else _guess_namespace(title)
    except ValueError:
        return _bad_page(raw, split, offset, f"malformed page: <ns> is {namespace!r}")
    return Page(page_id=int(page_id), title=title, namespace=ns,
                redirect=element.find("redirect") is not None,
                text=revisions[-1].findtext("text") or "", source_bytes=len(raw))
