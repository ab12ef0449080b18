"""make_shards' columnar batches and the pure functions over them: plans -> instances -> shards.

Every shuffle of the job moves a few columnar batches per key, never one object per instance,
pickled in the workers (`to_bytes`): documents' plans to the random-next join (`PlanBatch`),
instances to their pack bucket (`WireBatch`, with their `LengthBatch` counted ahead), and a
bucket's rows to their shard (`ShardPart`). `bucket_rows` lays a bucket out as rows and
`assign_to_shards` deals them out by global rank (both: `pack_and_assign`); `write_group` writes
a shard. `pipelines/make_shards.py` wires them into Beam; the options they read are
`pipelines/shards/config.py`'s.
"""
from __future__ import annotations

import dataclasses
import math
import pickle
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from common.errors import DiskFullError
from pipelines.shards import packing, shard_files
from pipelines.shards.config import ShardsConfig
from pipelines.shards.instances import InstanceConfig, InstancePlan


def to_bytes(value) -> bytes:
    """A shuffled value, pickled here in the worker.

    The FnApiRunner decodes every value of a GroupByKey into its one process and encodes it
    again to deal the groups out; opaque bytes cost it one copy instead of an unpickle and a
    pickle of every array. The workers pickle either way (Beam's fallback coder is pickle).
    """
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def from_bytes(data: bytes):
    """The value `to_bytes` made (pickle, as Beam's own coder between our own workers)."""
    return pickle.loads(data)  # only bytes that to_bytes wrote in this pipeline


@dataclass(frozen=True, eq=False)
class PlanBatch:
    """Plans in columnar form for the random-next join (InstancePlan fields, flattened).

    An actual-next plan travels as its segment ranges only: it is keyed to its own document's
    join group, where that document is too. A random-next plan carries its A tokens (its own
    document is elsewhere), in the narrowest dtype that holds them. Every plan crosses a
    shuffle, and bytes through the runner are what cost.
    """
    doc_index: np.ndarray
    pass_index: np.ndarray
    instance_index: np.ndarray
    random_doc_index: np.ndarray
    """(N,) int64; -1 = B is the actual next."""
    target_b_length: np.ndarray
    label: np.ndarray
    segments: np.ndarray
    """(N, 3) int32 segment indices [start, end of A, end of B) of actual-next plans."""
    a_lengths: np.ndarray
    """(N,) int64 A tokens carried in `tokens_a` (0 for actual-next plans)."""
    tokens_a: np.ndarray

    @classmethod
    def from_plans(cls, plans: list[InstancePlan]) -> PlanBatch:
        def col(name, dtype):
            return np.array([getattr(p, name) for p in plans], dtype)
        carried = [p.tokens_a if p.random_doc_index is not None else p.tokens_a[:0]
                   for p in plans]
        return cls(col("doc_index", np.int64), col("pass_index", np.int32),
                   col("instance_index", np.int32),
                   np.array([-1 if p.random_doc_index is None else p.random_doc_index
                             for p in plans], np.int64),
                   col("target_b_length", np.int64), col("next_sentence_label", np.int8),
                   np.array([(p.a_segments[0], p.a_segments[1], p.b_segments[1])
                             if p.b_segments is not None else (-1, -1, -1) for p in plans],
                            np.int32).reshape(len(plans), 3),
                   np.array([len(t) for t in carried], np.int64),
                   narrow_ids(np.concatenate(carried)))

    def plans(self, segments_of) -> Iterator[InstancePlan]:
        """The plans; `segments_of(doc_index)` gives an actual-next plan's document segments."""
        a_parts = np.split(self.tokens_a.astype(np.int32), np.cumsum(self.a_lengths)[:-1])
        # Python ints from whole columns at once: int() on numpy scalars per plan costs more.
        columns = zip(self.doc_index.tolist(), self.pass_index.tolist(),
                      self.instance_index.tolist(), a_parts, self.segments.tolist(),
                      self.random_doc_index.tolist(), self.target_b_length.tolist(),
                      self.label.tolist())
        for doc, pass_index, instance, tokens_a, (start, a_end, stop), r, target, label in columns:
            if r >= 0:
                yield InstancePlan(doc, pass_index, instance, tokens_a, None, r, target, label)
                continue
            segments = segments_of(doc)
            yield InstancePlan(doc, pass_index, instance, _joined(segments[start:a_end]),
                               _joined(segments[a_end:stop]), None, target, label)


