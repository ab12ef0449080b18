"""make_shards' scalable mode as a Beam pipeline: the DoFns and composites that wire the pure
code of `reading`, `instances` and `batches` (`build_scalable_pipeline`), and the `Wave` a
pipeline runs as. The job (`pipelines/make_shards.py`) runs it, wave by wave; the graph and why
it moves columnar batches are in its docstring.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import apache_beam as beam
import numpy as np

from common import errors, storage
from pipelines.shards import packing, shard_files
from pipelines.shards.batches import (
    LengthBatch,
    PlanBatch,
    RowGroup,
    WireBatch,
    bucket_instances,
    bucket_totals,
    from_bytes,
    join_bucket_count,
    narrow_ids,
    pack_and_assign,
    pack_bucket_count,
    to_bytes,
    write_group,
)
from pipelines.shards.config import ShardsConfig
from pipelines.shards.instances import (
    InstanceConfig,
    InstancePlan,
    Vocab,
    fill_random_next,
    finalize_instances,
    plan_document,
)
from pipelines.shards.reading import (
    ReadPart,
    TokenizedDoc,
    corpus_parquet,
    is_parquet,
    parse_reference_text,
    share_bounds,
    split_of,
    tokenize_documents,
)

logger = logging.getLogger("make_shards")

DEAD = "dead_letter"
DEAD_LETTERS = shard_files.DEAD_LETTERS


@dataclass(frozen=True)
class Wave:
    """One wave of a run (`reading.input_waves`): its number, the run's wave count, and per split
    the index its shards start at (the shards earlier waves wrote)."""
    index: int = 0
    count: int = 1
    first_index: dict[str, int] = field(default_factory=dict)

    @property
    def dead_letters(self) -> str:
        """Its dead-letter file (below the output, without .jsonl); a run of several waves
        joins them into `DEAD_LETTERS` at the end."""
        return DEAD_LETTERS if self.count == 1 else f"{DEAD_LETTERS}-wave{self.index:05d}"


def wave_num_shards(num_shards: int, wave: Wave) -> int:
    """A wave's share of a fixed `num_shards` per split (0 stays 0: from the target size)."""
    return (num_shards * (wave.index + 1) // wave.count - num_shards * wave.index // wave.count
            if num_shards else 0)


def _windowed(value):
    """A value emitted from finish_bundle needs its window spelled out."""
    return beam.transforms.window.GlobalWindows.windowed_value(value)


OPENED = object()
"""Yielded by a part reader once its file is open and parsed: a failure before it is the
file's (reported by part 0 alone), a failure after it loses this part's documents (reported)."""


