"""Beam job: corpus text -> BERT pretraining instances -> WebDataset shards + manifest.

    beam run pipelines/make_shards.py --input corpus/ --vocab vocab/ --output shards/128 \\
        --max_seq_length 128 --max_predictions_per_seq 20 --dupe_factor 10 [Beam options]

The algorithm is BERT's reference generator (`pipelines/shards/instances.py`). Two modes:
- `--mode scalable` (default): the Beam pipeline below; same output on any number of workers.
- `--mode reference`: one process, one random stream, exactly the reference's instances.

Scalable pipeline (every shuffle moves columnar batches, never one object per instance):

    files -> parts of ~--read_part_kb (work units) -> ReadDocuments (batched WordPiece) -> docs
      docs -> count per (split, file, part) -> dense document index (side input)
      indexed docs -> PlanDocuments: plan_document per pass; one output keyed by join group:
           the document itself (group doc_index % J), actual-next plans (same group, as
           segment ranges), random-next plans (group random_doc_index % J, with their A tokens)
      JOIN (one GroupByKey) -> fill_random_next (B from the whole corpus) -> finalize_instances
           -> instances, and their lengths, per shuffle-key range (pack bucket)
      lengths -> rows per pack bucket (side input)
      instances -> group by pack bucket -> sort, pack into rows, global rank -> shard = rank %
           num_shards (one stage)
      shards -> write `{split}-{index:06d}.tar` atomically -> manifest.json (last)

Where the pieces live: this file holds the flags (`build_parser`, from `ShardsConfig`), the
Beam wiring (the DoFns, `CreateInstances`, `WriteShards`, `build_scalable_pipeline`), the waves,
the manifest and `run()`. Its one config is `pipelines/shards/config.py`'s `ShardsConfig`,
passed whole. The data work is pure code in
- `pipelines/shards/reading.py`: input files -> read parts -> waves -> documents as token ids;
- `pipelines/shards/reference.py`: the reference mode (one process, one random stream);
- `pipelines/shards/instances.py`: documents -> plans -> instances (the reference's algorithm);
- `pipelines/shards/batches.py`: the columnar batches that cross the shuffles, pack and shard
  bucket counts, rows per bucket, shard assignment, writing a shard;
- `pipelines/shards/packing.py`, `pipelines/shards/shard_files.py`: instance columns, rows,
  shard files.

Local runs (the FnApiRunner, e.g. --direct_num_workers=2 --direct_running_mode=multi_processing)
move every shuffled byte through the runner process, which then competes with the workers: so
the pipeline has no Flatten/CoGroupByKey (the runner materializes each as an extra round trip),
the instances cross the runner twice (to their pack bucket, to their shard), documents travel
as uint16 ids and instances without per-token segment ids (`batches.WireBatch`), shuffled
values are pickled in the workers (`batches.to_bytes`), and each grouped stage has enough
similar groups for the runner to deal out evenly (`reading.read_parts`,
`batches.MIN_BUCKETS`).

Waves (`--wave_mb`; unset: `LOCAL_WAVE_MB` on the local runner, one wave elsewhere): the read
parts are cut, in input order, into consecutive waves of about that many input MB (a Parquet
file counted uncompressed, `parquet_io.uncompressed_bytes`), each run as
a pipeline of its own, so a local run's peak memory follows the wave, not the corpus. Random
nexts are drawn within a wave, as the reference draws within one run's input files; each wave
writes its own shards (indices run on), a fixed `--num_shards` is shared out among the waves.

Documents held out for validation (`--validation_fraction`, by a hash of doc_id) form their own
split with their own document index, so no validation text is drawn as a training random next.

On Dataflow the same code runs with the standard Beam options, e.g. `--runner=DataflowRunner
--project=P --region=R --temp_location=gs://B/tmp --setup_file=infra/dataflow/setup.py` (or
`--sdk_container_image` built from infra/dataflow/Dockerfile) and gs:// paths for `--input`,
`--vocab` and `--output`. Output: `{split}-{index:06d}.tar` shards (`common/shard_format.py`;
`next_sentence_label` 1 = random next), `dead_letter/make_shards.jsonl` and, written last,
`manifest.json`; `python -m pipelines.verify_shards <output>` checks them, and names any other
file in the folder. A full disk ends the job with one line naming the shard being written, its
estimated size and the space left (exit 2), and no manifest. A run removes on start the
temporaries (`.<shard>.<random>.tmp`, `dead_letter/beam-temp-make_shards-*`) a killed run of
this job left in its output folder. A binary text input is
one dead letter; a run that makes no instance writes no manifest and fails (`errors.NoOutputError`).
Casing follows the vocabulary folder (`--do_lower_case` defaults to what it records).
"""
from __future__ import annotations

