"""Pure readers, one per kind: an open input file -> its records, each a `Raw` (where it is in
the file, its fields) or a `Bad` (where, a reason code, the reason).

    jsonl        one JSON object per line; location "line N"
    csv, tsv     a header row, then one record per row; location "row N (line L)"
    parquet      rows, read row group by row group; location "row N"
    hf_datasets  the Arrow IPC stream files of a `datasets` save_to_disk folder; "row N"
    text         the whole file ("file"), each block between blank lines ("line N" of its
                 first line) or each non-empty line ("line N"), by the source's `split`

Rows and lines count from 1 (a CSV's header is line 1; its first record row 1). Reason codes:
`invalid_json`, `not_an_object`, `undecodable`, `missing_field`, `not_a_string`,
`empty_text`, `unreadable`, `malformed_row` (a CSV/TSV row whose quoting is broken: set aside,
and the lines after its first read again, so an unclosed quote takes no good row with it),
`binary` (a jsonl, csv, tsv or text file of binary bytes: one per file, location "file").
A new kind is one function here and one line in `READERS`.
"""
from __future__ import annotations

import collections
import csv
import io
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any

from pipelines.books.cleaning import BookConfig, control_fraction
from pipelines.documents.source import SourceConfig


@dataclass(frozen=True)
class Raw:
    """A record read: where it is in its file and its fields by name."""
    location: str
    fields: dict[str, Any]


@dataclass(frozen=True)
class Bad:
    """A record that cannot be read: where, a reason code (counted) and the reason."""
    location: str
    code: str
    reason: str


Record = Raw | Bad
Reader = Callable[[IO[bytes], str, SourceConfig], Iterator[Record]]
"""(open binary file, its name below the input folder, its source) -> records."""

TEXT_KEY = "text"
"""The field a text-kind record's text is under (the source's field map is for the others)."""
_BLANK_LINE = re.compile(r"\n[ \t\f\v\r]*\n")


SNIFF_BYTES = 1 << 16
"""How much of a line-based file decides whether it is binary (it is read as a stream)."""


def binary(data: bytes) -> Bad | None:
    """One `binary` Bad for a whole file whose (first) bytes are not text: more control bytes
    (NUL etc.) than extract_books and make_shards allow. Parsing it line by line would set
    aside hundreds of meaningless "records"."""
    share, limit = control_fraction(data), BookConfig.max_control_fraction
    if share <= limit:
        return None
    return Bad("file", "binary", f"binary, not text: {share:.1%} of bytes are control "
                                 f"characters such as NUL (over {limit:.0%})")


class _Sniffed(io.RawIOBase):
    """A binary stream whose first bytes were read to look at: them, then the rest."""

    def __init__(self, head: bytes, rest: IO[bytes]):
        self._head, self._rest = head, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._head:
            n = min(len(buffer), len(self._head))
            buffer[:n], self._head = self._head[:n], self._head[n:]
            return n
        data = self._rest.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def _sniff(stream: IO[bytes]) -> tuple[Bad | None, IO[bytes]]:
    """(a `binary` Bad or None, the whole stream still to read)."""
    head = stream.read(SNIFF_BYTES)
    return binary(head), io.BufferedReader(_Sniffed(head, stream))


def _decode(data: bytes, location: str) -> str | Bad:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return Bad(location, "undecodable",
                   f"undecodable bytes (not UTF-8) at byte {e.start}: {data[e.start:e.start + 4]!r}")


def read_jsonl(stream: IO[bytes], name: str, source: SourceConfig) -> Iterator[Record]:
    bad, stream = _sniff(stream)
    if bad:
        yield bad
        return
    for number, line in enumerate(stream, start=1):
        location = f"line {number}"
        if not line.strip():
            continue
        text = _decode(line, location)
        if isinstance(text, Bad):
            yield text
            continue
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as e:
            yield Bad(location, "invalid_json", f"invalid JSON: {e.msg} at column {e.colno}")
            continue
        if not isinstance(fields, dict):
            yield Bad(location, "not_an_object", f"a JSON {type(fields).__name__}, not an object")
            continue
        yield Raw(location, fields)


