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
file size, and a malformed page, invalid UTF-8 or a truncated stream costs only the pages
affected: they come out as `BadRecord`s naming the file and the record.
"""
from __future__ import annotations

import bz2
import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from pipelines import storage
from pipelines.jobs import BadRecord

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


@dataclass(frozen=True)
class Page:
    """One `<page>` of the dump, XML-unescaped."""
    page_id: int
    title: str
    namespace: int
    redirect: bool  # the dump's <redirect title=...> flag
    text: str  # wikitext of the (last) revision
    source_bytes: int  # size of the page's XML, for throughput accounting


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


def file_size(path: str) -> int:
    if storage.is_remote(path):
        from apache_beam.io.filesystems import FileSystems
        return FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    return os.path.getsize(path)


def bz2_stream_offsets(path: str, chunk_bytes: int = 8 * CHUNK_BYTES) -> list[int]:
    """Byte offsets of the bz2 streams in `path` (a multistream index file is used if present)."""
    index = _index_path(path)
    if index is not None:
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
    return offsets or [0]


def _index_path(path: str) -> str | None:
    # enwiki-DATE-pages-articles-multistream.xml.bz2 -> ...-multistream-index.txt.bz2
    if not path.endswith(".xml.bz2"):
        return None
    candidate = path[: -len(".xml.bz2")] + "-index.txt.bz2"
    return candidate if storage.exists(candidate) else None


def _offsets_from_index(index: str) -> list[int]:
    offsets = {0}  # the first stream holds <siteinfo> and is not listed
    with open_raw(index) as raw, bz2.open(raw, "rt", encoding="utf-8") as lines:
        for line in lines:
            offsets.add(int(line.split(":", 1)[0]))
    return sorted(offsets)


def plan_splits(path: str, split_bytes: int) -> list[DumpSplit]:
    """Cut one dump file into splits of about `split_bytes` (bz2: whole streams, at least one)."""
    size = file_size(path)
    if size and is_bz2(path):
        offsets = bz2_stream_offsets(path)
        starts = [offsets[0]]
        for offset in offsets[1:]:
            if offset - starts[-1] >= split_bytes:
                starts.append(offset)
        ends = starts[1:] + [size]
        return [DumpSplit(path, s, e, True) for s, e in zip(starts, ends)]
    step = max(1, split_bytes)
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


def _bz2_chunks(f: BinaryIO, split: DumpSplit, chunk_bytes: int) -> Iterator[tuple[bytes, bool]]:
    """Decompress consecutive streams from `split.start`; data of streams from `split.end` on is
    not owned (it is read only to finish a page)."""
    f.seek(split.start)
    consumed = split.start  # file offset just after the compressed bytes fed so far
    stream_start = split.start
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
        owned = stream_start < split.end
        if out:
            yield out, owned
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
    if split.start == 0 and file_size(split.path) == 0:
        yield BadRecord(split.path, "file", "empty file (0 bytes)")
        return
    with open_raw(split.path) as f:
        chunks = (_bz2_chunks if split.compressed else _xml_chunks)(f, split, chunk_bytes)
        yield from _scan_pages(chunks, split, max_page_bytes)


def _scan_pages(chunks: Iterator[tuple[bytes, bool]], split: DumpSplit,
                max_page_bytes: int) -> Iterator[Page | BadRecord]:
    buf = bytearray()
    base = 0  # decompressed offset of buf[0] (relative to the split's first byte)
    boundary: int | None = None  # decompressed offset where owned data ends
    page_start: int | None = None  # offset of the current page's "<page" (None: between pages)
    oversized: BadRecord | None = None  # set while skipping the rest of a too-large page
    scan_from = 0
    pages_seen = 0
    try:
        for data, owned in chunks:
            if not owned and boundary is None:
                boundary = base + len(buf)
            buf += data
            while (match := _PAGE_TAG.search(buf, scan_from)) is not None:
                tag_at = base + match.start()
                if match.group().startswith(b"</"):
                    if page_start is not None:
                        yield _finish_page(bytes(buf[page_start - base:match.end()]), split,
                                           page_start)
                    elif oversized is not None:
                        yield oversized
                    page_start, oversized = None, None
                else:
                    if page_start is not None:  # "<page>" again before "</page>"
                        yield _bad_page(bytes(buf[page_start - base:match.start()]), split,
                                        page_start, "malformed XML: <page> not closed before "
                                        "the next <page>")
                    elif oversized is not None:
                        yield oversized
                    oversized = None
                    page_start = tag_at if boundary is None or tag_at < boundary else None
                    pages_seen += 1
                    if page_start is None:
                        return  # the first page of the next split
                scan_from = match.end()
                # Drop what is behind us so memory stays one page + one chunk.
                keep_from = (page_start - base) if page_start is not None else scan_from
                del buf[:keep_from]
                base += keep_from
                scan_from -= keep_from
            # No unseen tag starts before `resume`: one cut by the chunk end starts after it.
            resume = max(scan_from, len(buf) - 8)
            keep_from = resume
            if page_start is not None:
                keep_from = page_start - base
                if len(buf) - keep_from > max_page_bytes:
                    head = bytes(buf[keep_from:keep_from + 4096])
                    oversized = _bad_page(head, split, page_start,
                                          f"page larger than --max_page_bytes={max_page_bytes}")
                    page_start, keep_from = None, resume
            elif boundary is not None and base + resume >= boundary and oversized is None:
                return  # past our range and not inside a page: done
            del buf[:keep_from]
            base += keep_from
            scan_from = resume - keep_from
    except StreamError as error:
        yield _stream_bad_record(split, error, buf, page_start, base)
        return
    if page_start is not None:
        yield _bad_page(bytes(buf[page_start - base:page_start - base + 4096]), split, page_start,
                        "truncated: the file ends inside the page")
    elif oversized is not None:
        yield oversized
    if pages_seen == 0 and split.start == 0 and split.end >= file_size(split.path):
        yield BadRecord(split.path, "file", "no <page> element: not a MediaWiki XML dump")


def _stream_bad_record(split: DumpSplit, error: StreamError, buf: bytearray,
                       page_start: int | None, base: int) -> BadRecord:
    lost = ""
    if page_start is not None:
        head = bytes(buf[page_start - base:page_start - base + 4096])
        lost = f"; the page in progress ({_describe(head)}) and all after it are lost"
    return BadRecord(split.path, f"bz2 stream at byte {error.offset}", error.reason + lost)


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


def _finish_page(raw: bytes, split: DumpSplit, offset: int) -> Page | BadRecord:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        return _bad_page(raw, split, offset, f"invalid UTF-8 at byte {error.start} of the page "
                         f"({raw[error.start:error.start + 4]!r})")
    try:
        element = ET.fromstring(text)
    except ET.ParseError as error:
        return _bad_page(raw, split, offset, f"malformed XML: {error}")
    return _page_from_element(element, raw, split, offset)


def _page_from_element(element: ET.Element, raw: bytes, split: DumpSplit,
                       offset: int) -> Page | BadRecord:
    page_id, title, namespace = (element.findtext(tag) for tag in ("id", "title", "ns"))
    revisions = element.findall("revision")
    if not (page_id and page_id.strip().isdigit()) or title is None or not revisions:
        return _bad_page(raw, split, offset, "malformed page: missing <id>, <title> or <revision>")
    try:
        ns = int(namespace) if namespace is not None else (1 if ":" in title else 0)
    except ValueError:
        return _bad_page(raw, split, offset, f"malformed page: <ns> is {namespace!r}")
    return Page(page_id=int(page_id), title=title, namespace=ns,
                redirect=element.find("redirect") is not None,
                text=revisions[-1].findtext("text") or "", source_bytes=len(raw))