import argparse
import functools
import logging
import os
import re
import shutil
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace

import apache_beam as beam
import numpy as np

from common import errors, storage
from pipelines import jobs, parquet_io, waves
from pipelines.disk_full import disk_full_reported
from pipelines.shards import packing, reference, shard_files
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
from pipelines.shards.config import LOCAL_WAVE_MB, ShardJobConfig, ShardsConfig
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
    input_waves,
    is_parquet,
    parse_reference_text,
    read_parts,
    select_inputs,
    share_bounds,
    split_of,
    tokenize_documents,
)

logger = logging.getLogger("make_shards")

DEAD = "dead_letter"
_SHARD_FILE = re.compile(r"^(train|validation)-\d{6}\.(tar|jsonl)$")
_SHARD_INFOS = ".make_shards-shard-infos.jsonl"
DEAD_LETTERS = shard_files.DEAD_LETTERS
WRITTEN = (rf"(train|validation)-\d{{6}}\.(tar|jsonl)|{re.escape(_SHARD_INFOS)}"
           rf"|{storage.MANIFEST_NAME}|{DEAD_LETTERS}\.jsonl")
"""The files this job writes, as paths below its output (`jobs.remove_stale_temporaries`)."""


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The job's flags: one per `ShardsConfig` field, help from its docstring."""
    parser = jobs.config_parser(__doc__.split("\n")[0], ShardsConfig, aliases=[
        ("--no_next_sentence", "next_sentence", "false",
         "MLM-only: one segment per instance, no next-sentence pairs")])
    parser.add_argument("--vocab", required=True, help="vocabulary folder or vocab.txt")
    return parser


def resolve_do_lower_case(flag: bool | None, vocab_path: str) -> bool:
    """`do_lower_case`, defaulting to the casing the vocabulary folder records.

    A cased vocabulary lower-cased (or the reverse) maps much of the text to [UNK] or to the
    wrong pieces without any error, so a flag that contradicts the folder is refused. A bare
    vocab.txt records nothing: lower case, the reference's default.
    """
    from common.tokenization import recorded_lower_case

    recorded = recorded_lower_case(vocab_path)
    if flag is None:
        return True if recorded is None else recorded
    if recorded is not None and flag != recorded:
        raise ValueError(f"--do_lower_case={str(flag).lower()} contradicts --vocab {vocab_path}, "
                         f"whose tokenizer files say do_lower_case={str(recorded).lower()}; "
                         "leave the flag out to follow the vocabulary")
    return flag


# ----------------------------------------------------------------------------------------------
# Beam wiring
# ----------------------------------------------------------------------------------------------

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


# ----------------------------------------------------------------------------------------------
# Manifest and run()
# ----------------------------------------------------------------------------------------------

def output_options(options: dict, config: ShardsConfig) -> dict:
    """The options the output depends on: the manifest's `config_hash` covers these only.

    Work-unit and join group sizes move no instance, and neither does the pack bucket size
    when rows are not packed (rows are in shuffle-key order either way), so tuning them for
    speed keeps the hash of the same shards.
    """
    neutral = {"join_buckets", "read_part_kb"} | ({"instances_per_pack_bucket"} if not config.pack
                                                   else set())
    return {**options, "job": {k: v for k, v in options["job"].items() if k not in neutral}}