MAX_FIELD_CHARS = 2**31 - 1
"""The longest CSV/TSV field read (csv.field_size_limit's most, a C long on every platform)."""


class _Lines:
    """A text stream's lines for csv.reader, numbered from 1; the lines of the row being read
    are kept, so that those after a malformed row's first line can be read again."""

    def __init__(self, text: IO[str]):
        self._text, self._read = text, 0
        self._again: collections.deque[tuple[int, str]] = collections.deque()
        self.row: list[tuple[int, str]] = []

    def __iter__(self):
        return self

    def __next__(self) -> str:
        if self._again:
            number, line = self._again.popleft()
        else:
            line = self._text.readline()
            if not line:
                raise StopIteration
            self._read += 1
            number = self._read
        self.row.append((number, line))
        return line

    def read_again_after_first(self) -> None:
        self._again.extendleft(reversed(self.row[1:]))


def _read_delimited(stream: IO[bytes], delimiter: str) -> Iterator[Record]:
    bad, stream = _sniff(stream)
    if bad:
        yield bad
        return
    # surrogateescape keeps a bad byte as a lone surrogate: the row it is in is set aside,
    # the rows around it are read.
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline="")
    # csv's default field limit (128 KiB) would end the file at the first long document
    csv.field_size_limit(MAX_FIELD_CHARS)
    lines = _Lines(text)
    # strict: a quote that is not closed where a field ends is an error, not a field that
    # runs on into the next rows (csv's reader starts each row afresh after an error).
    rows = csv.reader(lines, delimiter=delimiter, strict=True)
    try:
        header = next(rows)
    except StopIteration:
        return
    number = 0
    while True:
        lines.row = []
        try:
            row = next(rows)
        except StopIteration:
            return
        except csv.Error as e:
            if not lines.row:
                raise
            number += 1
            lines.read_again_after_first()
            yield Bad(f"row {number} (line {lines.row[0][0]})", "malformed_row",
                      f"malformed row: {e} (a quote opened in it is not closed where a field "
                      "ends); the lines after its first are read again")
            continue
        number += 1
        location = f"row {number} (line {lines.row[-1][0]})"
        if any(_has_surrogate(cell) for cell in row):
            yield Bad(location, "undecodable", "undecodable bytes (not UTF-8)")
            continue
        if not any(cell.strip() for cell in row):
            continue
        yield Raw(location, dict(zip(header, row)))


def _has_surrogate(text: str) -> bool:
    return any("\udc80" <= c <= "\udcff" for c in text)


def read_csv(stream: IO[bytes], name: str, source: SourceConfig) -> Iterator[Record]:
    return _read_delimited(stream, ",")


def read_tsv(stream: IO[bytes], name: str, source: SourceConfig) -> Iterator[Record]:
    return _read_delimited(stream, "\t")


def _columns(source: SourceConfig, available: Iterable[str]) -> list[str]:
    wanted = [source.text_field, source.id_field, source.title_field]
    return [c for c in dict.fromkeys(wanted) if c and c in set(available)]


def _rows(batches: Iterable[Any]) -> Iterator[Record]:
    number = 0
    for batch in batches:
        for fields in batch.to_pylist():
            number += 1
            yield Raw(f"row {number}", fields)


def read_parquet(stream: IO[bytes], name: str, source: SourceConfig) -> Iterator[Record]:
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(stream)
    columns = _columns(source, parquet.schema_arrow.names)
    yield from _rows(parquet.read_row_group(g, columns=columns)
                     for g in range(parquet.num_row_groups))


def read_arrow_stream(stream: IO[bytes], name: str, source: SourceConfig) -> Iterator[Record]:
    import pyarrow as pa

    reader = pa.ipc.open_stream(stream)
    columns = _columns(source, reader.schema.names)
    yield from _rows(batch.select(columns) for batch in reader)


def read_text(stream: IO[bytes], name: str, source: SourceConfig) -> Iterator[Record]:
    if source.split == "line":
        yield from _read_lines(stream)
        return
    data = stream.read()
    bad = binary(data)
    if bad:
        yield bad
        return
    text = _decode(data, "file")
    if isinstance(text, Bad):
        yield text
        return
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    if source.split == "file":
        yield Raw("file", {TEXT_KEY: text})
        return
    start = 0
    for match in [*_BLANK_LINE.finditer(text), None]:
        end = match.start() if match else len(text)
        block = text[start:end]
        if block.strip():
            first = start + len(block) - len(block.lstrip("\n"))
            yield Raw(f"line {text.count(chr(10), 0, first) + 1}", {TEXT_KEY: block})
        start = match.end() if match else end


