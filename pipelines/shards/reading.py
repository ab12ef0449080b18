"""make_shards' input side, pure: corpus files -> read work units -> documents as token ids.

`read_parts` cuts the input files into work units of about `--read_part_kb`; a unit's documents
come from `parse_reference_text` (the reference text format) or `corpus_parquet` (the Parquet
corpus of build_corpus), `tokenize_documents` turns them into token ids per segment, and
`split_of` holds a share out for validation. `pipelines/make_shards.py` wires them into Beam.
"""
from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass

import numpy as np

from common import errors, storage
from common.tokenization import encode_like_reference
from pipelines.books.cleaning import BookConfig, control_fraction
from pipelines.documents.source import original_id

logger = logging.getLogger("make_shards")


@dataclass(frozen=True, eq=False)
class TokenizedDoc:
    """One document's token ids, flat, with its segment (sentence) lengths."""
    doc_id: str
    split: str
    file_index: int
    part: int
    """The `ReadPart` of the file that read it."""
    local_index: int
    """Position among the part's non-empty documents of its split: plus the part's offset in
    the split, the dense document index."""
    tokens: np.ndarray
    """(T,) uint16 while every id fits (BERT vocabularies), else int32: documents cross two
    shuffles, and bytes through the runner are what cost."""
    segment_lengths: np.ndarray
    """(S,) int32, all > 0, summing to T."""

    def segments(self) -> list[np.ndarray]:
        """(S,) int32 arrays, one per segment."""
        return np.split(self.tokens.astype(np.int32), np.cumsum(self.segment_lengths)[:-1])


def split_of(doc_id: str, validation_fraction: float) -> str:
    """`validation` for a stable pseudo-random share of documents, by their id alone. A
    weighted source's copies (`<doc_id>#r1`, build_corpus) go where their original goes: a
    copy in validation would be a text trained on."""
    if validation_fraction <= 0:
        return "train"
    doc_id = original_id(doc_id)
    h = int.from_bytes(hashlib.sha256(doc_id.encode()).digest()[:8], "big") / 2.0 ** 64
    return "validation" if h < validation_fraction else "train"