def build_manifest(infos: list[shard_files.ShardInfo], options: dict, vocab_path: str,
                   vocab_size: int, config: ShardsConfig,
                   counters: dict) -> dict:
    from common.tokenization import is_vocab_folder, merges_sha256

    infos = sorted(infos, key=lambda i: (shard_files.SPLITS.index(i.split), i.index))
    totals = shard_files.ShardStats()
    splits = {}
    for split in shard_files.SPLITS:
        mine = [i for i in infos if i.split == split]
        if not mine:
            continue
        s = shard_files.ShardStats()
        for i in mine:
            s.add(i.stats)
        totals.add(s)
        per = [i.stats.num_rows for i in mine]
        splits[split] = {"num_shards": len(mine), "num_rows": s.num_rows,
                         "num_instances": s.num_instances, "num_tokens": s.num_tokens,
                         "min_rows_per_shard": min(per), "max_rows_per_shard": max(per)}
    L = config.max_seq_length
    edges = [round(b * (L + 1) / shard_files.HISTOGRAM_BINS) for b in range(shard_files.HISTOGRAM_BINS + 1)]
    vocab_file = (storage.join(vocab_path.rstrip("/"), "vocab.txt") if is_vocab_folder(vocab_path)
                  else vocab_path)
    merges = merges_sha256(vocab_path)  # a BPE vocabulary's other half (absent for WordPiece)
    return {
        "stage": "make_shards",
        "options": options,
        "config_hash": storage.config_hash(output_options(options, config)),
        "vocab": {"path": vocab_file, "sha256": storage.sha256_file(vocab_file),
                  "vocab_size": vocab_size, **({"merges_sha256": merges} if merges else {})},
        "vocab_size": vocab_size,
        "max_seq_length": L,
        "max_predictions_per_seq": config.max_predictions_per_seq,
        "packed": config.pack,
        "nsp": config.next_sentence,
        "format": config.format,
        "mode": config.mode,
        "next_sentence_label": "1 = B is a random segment, 0 = B is the actual next, -1 = no NSP",
        "shards": [i.manifest_entry() for i in infos],
        "splits": splits,
        "totals": {
            "num_rows": totals.num_rows, "num_instances": totals.num_instances,
            "num_tokens": totals.num_tokens, "num_masked": totals.num_masked,
            "num_random_next": totals.num_random_next,
            "random_next_share": totals.num_random_next / totals.num_nsp if totals.num_nsp else 0.0,
            "padding_share": shard_files.padded_share(totals, L),
            "padding_share_unpacked": (1.0 - totals.num_tokens / (totals.num_instances * L)
                                       if totals.num_instances else 0.0),
            "length_histogram": {"bin_edges": edges, "counts": totals.length_histogram},
        },
        "counters": counters,
    }


def _beam_counters(result) -> dict:
    query = beam.metrics.metric.MetricsFilter().with_namespace("make_shards")
    out = {}
    for c in result.metrics().query(query)["counters"]:
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(c.committed or c.attempted)
    return out


def _remove_stale(output: str, infos: list[shard_files.ShardInfo]) -> list[str]:
    if storage.is_remote(output):
        return []
    keep = {i.file for i in infos}
    stale = [n for n in os.listdir(output) if _SHARD_FILE.match(n) and n not in keep]
    for name in stale:
        os.unlink(os.path.join(output, name))
    return stale


def input_files(pattern: str) -> list[storage.InputFile]:
    """--input's files (see `select_inputs`), with the names and sizes of their listing."""
    listed = storage.expand_input_files(pattern)
    by_path = {f.path: f for f in listed}
    return [by_path[path] for path in select_inputs([f.path for f in listed])]