def _read_lines(stream: IO[bytes]) -> Iterator[Record]:
    """Each non-empty line of a text file, a record of its own ("line N"). Streamed: a corpus
    of one document a line is often one large file. As in jsonl, an undecodable line is set
    aside alone and a binary file is one `binary` Bad."""
    bad, stream = _sniff(stream)
    if bad:
        yield bad
        return
    # universal newlines, as the other splits read \r\n and \r; surrogateescape keeps a bad
    # byte as a lone surrogate, so only its line is set aside
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape")
    for number, line in enumerate(text, start=1):
        if not line.strip():
            continue
        location = f"line {number}"
        if _has_surrogate(line):
            yield Bad(location, "undecodable", "undecodable bytes (not UTF-8)")
            continue
        yield Raw(location, {TEXT_KEY: line})


READERS: dict[str, Reader] = {
    "jsonl": read_jsonl, "csv": read_csv, "tsv": read_tsv, "parquet": read_parquet,
    "hf_datasets": read_arrow_stream, "text": read_text,
}
EXTENSIONS: dict[str, tuple[str, ...]] = {
    "jsonl": (".jsonl", ".json", ".ndjson"), "csv": (".csv",), "tsv": (".tsv", ".tab"),
    "parquet": (".parquet",), "hf_datasets": (".arrow",), "text": (),
}
"""The files a kind takes from a folder (text: all but the other kinds' files)."""


def takes_file(kind: str, name: str) -> bool:
    """Whether a file found in a source's folder is one of its kind's files."""
    lower = name.lower()
    if EXTENSIONS[kind]:
        return lower.endswith(EXTENSIONS[kind])
    others = tuple(e for k, exts in EXTENSIONS.items() if k != kind for e in exts)
    return not lower.endswith(others)


# ---------------------------------------------------------------- record -> document

def passages(text: str) -> list[str]:
    """Paragraphs (blocks between blank lines), each with its whitespace collapsed."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    blocks = (" ".join(block.split()) for block in _BLANK_LINE.split(text))
    return [block for block in blocks if block]


def document(source: SourceConfig, path: str, name: str, raw: Raw) -> dict | Bad:
    """A DOCUMENT_SCHEMA row of `raw` (from the file `path`, `name` below its input folder),
    or why it cannot be one."""
    text_field = TEXT_KEY if source.kind == "text" else source.text_field
    text = _field(raw, text_field, required=True)
    if isinstance(text, Bad):
        return text
    found = passages(text)
    if not found:
        return Bad(raw.location, "empty_text", f"field {text_field!r} holds no text")
    if source.id_field:
        own = _field(raw, source.id_field, required=True, numbers=True)
        if isinstance(own, Bad):
            return own
    else:
        own = name if raw.location == "file" else \
            f"{name}:{raw.location.split(' (')[0].replace(' ', '')}"
    title = _field(raw, source.title_field, required=False) if source.title_field else ""
    if isinstance(title, Bad):
        return title
    return {"doc_id": f"{source.name}/{own}", "source": source.name, "source_file": path,
            "title": " ".join(title.split()), "passages": found}


def _field(raw: Raw, key: str, required: bool, numbers: bool = False) -> str | Bad:
    value = raw.fields.get(key)
    if value is None:
        if not required:
            return ""
        known = ", ".join(sorted(map(str, raw.fields))) or "none"
        what = f"field {key!r} is null" if key in raw.fields else f"no field {key!r}"
        return Bad(raw.location, "missing_field", f"{what} (fields: {known})")
    if numbers and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        return Bad(raw.location, "not_a_string",
                   f"field {key!r} is {type(value).__name__}, not a string: {str(value)[:40]!r}")
    if _has_surrogate(value):
        return Bad(raw.location, "undecodable", "undecodable bytes (not UTF-8)")
    return value
