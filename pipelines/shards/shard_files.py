"""Shards: how many, which rows go where, writing them, and reading them back to verify.

Rows reach this module already in their shuffled global order (rank 0, 1, 2, ...). Rank `r`
goes to shard `r % num_shards` at position `r // num_shards`: round robin after the shuffle
gives every shard the same number of rows to within one, so data-parallel ranks and loader
workers get equal work, and a shard's rows are as random as the global order.

A shard is an uncompressed tar of `.rows.npz` block members (`common/shard_format.py`),
written through `storage.atomic_open` with fixed tar headers (mtime 0, fixed owner, mode
0444) so the same rows always give the same bytes and the same sha256.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import re
import tarfile
import zipfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from common import shard_format, storage
from common.manifest import ShardRecord

SPLITS = ("train", "validation")
DEAD_LETTERS = "dead_letter/make_shards"
"""make_shards' dead letters below its output, without `.jsonl` (Beam's WriteToText prefix)."""
HISTOGRAM_BINS = 16
_MEMBER_NAME = re.compile(r"^\d{6}-\d{6}\." + re.escape(shard_format.MEMBER_SUFFIX) + "$")


def shard_name(split: str, index: int, fmt: str = "shards") -> str:
    return f"{split}-{index:06d}.{'tar' if fmt == 'shards' else 'jsonl'}"


def estimated_bytes(num_rows: int, num_instances: int, num_tokens: int, num_masked: int,
                    vocab_size: int) -> int:
    """Bytes the rows take in the shard format (arrays only; headers are small per block)."""
    id_bytes = shard_format.id_dtype(vocab_size).itemsize
    return num_tokens * (id_bytes + 2) + num_masked * (2 + id_bytes) + num_rows * 5 + num_instances


def choose_num_shards(num_rows: int, estimated: int, target_shard_bytes: int,
                      num_shards: int = 0) -> int:
    """Shards for a split: `num_shards` if given, else enough to keep each near the target size.

    Never more shards than rows, and at least one when there are rows.
    """
    if num_rows == 0:
        return 0
    wanted = num_shards or math.ceil(estimated / max(1, target_shard_bytes))
    return max(1, min(num_rows, wanted))


def assign_round_robin(ranks: np.ndarray, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """(shard index, position within the shard) for rows at global `ranks`."""
    ranks = np.asarray(ranks, np.int64)
    return ranks % num_shards, ranks // num_shards


@dataclass
class ShardStats:
    """What a shard holds; totals over shards are their sums."""
    num_rows: int = 0
    num_instances: int = 0
    num_tokens: int = 0
    num_masked: int = 0
    num_random_next: int = 0
    num_nsp: int = 0
    """Instances with a next-sentence label (all of them unless MLM-only)."""
    length_histogram: list[int] = field(default_factory=lambda: [0] * HISTOGRAM_BINS)
    """Instance lengths in HISTOGRAM_BINS equal bins over [0, max_seq_length]."""

    def add(self, other: ShardStats) -> ShardStats:
        for name in ("num_rows", "num_instances", "num_tokens", "num_masked",
                     "num_random_next", "num_nsp"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.length_histogram = [a + b for a, b in zip(self.length_histogram,
                                                       other.length_histogram)]
        return self


def row_stats(rows: Sequence[shard_format.Row], max_seq_length: int) -> ShardStats:
    """Statistics of rows, recounted from the arrays themselves."""
    stats = ShardStats(num_rows=len(rows))
    lengths = []
    for row in rows:
        labels = np.asarray(row.next_sentence_labels)
        stats.num_instances += len(labels)
        stats.num_tokens += len(row.input_ids)
        stats.num_masked += len(row.masked_lm_positions)
        stats.num_random_next += int((labels == 1).sum())
        stats.num_nsp += int((labels >= 0).sum())
        lengths.append(np.bincount(np.asarray(row.sequence_ids), minlength=len(labels)))
    if lengths:
        lengths = np.concatenate(lengths)
        bins = np.minimum(lengths * HISTOGRAM_BINS // (max_seq_length + 1), HISTOGRAM_BINS - 1)
        stats.length_histogram = np.bincount(bins, minlength=HISTOGRAM_BINS).tolist()
    return stats


@dataclass
class ShardInfo:
    """One written shard: its place, size, checksum and statistics."""
    file: str
    split: str
    index: int
    bytes: int
    sha256: str
    stats: ShardStats

    def record(self) -> ShardRecord:
        """Its entry in the manifest's shard list."""
        s = self.stats
        return ShardRecord(self.file, self.sha256, self.bytes, self.split, self.index,
                           s.num_rows, s.num_instances, s.num_tokens, s.num_masked)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ShardInfo:
        d = json.loads(text)
        return cls(**{**d, "stats": ShardStats(**d["stats"])})