def main(argv: list[str] | None = None) -> dict:
    """The command line: flags -> `ShardsConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    return run(jobs.config_from_args(args, ShardsConfig()), args.input, args.vocab, args.output,
               beam_args)


def run(config: ShardsConfig, input: str, vocab: str, output: str,
        beam_args: Sequence[str] = ()) -> dict:
    """Make shards of the corpus at `input` (a file, glob or folder) with the vocabulary at
    `vocab` into `output`; returns the manifest written to `<output>/manifest.json`."""
    jobs.configure_logging()
    beam_options = jobs.beam_pipeline_options(beam_args)
    config = replace(config, do_lower_case=resolve_do_lower_case(config.do_lower_case, vocab))
    if config.mode != "reference":
        config = resolve_wave_mb(config, beam_options)
    from common.tokenization import read_vocab
    vocab_size = len(read_vocab(vocab))
    files = input_files(input)
    options = {"input": [f.path for f in files], "vocab": vocab,
               "instance": _fields_of(InstanceConfig, config),
               "job": _fields_of(ShardJobConfig, config)}
    logger.info("make_shards: %d input file(s) -> %s", len(files), output)
    logger.debug("make_shards config:\n%s",
                 "\n".join(f"  {k}: {v}" for k, v in asdict(config).items()))
    if config.mode != "reference":
        total = sum(f.size_bytes for f in files)
        jobs.warn_if_too_large_for_local_runner(  # a wave at a time is in memory
            logger, "make_shards", min(total, int(config.wave_mb * 2 ** 20)) if config.wave_mb
            else total, beam_options, scale=config.dupe_factor / jobs.MEASURED_DUPE_FACTOR)
    if jobs.is_dry_run(beam_options):  # the Beam graph only; an earlier output stays as it is
        if config.mode == "reference":
            raise ValueError("--dry_run builds the Beam job graph: it needs --mode=scalable "
                             "(the reference mode runs no pipeline)")
        with beam.Pipeline(runner=jobs.local_runner(beam_options), options=beam_options) as p:
            _scalable_graph(p, read_parts(files, config.read_part_kb * 1024), output, vocab,
                            config, vocab_size)
        return jobs.dry_run_summary("make_shards", p)
    storage.makedirs(output)
    storage.withdraw_manifest(output)  # a crash must not leave a complete-looking mix
    jobs.remove_stale_temporaries(output, WRITTEN, beam_sinks=[DEAD_LETTERS])
    _remove_wave_dead_letters(output)
    start = time.perf_counter()
    with disk_full_reported(output):
        if config.mode == "reference":
            infos, counters = reference.run_reference(files, output, vocab, config)
        else:
            infos, counters = _run_scalable(files, output, vocab, beam_options, config,
                                            vocab_size)
    stale = _remove_stale(output, infos)
    if stale:
        logger.info("removed %d shard(s) left from an earlier run", len(stale))
    counters["seconds"] = round(time.perf_counter() - start, 3)
    manifest = build_manifest(infos, options, vocab, vocab_size, config, counters)
    dead_letters = storage.join(output, errors.DEAD_LETTER_DIR, "make_shards.jsonl")
    num_bad = counters.get("bad_records", 0)
    if manifest["totals"]["num_instances"] == 0:
        raise jobs.nothing_produced(f"instances ({counters.get('documents', 0)} documents, "
                                    f"{counters.get('empty_documents', 0)} empty)", input,
                                    num_bad, dead_letters)
    storage.write_manifest(output, manifest)
    t = manifest["totals"]
    logger.info("make_shards: %d instances in %d rows, %d shards, %.1f s (%.0f instances/s); "
                "random-next share %.3f, padding share %.3f", t["num_instances"], t["num_rows"],
                len(infos), counters["seconds"], t["num_instances"] / max(counters["seconds"], 1e-9),
                t["random_next_share"], t["padding_share"])
    jobs.warn_dead_letters(logger, "make_shards", num_bad, dead_letters)
    return manifest


def _fields_of(part: type, config: ShardsConfig) -> dict:
    """The values of `config` that belong to its part `part` (the manifest keeps them apart)."""
    return {f.name: getattr(config, f.name) for f in fields(part)}


def _scalable_graph(p, parts: list[ReadPart], output: str, vocab: str, config: ShardsConfig,
                    vocab_size: int, wave: Wave | None = None) -> None:
    """The scalable mode's pipeline: shards, and their infos saved to one side file."""
    infos_path = storage.join(output, _SHARD_INFOS)
    infos = build_scalable_pipeline(p, parts, output, vocab, config, vocab_size, wave)
    _ = (infos | "CollectInfos" >> beam.combiners.ToList()
         | "SaveInfos" >> beam.Map(lambda lines: storage.atomic_write_text(
             infos_path, "".join(line + "\n" for line in sorted(lines)))))