class ReadDocumentsFn(beam.DoFn):
    """ReadPart -> TokenizedDoc per non-empty document of the part; bad records -> DEAD."""

    def __init__(self, vocab_path: str, do_lower_case: bool, validation_fraction: float,
                 batch_documents: int = 512):
        self.vocab_path, self.do_lower_case = vocab_path, do_lower_case
        self.validation_fraction, self.batch_documents = validation_fraction, batch_documents
        self.documents = beam.metrics.Metrics.counter("make_shards", "documents")
        self.empty = beam.metrics.Metrics.counter("make_shards", "empty_documents")
        self.bad = beam.metrics.Metrics.counter("make_shards", "bad_records")
        self.tokens = beam.metrics.Metrics.counter("make_shards", "tokens")
        self.per_split = {split: beam.metrics.Metrics.counter("make_shards", f"documents_{split}")
                          for split in shard_files.SPLITS}

    def setup(self):
        from common.tokenization import load_tokenizer
        self.tokenizer = load_tokenizer(self.vocab_path, self.do_lower_case,
                                        split_special_tokens=True)

    def process(self, element: tuple[int, Iterable[ReadPart]]):
        for unit in element[1]:
            yield from self._read(unit)

    def _read(self, unit: ReadPart):
        path = unit.path
        opened = False
        try:
            batches = self._parquet(unit) if is_parquet(path) else self._text(unit)
            local: dict[str, int] = defaultdict(int)  # documents so far, per split
            for item in batches:
                if item is OPENED:
                    opened = True
                    continue
                doc_ids, sentences = item
                for doc_id, (tokens, lengths) in zip(
                        doc_ids, tokenize_documents(self.tokenizer, sentences)):
                    if isinstance(doc_id, errors.BadRecord):
                        self.bad.inc()
                        yield beam.pvalue.TaggedOutput(DEAD, doc_id.to_json())
                        continue
                    if len(lengths) == 0:
                        self.empty.inc()
                        continue
                    split = split_of(doc_id, self.validation_fraction)
                    self.documents.inc()
                    self.per_split[split].inc()
                    self.tokens.inc(len(tokens))
                    yield TokenizedDoc(doc_id, split, unit.file_index, unit.part, local[split],
                                       narrow_ids(tokens), lengths)
                    local[split] += 1
            logger.debug("read %s part %d/%d: %d documents", path, unit.part + 1, unit.num_parts,
                         sum(local.values()))
        except Exception as e:  # noqa: BLE001 - any unreadable file is a dead letter, not a crash
            if not opened and unit.part > 0:
                return  # the file itself cannot be opened: every part fails alike, part 0 says so
            self.bad.inc()
            record = (f"part {unit.part + 1}/{unit.num_parts}" if opened and unit.num_parts > 1
                      else "file")
            logger.error("cannot read %s (%s): %s", path, record, e)
            yield beam.pvalue.TaggedOutput(DEAD, errors.BadRecord(
                path, record, f"{type(e).__name__}: {e}").to_json())

    def _text(self, unit: ReadPart):
        """(doc ids, sentences) batches of the part's share of a reference-format text file
        (bad lines from part 0)."""
        with storage.open_read(unit.path, "rb") as f:
            docs, bad = parse_reference_text(f.read(), unit.path)
        yield OPENED
        if bad and unit.part == 0:
            yield bad, [[] for _ in bad]
        bounds = share_bounds([sum(map(len, d)) for d in docs], unit.num_parts)
        name = unit.name
        first, last = bounds[unit.part], bounds[unit.part + 1]
        for start in range(first, last, self.batch_documents):
            chunk = docs[start:min(start + self.batch_documents, last)]
            yield [f"{name}:{start + i}" for i in range(len(chunk))], chunk

    def _parquet(self, unit: ReadPart):
        """(doc ids, sentences) batches of the part's row groups of a corpus Parquet file; a
        null row is a BadRecord."""
        with storage.open_read(unit.path, "rb") as f:
            parquet = corpus_parquet(f, unit.path)
            yield OPENED
            groups = parquet.metadata.num_row_groups
            mine = [g for g in range(groups) if g * unit.num_parts // groups == unit.part]
            if not mine:
                return
            row = sum(parquet.metadata.row_group(g).num_rows for g in range(mine[0]))
            for batch in parquet.iter_batches(batch_size=self.batch_documents, row_groups=mine,
                                              columns=["doc_id", "sentences"]):
                ids = batch.column(0).to_pylist()
                sentences = batch.column(1).to_pylist()
                keys = [doc_id if doc_id is not None and s is not None else
                        errors.BadRecord(unit.path, f"row {row + i}", "null doc_id or sentences")
                        for i, (doc_id, s) in enumerate(zip(ids, sentences))]
                yield keys, [s or [] for s in sentences]
                row += len(ids)


class _Indexes:
    """Dense document index per split from the per-(split, file, part) counts side input."""

    def __init__(self, counts: dict):
        self.offsets: dict[tuple[str, int, int], int] = {}
        self.num_docs: dict[str, int] = defaultdict(int)
        self.num_tokens: dict[str, int] = defaultdict(int)
        for key in sorted(counts):  # (split, file index, part): the input order
            split = key[0]
            n_docs, n_tokens = counts[key]
            self.offsets[key] = self.num_docs[split]
            self.num_docs[split] += n_docs
            self.num_tokens[split] += n_tokens

    @staticmethod
    def cached(owner, counts: dict) -> _Indexes:
        """`_Indexes(counts)` built once per side-input object and kept on `owner` (a DoFn):
        every join bucket or document of a worker sees the same counts, and the keys grow
        with the corpus, so rebuilding per element would cost keys x elements."""
        cache = getattr(owner, "_indexes_cache", None)
        if cache is None or cache[0] is not counts:
            owner._indexes_cache = cache = (counts, _Indexes(counts))
        return cache[1]


class PlanDocumentsFn(beam.DoFn):
    """Document -> its plans for every pass, keyed for the random-next join.

    With next-sentence pairs, one output keyed by (split, join bucket) carries both the
    documents (`(doc_index, TokenizedDoc)`, in the bucket of their index) and the plans
    (`PlanBatch`, in the bucket of the document a random next draws from; actual-next plans in
    their own document's bucket): one GroupByKey joins them. Two outputs would need a Flatten
    (CoGroupByKey), and the FnApiRunner materializes every multi-input Flatten as an extra
    stage, one more trip of all the data through the runner. MLM-only plans need no join:
    they are finalized here (outputs "instances" and "lengths", as `FillRandomNextFn`'s).
    Plans are buffered over the bundle and leave as a few columnar batches per key.
    """

    def __init__(self, config: ShardsConfig, vocab_path: str,
                 flush_plans: int = 16_384):
        self.config, self.vocab_path, self.flush_plans = config, vocab_path, flush_plans
        self.instances = beam.metrics.Metrics.counter("make_shards", "instances")
        self.requests = beam.metrics.Metrics.counter("make_shards", "random_next_requests")

    def setup(self):
        self.vocab = Vocab.from_path(self.vocab_path)

    def start_bundle(self):
        self.pending: dict[tuple[str, int], list[InstancePlan]] = defaultdict(list)
        self.buffered = 0

    def process(self, doc: TokenizedDoc, counts):
        config = self.config
        idx = _Indexes.cached(self, counts)
        doc_index = idx.offsets[(doc.split, doc.file_index, doc.part)] + doc.local_index
        num_docs = idx.num_docs[doc.split]
        join_buckets = join_bucket_count(idx.num_tokens[doc.split], config)
        segments = doc.segments()
        if config.next_sentence:
            yield (doc.split, doc_index % join_buckets), to_bytes((doc_index, doc))
        for pass_index in range(config.dupe_factor):
            for plan in plan_document(segments, doc_index, num_docs, pass_index, config):
                source = doc_index if plan.random_doc_index is None else plan.random_doc_index
                self.pending[(doc.split, source % join_buckets)].append(plan)
                self.buffered += 1
        if self.buffered >= self.flush_plans:
            yield from self._flush(lambda v: v, idx)

    def finish_bundle(self):
        cache = getattr(self, "_indexes_cache", None)  # None: the bundle had no documents
        yield from self._flush(_windowed, cache and cache[1])

    def _flush(self, wrap, idx: _Indexes | None):
        if not self.config.next_sentence:
            for (split, _), plans in self.pending.items():
                instances = finalize_instances(plans, self.vocab, self.config)
                self.instances.inc(len(instances))
                buckets = pack_bucket_count(idx.num_tokens[split], self.config)
                yield from instance_outputs(split, instances, plans, buckets, self.config, wrap)
        else:
            for key, plans in self.pending.items():
                self.requests.inc(sum(p.random_doc_index is not None for p in plans))
                yield wrap((key, to_bytes(PlanBatch.from_plans(plans))))
        logger.debug("flushed %d instance plans", self.buffered)
        self.pending.clear()
        self.buffered = 0


def instance_outputs(split: str, instances: list, plans: list[InstancePlan], buckets: int,
                     config: InstanceConfig, wrap=lambda v: v) -> Iterator[beam.pvalue.TaggedOutput]:
    """Columnar batches of instances per pack bucket ("instances"), and their `LengthBatch`es
    ("lengths"); `wrap` windows the values when emitted from finish_bundle."""
    for key, part in bucket_instances(split, instances, plans, buckets, config):
        yield beam.pvalue.TaggedOutput("instances", wrap((key, to_bytes(WireBatch.of(part)))))
        yield beam.pvalue.TaggedOutput("lengths", wrap((key, LengthBatch.of(part))))


class FillRandomNextFn(beam.DoFn):
    """A join bucket (its documents, the plans keyed to it) -> finalized instances.

    Random-next plans draw B from the bucket's documents; actual-next plans have theirs.
    Outputs "instances" and "lengths" (`instance_outputs`).
    """

    def __init__(self, config: ShardsConfig, vocab_path: str,
                 chunk: int = 16_384):
        self.config, self.vocab_path, self.chunk = config, vocab_path, chunk
        self.instances = beam.metrics.Metrics.counter("make_shards", "instances")

    def setup(self):
        self.vocab = Vocab.from_path(self.vocab_path)

    def process(self, element, counts):
        (split, _), grouped = element
        grouped = [from_bytes(v) for v in grouped]
        docs = {v[0]: v[1] for v in grouped if not isinstance(v, PlanBatch)}
        buckets = pack_bucket_count(_Indexes.cached(self, counts).num_tokens[split], self.config)
        segments: dict[int, list] = {}

        def segments_of(doc_index: int) -> list[np.ndarray]:
            if doc_index not in segments:
                segments[doc_index] = docs[doc_index].segments()
            return segments[doc_index]

        plans: list[InstancePlan] = []
        filled: list[InstancePlan] = []
        for batch in (v for v in grouped if isinstance(v, PlanBatch)):
            for plan in batch.plans(segments_of):
                r = plan.random_doc_index
                if r is not None:
                    filled.append(fill_random_next(plan, segments_of(r), self.config))
                else:
                    filled.append(plan)
                plans.append(plan)
        for start in range(0, len(plans), self.chunk):
            instances = finalize_instances(filled[start:start + self.chunk], self.vocab, self.config)
            self.instances.inc(len(instances))
            yield from instance_outputs(split, instances, plans[start:start + self.chunk],
                                        buckets, self.config)


class WriteShardFn(beam.DoFn):
    """(split, shard index) and its row parts -> the written shard's ShardInfo (JSON)."""

    def __init__(self, output: str, config: ShardsConfig, vocab_path: str,
                 first_index: dict[str, int] | None = None):
        self.output, self.config, self.vocab_path = output, config, vocab_path
        self.first_index = first_index or {}  # per split: the shards earlier waves wrote
        self.written = beam.metrics.Metrics.counter("make_shards", "shards")
        self.rows = beam.metrics.Metrics.counter("make_shards", "rows")

    def setup(self):
        from common.tokenization import read_vocab
        self.vocab_tokens = read_vocab(self.vocab_path)

    def process(self, element):
        (split, index), parts = element
        parts = [from_bytes(p) for p in parts]
        whole = RowGroup(packing.InstanceBatch.concat([p.wire.unpack() for p in parts]),
                         np.concatenate([p.row_sizes for p in parts]),
                         np.concatenate([p.positions for p in parts]))
        group = whole.take_rows(np.argsort(whole.positions, kind="stable"))
        info = write_group(self.output, split, self.first_index.get(split, 0) + index, group,
                           self.config, self.vocab_tokens)
        self.written.inc()
        self.rows.inc(info.stats.num_rows)
        logger.debug("wrote %s: %d rows, %d bytes", info.file, info.stats.num_rows, info.bytes)
        yield info.to_json()


class CreateInstances(beam.PTransform):
    """Tokenized documents -> {"instances": ((split, pack bucket), InstanceBatch),
    "lengths": ((split, pack bucket), LengthBatch)}, random next drawn from all documents."""

    def __init__(self, config: ShardsConfig, vocab_path: str):
        super().__init__()
        self.config, self.vocab_path = config, vocab_path

    def expand(self, docs):
        counts = (docs
                  | "CountKey" >> beam.Map(lambda d: ((d.split, d.file_index, d.part),
                                                      (1, len(d.tokens))))
                  | "CountPerFile" >> beam.CombinePerKey(_sum_pairs))
        counts_side = beam.pvalue.AsDict(counts)
        planned = docs | "Plan" >> beam.ParDo(
            PlanDocumentsFn(self.config, self.vocab_path), counts_side).with_outputs(
                "instances", "lengths", main="join")
        if not self.config.next_sentence:
            return {"instances": planned.instances, "lengths": planned.lengths}
        filled = (planned.join
                  | "JoinRandomNext" >> beam.GroupByKey()
                  | "FillRandomNext" >> beam.ParDo(
                      FillRandomNextFn(self.config, self.vocab_path),
                      counts_side).with_outputs("instances", "lengths"))
        return {"instances": filled.instances, "lengths": filled.lengths}


def _sum_pairs(values) -> tuple[int, int]:
    return tuple(sum(v) for v in zip(*values)) if values else (0, 0)


class WriteShards(beam.PTransform):
    """{"instances", "lengths"} of `CreateInstances` -> balanced shards on disk -> ShardInfo JSON.

    The LengthBatches give every bucket's row count first (a few bytes per instance), so one
    stage packs a bucket and assigns its rows to shards by global rank: the instances cross
    the runner twice (to their bucket, to their shard), not three times.
    """

    def __init__(self, output: str, config: ShardsConfig, vocab_path: str,
                 vocab_size: int, first_index: dict[str, int] | None = None):
        super().__init__()
        self.output, self.config = output, config
        self.vocab_path, self.vocab_size, self.first_index = vocab_path, vocab_size, first_index

    def expand(self, created):
        config, vocab_size = self.config, self.vocab_size
        stats = beam.pvalue.AsDict(
            created["lengths"]
            | "GroupLengths" >> beam.GroupByKey()
            | "BucketStats" >> beam.MapTuple(
                lambda key, parts: (key, bucket_totals(parts, config, config.pack))))
        return (created["instances"]
                | "GroupByKeyRange" >> beam.GroupByKey()
                | "PackAndAssign" >> beam.FlatMap(
                    lambda kv, stats: pack_and_assign(kv[0], kv[1], stats, config, vocab_size),
                    stats)
                | "GroupByShard" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(WriteShardFn(self.output, config, self.vocab_path,
                                                     self.first_index)))


def build_scalable_pipeline(p, parts: list[ReadPart], output: str, vocab_path: str,
                            config: ShardsConfig, vocab_size: int,
                            wave: Wave | None = None):
    """Wire the scalable job over `parts` (one wave's read parts, `read_parts`) into pipeline
    `p`; returns the PCollection of shard infos (JSON)."""
    wave = wave or Wave()
    read = (p
            # Largest parts first, each under its own key: the FnApiRunner deals a grouped
            # stage's keys out to its workers round robin in arrival order, so the work splits
            # evenly (Create's own reshuffle uses random keys).
            | "Files" >> beam.Create(list(enumerate(sorted(parts, key=lambda u: -u.num_bytes))),
                                     reshuffle=False)
            | "SpreadParts" >> beam.GroupByKey()
            | "ReadDocuments" >> beam.ParDo(ReadDocumentsFn(
                vocab_path, config.do_lower_case, config.validation_fraction)).with_outputs(
                    DEAD, main="docs"))
    _ = (read[DEAD] | "DeadLetters" >> beam.io.WriteToText(
        storage.join(output, *wave.dead_letters.split("/")), file_name_suffix=".jsonl",
        num_shards=1, shard_name_template=""))
    return (read.docs
            | "CreateInstances" >> CreateInstances(config, vocab_path)
            | "WriteShards" >> WriteShards(output, config, vocab_path, vocab_size,
                                           wave.first_index))