class _HashingWriter:
    """A write-only stream that hashes and counts what passes through it."""

    def __init__(self, raw):
        self.raw, self.digest, self.size = raw, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.raw.write(data)
        self.digest.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


def member_key(shard_index: int, block_index: int) -> str:
    return f"{shard_index:06d}-{block_index:06d}"


def write_shard(folder: str, split: str, index: int, rows: Sequence[shard_format.Row],
                rows_per_block: int, vocab_size: int, max_seq_length: int) -> ShardInfo:
    """Write one `.tar` shard of rows atomically; same rows give the same bytes."""
    blocks = (shard_format.encode_block(list(rows[start:start + rows_per_block]), vocab_size)
              for start in range(0, len(rows), rows_per_block))
    return write_tar(folder, split, index, blocks, row_stats(rows, max_seq_length))


def write_tar(folder: str, split: str, index: int, blocks: Iterable[bytes],
              stats: ShardStats) -> ShardInfo:
    """Write encoded blocks as one `.tar` shard, atomically and reproducibly.

    The tar is what webdataset's `TarWriter` makes (USTAR, one member per block, named
    `<key>.rows.npz`), written with `tarfile` directly: importing webdataset pulls in torch,
    seconds per Beam worker for nothing.
    """
    name = shard_name(split, index)
    with storage.atomic_open(storage.join(folder, name), "wb") as f:
        stream = _HashingWriter(f)
        with tarfile.open(fileobj=stream, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
            for block, data in enumerate(blocks):
                tar.addfile(_member_info(member_key(index, block), len(data)), io.BytesIO(data))
    return ShardInfo(name, split, index, stream.size, stream.digest.hexdigest(), stats)


def tar_bytes(member_sizes: Iterable[int]) -> int:
    """The size of `write_tar`'s file for members of these sizes: a 512-byte header and the
    data padded to 512 bytes each, two zero blocks, all padded to tarfile's 10240-byte
    records."""
    block, record = tarfile.BLOCKSIZE, tarfile.RECORDSIZE
    size = sum(block + -(-n // block) * block for n in member_sizes) + 2 * block
    return -(-size // record) * record


def _member_info(key: str, size: int) -> tarfile.TarInfo:
    # Fixed header fields make the tar a function of the rows alone (reproducible bytes).
    info = tarfile.TarInfo(f"{key}.{shard_format.MEMBER_SUFFIX}")
    info.size, info.mtime, info.mode = size, 0, 0o444
    info.uid = info.gid = 0
    info.uname = info.gname = "bert"
    return info


def write_jsonl_shard(folder: str, split: str, index: int, rows: Sequence[shard_format.Row],
                      vocab: Sequence[str], max_seq_length: int,
                      stats: ShardStats | None = None) -> ShardInfo:
    """The same rows as JSON lines, one instance per line (rows must be unpacked)."""
    name = shard_name(split, index, "jsonl")
    with storage.atomic_open(storage.join(folder, name), "wb") as f:
        stream = _HashingWriter(f)
        for row in rows:
            stream.write((json.dumps(instance_json(row, vocab), ensure_ascii=False) + "\n").encode())
    return ShardInfo(name, split, index, stream.size, stream.digest.hexdigest(),
                     stats if stats is not None else row_stats(rows, max_seq_length))


def instance_json(row: shard_format.Row, vocab: Sequence[str]) -> dict:
    """An unpacked row as the reference generator's fields, tokens as strings, no padding."""
    if len(row.next_sentence_labels) != 1:
        raise ValueError("--format jsonl writes one instance per line; packed rows are not allowed")
    ids = np.asarray(row.input_ids).tolist()
    return {
        "tokens": [vocab[i] for i in ids],
        "segment_ids": np.asarray(row.segment_ids).tolist(),
        "masked_lm_positions": np.asarray(row.masked_lm_positions).tolist(),
        "masked_lm_labels": [vocab[i] for i in np.asarray(row.masked_lm_ids).tolist()],
        "next_sentence_label": int(row.next_sentence_labels[0]),
    }


class ShardError(Exception):
    """A shard that cannot be read back: names the file and what is wrong."""


def read_shard(path: str) -> Iterator[tuple[str, list[shard_format.Row]]]:
    """(member name, rows) for each block of a `.tar` shard, checking every member.

    Member names are checked against the documented layout (never used as paths).
    """
    try:
        with storage.open_read(path, "rb") as raw, tarfile.open(fileobj=raw, mode="r|") as tar:
            for member in tar:
                if not member.isfile() or not _MEMBER_NAME.match(member.name):
                    raise ShardError(f"{path}: unexpected member {member.name!r}")
                data = tar.extractfile(member).read()
                if len(data) != member.size:
                    raise ShardError(f"{path}: member {member.name} is truncated")
                yield member.name, shard_format.decode_block(data)
    except ShardError:
        raise
    except (tarfile.TarError, zipfile.BadZipFile, OSError, ValueError, KeyError, EOFError) as e:
        raise ShardError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e


def read_jsonl_shard(path: str) -> Iterator[dict]:
    with storage.open_read(path, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                yield json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ShardError(f"{path}: line {number} is not JSON ({e})") from e


def verify_shard(folder: str, record: ShardRecord, max_seq_length: int) -> list[str]:
    """Problems with one shard against its manifest record (empty list = good)."""
    path = storage.join(folder, record.path)
    if not storage.exists(path):
        return [f"{record.path}: missing"]
    problems = []
    size = storage.file_size(path)
    if size != record.num_bytes:
        problems.append(f"{record.path}: {size} bytes, manifest says {record.num_bytes} "
                        "(truncated or overwritten)")
    if storage.sha256_file(path) != record.sha256:
        problems.append(f"{record.path}: sha256 mismatch (corrupt)")
    try:
        stats = shard_stats(path, max_seq_length)
    except ShardError as e:
        return problems + [f"{record.path}: not decodable: {e}"]
    for name in ("num_rows", "num_instances", "num_tokens", "num_masked"):
        want = getattr(record, name)
        if want is not None and getattr(stats, name) != want:
            problems.append(f"{record.path}: {name} {getattr(stats, name)} != manifest {want}")
    return problems


def shard_stats(path: str, max_seq_length: int) -> ShardStats:
    """Statistics recounted by reading a shard (`.tar` or `.jsonl`) completely."""
    if path.endswith(".jsonl"):
        stats = ShardStats()
        for obj in read_jsonl_shard(path):
            label = obj["next_sentence_label"]
            n = len(obj["tokens"])
            stats.add(ShardStats(1, 1, n, len(obj["masked_lm_positions"]), int(label == 1),
                                 int(label >= 0),
                                 np.bincount([min(n * HISTOGRAM_BINS // (max_seq_length + 1),
                                                  HISTOGRAM_BINS - 1)],
                                             minlength=HISTOGRAM_BINS).tolist()))
        return stats
    stats = ShardStats()
    for _, rows in read_shard(path):
        stats.add(row_stats(rows, max_seq_length))
    return stats


def read_rows(path: str) -> list[shard_format.Row]:
    return [row for _, rows in read_shard(path) for row in rows]


def padded_share(stats: ShardStats, max_seq_length: int) -> float:
    """Share of padding when every row is padded to `max_seq_length`."""
    if stats.num_rows == 0:
        return 0.0
    return 1.0 - stats.num_tokens / (stats.num_rows * max_seq_length)