def _run_scalable(files, output, vocab, beam_options, config: ShardsConfig, vocab_size):
    """Every wave in turn (`reading.input_waves`), each a pipeline; the shards' infos and the summed
    counters."""
    from common.logs import progress

    planned = input_waves(read_parts(parquet_io.with_uncompressed_sizes(files),
                                     config.read_part_kb * 1024),
                          int((config.wave_mb or 0) * 2 ** 20))
    check_wave_shards(config, len(planned))
    infos: list[shard_files.ShardInfo] = []
    counters: dict[str, int] = defaultdict(int)
    first_index = dict.fromkeys(shard_files.SPLITS, 0)
    for index, parts in enumerate(progress(planned, desc="waves", unit="wave", file=sys.stderr,
                                       disable=len(planned) == 1)):
        wave = Wave(index, len(planned), dict(first_index))
        wave_config = replace(config, num_shards=wave_num_shards(config.num_shards, wave))
        run = (_run_wave if len(planned) == 1 else
               functools.partial(waves.run_isolated, _run_wave))  # one process per wave
        wave_infos, wave_counters = run(parts, output, vocab, beam_options, wave_config,
                                        vocab_size, wave)
        infos += wave_infos
        for name, value in wave_counters.items():
            counters[name] += value
        for info in wave_infos:
            first_index[info.split] = max(first_index[info.split], info.index + 1)
    if len(planned) > 1:
        _join_dead_letters(output, len(planned))
    counters["waves"] = len(planned)
    return infos, dict(counters)


def _run_wave(parts, output, vocab, beam_options, config, vocab_size, wave: Wave):
    infos_path = storage.join(output, _SHARD_INFOS)
    with (disk_full_reported(output),
          beam.Pipeline(runner=jobs.local_runner(beam_options), options=beam_options) as p):
        _scalable_graph(p, parts, output, vocab, config, vocab_size, wave)
    result = p.result
    try:
        with storage.open_read(infos_path) as f:
            infos = [shard_files.ShardInfo.from_json(line) for line in f if line.strip()]
    finally:  # a side file of the run, never an output
        if storage.is_remote(infos_path):
            beam.io.filesystems.FileSystems.delete([infos_path])
        else:
            os.unlink(infos_path)
    return infos, _beam_counters(result)


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


def check_wave_shards(config: ShardsConfig, count: int) -> None:
    if config.num_shards and config.num_shards < count:
        raise ValueError(f"--num_shards {config.num_shards} is fewer than the {count} waves of "
                         f"--wave_mb {config.wave_mb:g} (each wave writes its own shards): "
                         "raise num_shards, raise wave_mb, or set num_shards=0 (by "
                         "target_shard_mb)")


def resolve_wave_mb(config: ShardsConfig, beam_options) -> ShardsConfig:
    return waves.resolve_wave_mb(config, beam_options, LOCAL_WAVE_MB)


_WAVE_DEAD_LETTERS = re.compile(rf"^(beam-temp-)?{re.escape(DEAD_LETTERS.split('/')[-1])}"
                                r"-wave\d{5}")


def _remove_wave_dead_letters(output: str) -> None:
    """The wave dead-letter files (and their Beam temporaries) a killed run left."""
    folder = os.path.join(output, *DEAD_LETTERS.split("/")[:-1])
    if storage.is_remote(output) or not os.path.isdir(folder):
        return
    for name in os.listdir(folder):
        if _WAVE_DEAD_LETTERS.match(name):
            path = os.path.join(folder, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.unlink(path)


def _join_dead_letters(output: str, count: int) -> None:
    """The waves' dead-letter files, in wave order, as one `DEAD_LETTERS` file (atomic)."""
    parts = [storage.join(output, *Wave(w, count).dead_letters.split("/")) + ".jsonl"
             for w in range(count)]
    target = storage.join(output, *DEAD_LETTERS.split("/")) + ".jsonl"
    with storage.atomic_open(target, "wb") as out:
        for path in parts:
            with storage.open_read(path, "rb") as f:
                shutil.copyfileobj(f, out)
    for path in parts:
        beam.io.filesystems.FileSystems.delete([path])


if __name__ == "__main__":
    # Run the module under its package name, so the classes Beam pickles for its workers are
    # `pipelines.make_shards.X`, importable there, not `__main__.X`.
    from pipelines import make_shards as _job  # noqa: PLW0406

    sys.exit(jobs.main("make_shards", _job.main))