def tokenize_documents(tokenizer, documents: list[list[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, segment lengths) per document; segments are stripped sentences with tokens.

    One `encode_batch` call for all sentences of the batch: the per-call overhead of HF
    tokenizers dominates when sentences are encoded one at a time. `encode_like_reference`
    keeps literal "[MASK]" etc. in corpus text as plain text, as BERT's reference does.
    """
    flat = [s.strip() for doc in documents for s in doc]
    doc_of = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    keep = [i for i, s in enumerate(flat) if s]
    encodings = encode_like_reference(tokenizer, [flat[i] for i in keep])
    ids: list[list[list[int]]] = [[] for _ in documents]
    for i, enc_ids in zip(keep, encodings):
        if enc_ids:
            ids[doc_of[i]].append(enc_ids)
    out = []
    for segments in ids:
        lengths = np.array([len(s) for s in segments], np.int32)
        tokens = np.fromiter((t for s in segments for t in s), np.int32, int(lengths.sum()))
        out.append((tokens, lengths))
    return out


def parse_reference_text(data: bytes, file: str) -> tuple[list[list[str]], list[errors.BadRecord]]:
    """Documents (lists of lines) from the reference text format, and notes on bad lines.

    Lines split on "\\n" only and are stripped, as the reference reads them; a blank line ends a
    document. Bytes that are not UTF-8 are dropped as the reference does, and each such line is
    reported so nothing changes silently. A binary file raises ValueError (`check_text`).
    """
    check_text(data, file)
    docs: list[list[str]] = [[]]
    bad: list[errors.BadRecord] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.decode("utf-8", "ignore")
            bad.append(errors.BadRecord(file, f"line {number}",
                                      f"invalid UTF-8 ({e.reason}); the bytes were dropped"))
        line = line.strip()
        if line:
            docs[-1].append(line)
        elif docs[-1]:
            docs.append([])
    return [d for d in docs if d], bad


def check_text(data: bytes, file: str,
               max_control_fraction: float = BookConfig.max_control_fraction) -> None:
    """Raises ValueError naming `file` when its bytes are binary, not text (extract_books' test:
    `books.control_fraction` over its default limit), so a stray archive or model file is one
    dead letter, not thousands of garbage instances."""
    share = control_fraction(data)
    if share > max_control_fraction:
        raise ValueError(f"{file}: binary, not text: {share:.1%} of bytes are control characters "
                         f"such as NUL (over {max_control_fraction:.0%})")


def open_ends(data: bytes) -> tuple[bool, bool] | None:
    """(first line has text, last line has text) of a reference-format file; None if it has no
    lines. The reference reads all its input files as one stream of lines, so a document whose
    file ends without a blank line goes on in the next file (a trailing "\\n" ends a line, not
    the document, as `readline` sees it)."""
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    if not lines:
        return None
    return _has_text(lines[0]), _has_text(lines[-1])


def _has_text(line: bytes) -> bool:
    """Whether a line is not blank to the reference (stripped after dropping bad UTF-8)."""
    return bool(line.decode("utf-8", "ignore").strip())


def is_parquet(path: str) -> bool:
    return path.endswith(".parquet")


def corpus_parquet(f, path: str):
    """A `pyarrow.parquet.ParquetFile` with the corpus columns, or a ValueError naming the file."""
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(f)
    missing = {"doc_id", "sentences"} - set(parquet.schema_arrow.names)
    if missing:
        raise ValueError(f"{path}: no column(s) {sorted(missing)}; make_shards reads the corpus "
                         "that build_corpus writes (documents split into sentences)")
    return parquet


def select_inputs(files: list[str]) -> list[str]:
    """The Parquet files if there are any, else the text files.

    `build_corpus --text_output` writes a `.txt` twin next to each Parquet shard; reading both
    would make every document twice.
    """
    parquet = [f for f in files if is_parquet(f)]
    if parquet and len(parquet) < len(files):
        logger.warning("--input has Parquet and other files: reading the %d Parquet files, "
                       "ignoring %d others (e.g. %s)", len(parquet), len(files) - len(parquet),
                       next(f for f in files if not is_parquet(f)))
    return parquet or files


MAX_TEXT_PARTS = 16
"""Each part of a text file parses the whole file (a document's id is its number in the file),
so text files get at most this many parts; Parquet parts read only their row groups."""


@dataclass(frozen=True)
class ReadPart:
    """One work unit of ReadDocuments: a file, or one of `num_parts` shares of it."""
    file_index: int
    path: str
    part: int
    num_parts: int
    num_bytes: int
    """Estimated input bytes (the file's size over its parts)."""
    name: str
    """The file's path below its input folder: a text file's documents are `<name>:<i>`."""


def read_parts(files: list[storage.InputFile], part_bytes: int) -> list[ReadPart]:
    """Work units for `files`, about `part_bytes` of input each (by the size their listing
    gave: no lookup per file).

    The runner deals a stage's elements out to its workers whole, and tokenization is the
    heaviest stage: one element per file would leave a worker idle while another tokenizes
    the largest file.
    """
    out = []
    for file_index, file in enumerate(files):
        limit = 1 << 20 if is_parquet(file.path) else MAX_TEXT_PARTS
        n = min(limit, max(1, math.ceil(file.size_bytes / part_bytes)))
        out += [ReadPart(file_index, file.path, k, n, file.size_bytes // n, file.name)
                for k in range(n)]
    return out


def input_waves(parts: list[ReadPart], wave_bytes: int) -> list[list[ReadPart]]:
    """`parts` cut, in input order, into consecutive waves of about `wave_bytes` of input each
    (a wave holds at least one part; `wave_bytes` <= 0: one wave).

    make_shards runs each wave as a pipeline of its own on the local runner, which holds a
    pipeline's grouped data in memory: its peak then follows the wave, not the corpus. A wave
    is contiguous input, as one run of the reference generator reads a few input files.
    """
    if wave_bytes <= 0 or not parts:
        return [list(parts)] if parts else []
    out: list[list[ReadPart]] = [[]]
    size = 0
    for part in parts:
        if out[-1] and size + part.num_bytes > wave_bytes:
            out.append([])
            size = 0
        out[-1].append(part)
        size += part.num_bytes
    return out


def share_bounds(sizes: list[int], num_parts: int) -> list[int]:
    """num_parts + 1 item indices cutting `sizes` into contiguous shares of about equal sum."""
    cumulative = np.cumsum(sizes)
    total = int(cumulative[-1]) if len(sizes) else 0
    cuts = [int(np.searchsorted(cumulative, total * k / num_parts, side="right"))
            for k in range(1, num_parts)]
    return [0, *cuts, len(sizes)]