def _joined(segments: list[np.ndarray]) -> np.ndarray:
    """(L,) int32: the segments one after the other (as `plan_document` joins them)."""
    return np.concatenate(segments).astype(np.int32, copy=False)


def narrow_ids(ids: np.ndarray) -> np.ndarray:
    """uint16 when every id fits (BERT vocabularies), else int32."""
    fits = not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < 1 << 16)
    return ids.astype(np.uint16 if fits else np.int32, copy=False)


MIN_BUCKETS = 16
"""Fewest pack and (automatic) join groups: the FnApiRunner deals a stage's groups out to its
workers whole, so a handful of large groups would leave a worker idle."""
INSTANCES_PER_JOIN_BUCKET = 8_192
"""Automatic join groups: about this many instances' plans each."""


def _estimated_instances(num_tokens: int, config: InstanceConfig) -> float:
    return num_tokens * config.dupe_factor / max(1, config.max_num_tokens // 2)


def join_bucket_count(num_tokens: int, config: ShardsConfig) -> int:
    """Groups of the random-next join (--join_buckets, or from the split's token count).

    Grouping does not change any instance, so the output does not depend on it.
    """
    if config.join_buckets:
        return config.join_buckets
    return max(MIN_BUCKETS, math.ceil(_estimated_instances(num_tokens, config)
                                      / INSTANCES_PER_JOIN_BUCKET))


def pack_bucket_count(num_tokens: int, config: ShardsConfig) -> int:
    """Groups of instances packed and sorted together, from the split's token count.

    Depends on the corpus alone (not on workers), so the output does not either.
    """
    return max(MIN_BUCKETS, math.ceil(_estimated_instances(num_tokens, config)
                                      / config.instances_per_pack_bucket))


def key_bucket(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Bucket b holds keys in [b, b + 1) * 2**64 / num_buckets: bucket order is key order."""
    return ((keys >> np.uint64(32)) * np.uint64(num_buckets)) >> np.uint64(32)


@dataclass(frozen=True, eq=False)
class LengthBatch:
    """What a pack bucket's row count depends on: the instances' shuffle order and lengths.

    A few bytes per instance, so the shard counts of every bucket are known before the
    instances themselves are grouped; packing and shard assignment then run in one stage.
    """
    keys: np.ndarray
    """(N,) uint64 shuffle keys."""
    doc_index: np.ndarray
    """(N,) int64 (tie-break, as `InstanceBatch.shuffled`)."""
    pass_index: np.ndarray
    """(N,) int32."""
    instance_index: np.ndarray
    """(N,) int32."""
    lengths: np.ndarray
    """(N,) int32 tokens per instance."""
    num_masked: int
    """Masked positions of all N instances."""

    @classmethod
    def of(cls, batch: packing.InstanceBatch) -> LengthBatch:
        return cls(batch.keys, batch.doc_index, batch.pass_index, batch.instance_index,
                   batch.lengths, int(batch.num_masked.sum()))


@dataclass(frozen=True, eq=False)
class WireBatch:
    """An `InstanceBatch` as it crosses a shuffle: per-token segment ids travel as one
    segment-0 length per instance when they follow the [CLS] A [SEP] (0) B [SEP] (1) layout,
    as every instance here does. A third fewer bytes through the runner, which copies every
    byte of every shuffle several times."""
    batch: packing.InstanceBatch
    """The instances; `segment_ids` empty while `segment0_lengths` holds them."""
    segment0_lengths: np.ndarray | None
    """(N,) int32 tokens with segment id 0 per instance, or None (ids kept per token)."""

    @classmethod
    def of(cls, batch: packing.InstanceBatch) -> WireBatch:
        lengths = batch.lengths.astype(np.int64)
        if not len(batch) or lengths.min() < 1:
            return cls(batch, None)
        starts = np.cumsum(lengths) - lengths
        zeros = np.add.reduceat((batch.segment_ids == 0).astype(np.int32), starts)
        if not np.array_equal(_segment_ids(lengths, zeros), batch.segment_ids):
            return cls(batch, None)
        return cls(dataclasses.replace(batch, segment_ids=np.zeros(0, np.uint8)), zeros)

    def unpack(self) -> packing.InstanceBatch:
        if self.segment0_lengths is None:
            return self.batch
        return dataclasses.replace(self.batch, segment_ids=_segment_ids(
            self.batch.lengths.astype(np.int64), self.segment0_lengths))


def _segment_ids(lengths: np.ndarray, segment0_lengths: np.ndarray) -> np.ndarray:
    """(T,) uint8: 0 for the first `segment0_lengths[i]` tokens of instance i, then 1."""
    starts = np.cumsum(lengths) - lengths
    position = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
    return (position >= np.repeat(segment0_lengths, lengths)).astype(np.uint8)


@dataclass(frozen=True, eq=False)
class ShardPart:
    """Rows of one pack bucket bound for one shard, as they cross the shard shuffle."""
    wire: WireBatch
    """The rows' instances, laid out row after row."""
    row_sizes: np.ndarray
    """(R,) instances per row."""
    positions: np.ndarray
    """(R,) position of each row within its shard."""


def bucket_totals(parts: Iterable[LengthBatch], config: InstanceConfig, pack: bool
                 ) -> tuple[int, int, int, int]:
    """(rows, instances, tokens, masked) of one pack bucket, as `bucket_rows` will lay it out."""
    parts = list(parts)

    def cat(name):
        return np.concatenate([getattr(p, name) for p in parts])
    lengths = cat("lengths")
    masked = sum(p.num_masked for p in parts)
    if not pack:
        return len(lengths), len(lengths), int(lengths.sum()), masked
    order = np.lexsort((cat("instance_index"), cat("pass_index"), cat("doc_index"), cat("keys")))
    rows = len(packing.pack_lengths(lengths[order], config.max_seq_length))
    return rows, len(lengths), int(lengths.sum()), masked


def bucket_instances(split: str, instances: list, plans: list[InstancePlan], buckets: int,
                     config: InstanceConfig) -> Iterator[tuple[tuple[str, int], packing.InstanceBatch]]:
    """Columnar batches of instances, one per shuffle-key range (pack bucket)."""
    doc = [p.doc_index for p in plans]
    pas = [p.pass_index for p in plans]
    ins = [p.instance_index for p in plans]
    batch = packing.InstanceBatch.from_instances(
        instances, packing.shuffle_keys(config.random_seed, doc, pas, ins), doc, pas, ins)
    bucket = key_bucket(batch.keys, buckets)
    for b in np.unique(bucket).tolist():
        yield (split, b), batch.take(np.flatnonzero(bucket == b))


@dataclass(frozen=True, eq=False)
class RowGroup:
    """Rows of one pack bucket (or part of a shard): instances laid out row after row."""
    batch: packing.InstanceBatch
    row_sizes: np.ndarray
    """(R,) instances per row."""
    positions: np.ndarray | None = None
    """(R,) position of each row within its shard (after shard assignment)."""

    def stats(self) -> tuple[int, int, int, int]:
        """(rows, instances, tokens, masked): all that shard counts and global ranks need."""
        return (len(self.row_sizes), len(self.batch), int(self.batch.lengths.sum()),
                int(self.batch.num_masked.sum()))

    def shard_stats(self, max_seq_length: int) -> shard_files.ShardStats:
        """The same numbers as `shard_files.row_stats` on the rows, from the columns at once."""
        b = self.batch
        labels = b.next_sentence_labels
        bins = np.minimum(b.lengths.astype(np.int64) * shard_files.HISTOGRAM_BINS
                          // (max_seq_length + 1), shard_files.HISTOGRAM_BINS - 1)
        return shard_files.ShardStats(
            num_rows=len(self.row_sizes), num_instances=len(b), num_tokens=int(b.lengths.sum()),
            num_masked=int(b.num_masked.sum()), num_random_next=int((labels == 1).sum()),
            num_nsp=int((labels >= 0).sum()),
            length_histogram=np.bincount(bins, minlength=shard_files.HISTOGRAM_BINS).tolist())

    def take_rows(self, rows: np.ndarray) -> RowGroup:
        first = np.concatenate([[0], np.cumsum(self.row_sizes)])[:-1]
        order = packing.index_ranges(first[rows], self.row_sizes[rows])
        pos = None if self.positions is None else self.positions[rows]
        return RowGroup(self.batch.take(order), self.row_sizes[rows], pos)


def pack_and_assign(key: tuple[str, int], parts: Iterable[WireBatch],
                    bucket_stats: dict, config: ShardsConfig,
                    vocab_size: int) -> Iterator[tuple[tuple[str, int], ShardPart]]:
    """A pack bucket's instances -> its rows -> (split, shard) parts (`assign_to_shards`)."""
    split, bucket = key
    group = bucket_rows(packing.InstanceBatch.concat([from_bytes(p).unpack() for p in parts]),
                        config, config.pack)
    if group.stats() != tuple(bucket_stats[key]):
        # The global ranks come from `bucket_totals` on the LengthBatches: a mismatch would
        # misplace rows silently, so it stops the job.
        raise RuntimeError(f"pack bucket {key}: rows {group.stats()} differ from the "
                           f"counted {tuple(bucket_stats[key])}")
    for shard_key, part in assign_to_shards(split, bucket, group, bucket_stats, config,
                                            vocab_size):
        yield shard_key, to_bytes(ShardPart(WireBatch.of(part.batch), part.row_sizes,
                                            part.positions))


def bucket_rows(batch: packing.InstanceBatch, config: InstanceConfig, pack: bool) -> RowGroup:
    """Shuffle a bucket by key, then lay instances out as rows (packed or one per row)."""
    batch = batch.shuffled()
    if not pack:
        return RowGroup(batch, np.ones(len(batch), np.int64))
    order, sizes = packing.rows_order(packing.pack_lengths(batch.lengths, config.max_seq_length))
    return RowGroup(batch.take(order), sizes)


def assign_to_shards(split: str, bucket: int, group: RowGroup, bucket_stats: dict,
                     config: ShardsConfig, vocab_size: int
                     ) -> Iterator[tuple[tuple[str, int], RowGroup]]:
    """Rows of one bucket -> (split, shard) parts, by global rank round robin."""
    mine = {b: s for (sp, b), s in bucket_stats.items() if sp == split}
    offset = sum(mine[b][0] for b in mine if b < bucket)
    num_shards = split_num_shards(mine.values(), config, vocab_size)
    shard, position = shard_files.assign_round_robin(offset + np.arange(len(group.row_sizes)),
                                                num_shards)
    for s in np.unique(shard).tolist():
        rows = np.flatnonzero(shard == s)
        part = group.take_rows(rows)
        yield (split, s), RowGroup(part.batch, part.row_sizes, position[rows])


def split_num_shards(bucket_stats: Iterable[tuple[int, int, int, int]], config: ShardsConfig,
                     vocab_size: int) -> int:
    """Shards of a split from its (rows, instances, tokens, masked) per pack bucket."""
    totals = [sum(column) for column in zip(*bucket_stats)] or [0, 0, 0, 0]
    rows, instances, tokens, masked = totals
    est = shard_files.estimated_bytes(rows, instances, tokens, masked, vocab_size)
    return shard_files.choose_num_shards(rows, est, int(config.target_shard_mb * 2 ** 20),
                                         config.num_shards)


def write_group(output: str, split: str, index: int, group: RowGroup, config: ShardsConfig,
                vocab_tokens: list[str]) -> shard_files.ShardInfo:
    stats = group.shard_stats(config.max_seq_length)
    if config.format == "jsonl":
        return shard_files.write_jsonl_shard(output, split, index,
                                        packing.to_rows(group.batch, group.row_sizes),
                                        vocab_tokens, config.max_seq_length, stats)
    blocks = packing.encode_blocks(group.batch, group.row_sizes, config.rows_per_block,
                                   len(vocab_tokens))
    try:
        return shard_files.write_tar(output, split, index, blocks, stats)
    except DiskFullError as e:  # say how much the shard needs (its blocks encoded once more)
        sizes = [len(b) for b in packing.encode_blocks(group.batch, group.row_sizes,
                                                       config.rows_per_block, len(vocab_tokens))]
        raise DiskFullError(e.path, shard_files.tar_bytes(sizes)) from None
