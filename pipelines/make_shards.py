"""Beam job: corpus text -> BERT pretraining instances -> WebDataset shards + manifest.

    beam run pipelines/make_shards.py --input corpus/ --vocab vocab/ --output shards/128 \\
        --max_seq_length 128 --max_predictions_per_seq 20 --dupe_factor 10 [Beam options]

The algorithm is BERT's reference generator (`pipelines/instances.py`). Two modes:
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

Local runs (the FnApiRunner, e.g. --direct_num_workers=2 --direct_running_mode=multi_processing)
move every shuffled byte through the runner process, which then competes with the workers: so
the pipeline has no Flatten/CoGroupByKey (the runner materializes each as an extra round trip),
the instances cross the runner twice (to their pack bucket, to their shard), documents travel
as uint16 ids and instances without per-token segment ids (`WireBatch`), shuffled values are
pickled in the workers (`to_bytes`), and each grouped stage has enough similar groups for the
runner to deal out evenly (`read_parts`, `MIN_BUCKETS`).

Documents held out for validation (`--validation_fraction`, by a hash of doc_id) form their own
split with their own document index, so no validation text is drawn as a training random next.

On Dataflow the same code runs with the standard Beam options, e.g. `--runner=DataflowRunner
--project=P --region=R --temp_location=gs://B/tmp --setup_file=infra/dataflow/setup.py` (or
`--sdk_container_image` built from infra/dataflow/Dockerfile) and gs:// paths for `--input`,
`--vocab` and `--output`. Output: `{split}-{index:06d}.tar` shards (`pipelines/shard_format.py`;
`next_sentence_label` 1 = random next), `dead_letter/make_shards.jsonl` and, written last,
`manifest.json`; `python -m pipelines.verify_shards <output>` checks them.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import math
import os
import pickle
import re
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import apache_beam as beam
import numpy as np

from pipelines import jobs, packing, shards, storage
from pipelines.instances import (
    InstanceConfig,
    InstancePlan,
    Vocab,
    create_instances_reference,
    fill_random_next,
    finalize_instances,
    plan_document,
)
from pipelines.tokenization import encode_like_reference

logger = logging.getLogger("make_shards")

DEAD = "dead_letter"
_SHARD_FILE = re.compile(r"^(train|validation)-\d{6}\.(tar|jsonl)$")
_SHARD_INFOS = ".make_shards-shard-infos.jsonl"


# ----------------------------------------------------------------------------------------------
# Options
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShardJobConfig:
    """How instances become files (the instance options live in `InstanceConfig`)."""
    mode: str = "scalable"
    """`scalable` (Beam, any number of workers) or `reference` (one stream, exact) (--mode)."""
    pack: bool = False
    """Pack several short instances into one max_seq_length row (--pack)."""
    target_shard_mb: float = 64.0
    """Approximate shard size; sets the shard count (--target_shard_mb)."""
    num_shards: int = 0
    """Shards per split; 0 = from the target size (--num_shards)."""
    rows_per_block: int = 128
    """Rows per `.rows.npz` tar member (--rows_per_block)."""
    format: str = "shards"
    """`shards` (WebDataset .tar) or `jsonl` (one instance per line, for inspection) (--format)."""
    validation_fraction: float = 0.0
    """Share of documents held out as the validation split, by a hash of doc_id (--validation_fraction)."""
    do_lower_case: bool = True
    """Lower-case and strip accents before WordPiece (--do_lower_case)."""
    join_buckets: int = 0
    """Groups of the random-next join; 0 = one per ~`INSTANCES_PER_JOIN_BUCKET` estimated
    instances, at least `MIN_BUCKETS`; more = less memory per group (--join_buckets)."""
    read_part_kb: int = 256
    """Input KiB per read work unit: large files are read and tokenized in parts, so that
    workers share them (--read_part_kb)."""
    instances_per_pack_bucket: int = 16_384
    """Instances sorted and packed together in one group, at least `MIN_BUCKETS` groups
    (--instances_per_pack_bucket)."""

    def __post_init__(self):
        if self.mode not in ("scalable", "reference"):
            raise ValueError(f"--mode must be scalable or reference, got {self.mode!r}")
        if self.format not in ("shards", "jsonl"):
            raise ValueError(f"--format must be shards or jsonl, got {self.format!r}")
        if self.format == "jsonl" and self.pack:
            raise ValueError("--format jsonl writes one instance per line: drop --pack")
        if self.target_shard_mb <= 0:
            raise ValueError(f"--target_shard_mb must be > 0, got {self.target_shard_mb}")
        if self.num_shards < 0:
            raise ValueError(f"--num_shards must be >= 0, got {self.num_shards}")
        if not 1 <= self.rows_per_block <= 65535:
            raise ValueError(f"--rows_per_block must be in [1, 65535], got {self.rows_per_block}")
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(f"--validation_fraction must be in [0, 1), got "
                             f"{self.validation_fraction}")
        if self.join_buckets < 0:
            raise ValueError(f"--join_buckets must be >= 0 (0 = auto), got {self.join_buckets}")
        if self.read_part_kb < 1:
            raise ValueError(f"--read_part_kb must be >= 1, got {self.read_part_kb}")
        if self.instances_per_pack_bucket < 1:
            raise ValueError(f"--instances_per_pack_bucket must be >= 1, got "
                             f"{self.instances_per_pack_bucket}")


def _bool(text: str) -> bool:
    value = str(text).lower()
    if value in ("1", "true", "yes", "y"):
        return True
    if value in ("0", "false", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def build_parser() -> argparse.ArgumentParser:
    parser = jobs.job_parser(__doc__.split("\n")[0])
    parser.add_argument("--vocab", required=True, help="vocabulary folder or vocab.txt")
    defaults = InstanceConfig()
    parser.add_argument("--max_seq_length", type=int, default=defaults.max_seq_length,
                        help="tokens per instance with [CLS] and [SEP]s (128; 512 for phase 2)")
    parser.add_argument("--max_predictions_per_seq", type=int,
                        default=defaults.max_predictions_per_seq,
                        help="cap on masked positions per instance (20; 76 or 80 at 512)")
    parser.add_argument("--masked_lm_prob", type=float, default=defaults.masked_lm_prob,
                        help="share of tokens to mask")
    parser.add_argument("--short_seq_prob", type=float, default=defaults.short_seq_prob,
                        help="probability of a shorter random target length per document pass")
    parser.add_argument("--dupe_factor", type=int, default=defaults.dupe_factor,
                        help="passes over the corpus, each with different splits and masks")
    parser.add_argument("--random_seed", type=int, default=defaults.random_seed)
    parser.add_argument("--do_whole_word_mask", type=_bool, nargs="?", const=True,
                        default=defaults.do_whole_word_mask,
                        help="mask all pieces of a word together")
    parser.add_argument("--do_lower_case", type=_bool, nargs="?", const=True, default=True,
                        help="lower-case input (default true; --do_lower_case=false for cased "
                             "vocabularies)")
    parser.add_argument("--no_next_sentence", action="store_true",
                        help="MLM-only: one segment per instance, no next-sentence pairs")
    job = ShardJobConfig()
    parser.add_argument("--mode", choices=["scalable", "reference"], default=job.mode,
                        help="scalable: Beam, same output on any number of workers; reference: "
                             "one process, exactly BERT's reference generator's instances")
    parser.add_argument("--pack", action="store_true", help="pack short instances into rows")
    parser.add_argument("--target_shard_mb", type=float, default=job.target_shard_mb,
                        help="approximate shard size in MiB")
    parser.add_argument("--num_shards", type=int, default=job.num_shards,
                        help="shards per split (0 = from --target_shard_mb)")
    parser.add_argument("--rows_per_block", type=int, default=job.rows_per_block,
                        help="rows per .rows.npz tar member")
    parser.add_argument("--format", choices=["shards", "jsonl"], default=job.format,
                        help="jsonl: one instance per line with token strings, for inspection")
    parser.add_argument("--validation_fraction", type=float, default=job.validation_fraction,
                        help="share of documents (by doc_id hash) held out as validation shards")
    parser.add_argument("--join_buckets", type=int, default=job.join_buckets,
                        help="groups of the random-next join (0 = from the corpus size)")
    parser.add_argument("--read_part_kb", type=int, default=job.read_part_kb,
                        help="input KiB per read work unit (large files are read in parts)")
    parser.add_argument("--instances_per_pack_bucket", type=int,
                        default=job.instances_per_pack_bucket,
                        help="instances sorted and packed together in one group")
    return parser


def configs_from_args(args: argparse.Namespace) -> tuple[InstanceConfig, ShardJobConfig]:
    cfg = InstanceConfig(
        max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq,
        masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
        dupe_factor=args.dupe_factor, random_seed=args.random_seed,
        do_whole_word_mask=args.do_whole_word_mask, next_sentence=not args.no_next_sentence)
    job = ShardJobConfig(
        mode=args.mode, pack=args.pack, target_shard_mb=args.target_shard_mb,
        num_shards=args.num_shards, rows_per_block=args.rows_per_block, format=args.format,
        validation_fraction=args.validation_fraction, do_lower_case=args.do_lower_case,
        join_buckets=args.join_buckets, read_part_kb=args.read_part_kb,
        instances_per_pack_bucket=args.instances_per_pack_bucket)
    if cfg.max_seq_length > 65535:
        raise ValueError("--max_seq_length must fit the shard format's uint16 positions")
    return cfg, job


# ----------------------------------------------------------------------------------------------
# Reading and tokenizing documents (pure functions)
# ----------------------------------------------------------------------------------------------

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
    """`validation` for a stable pseudo-random share of documents, by their id alone."""
    if validation_fraction <= 0:
        return "train"
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


def parse_reference_text(data: bytes, file: str) -> tuple[list[list[str]], list[jobs.BadRecord]]:
    """Documents (lists of lines) from the reference text format, and notes on bad lines.

    Lines split on "\\n" only and are stripped, as the reference reads them; a blank line ends a
    document. Bytes that are not UTF-8 are dropped as the reference does, and each such line is
    reported so nothing changes silently.
    """
    docs: list[list[str]] = [[]]
    bad: list[jobs.BadRecord] = []
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw.decode("utf-8", "ignore")
            bad.append(jobs.BadRecord(file, f"line {number}",
                                      f"invalid UTF-8 ({e.reason}); the bytes were dropped"))
        line = line.strip()
        if line:
            docs[-1].append(line)
        elif docs[-1]:
            docs.append([])
    return [d for d in docs if d], bad


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


# ----------------------------------------------------------------------------------------------
# Beam wiring
# ----------------------------------------------------------------------------------------------

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


def _windowed(value):
    """A value emitted from finish_bundle needs its window spelled out."""
    return beam.transforms.window.GlobalWindows.windowed_value(value)


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


def read_parts(files: list[str], part_bytes: int) -> list[ReadPart]:
    """Work units for `files`, about `part_bytes` of input each (by file size).

    The runner deals a stage's elements out to its workers whole, and tokenization is the
    heaviest stage: one element per file would leave a worker idle while another tokenizes
    the largest file.
    """
    out = []
    for file_index, path in enumerate(files):
        limit = 1 << 20 if is_parquet(path) else MAX_TEXT_PARTS
        size = _file_size(path)
        n = min(limit, max(1, math.ceil(size / part_bytes)))
        out += [ReadPart(file_index, path, k, n, size // n) for k in range(n)]
    return out


def _file_size(path: str) -> int:
    """Bytes of `path`, or 0 if it cannot be listed (reading it then reports the error)."""
    from apache_beam.io.filesystems import FileSystems
    try:
        return FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    except Exception:  # noqa: BLE001 - a missing file becomes a dead letter when read
        return 0


def share_bounds(sizes: list[int], num_parts: int) -> list[int]:
    """num_parts + 1 item indices cutting `sizes` into contiguous shares of about equal sum."""
    cumulative = np.cumsum(sizes)
    total = int(cumulative[-1]) if len(sizes) else 0
    cuts = [int(np.searchsorted(cumulative, total * k / num_parts, side="right"))
            for k in range(1, num_parts)]
    return [0, *cuts, len(sizes)]


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
                          for split in shards.SPLITS}

    def setup(self):
        from pipelines.tokenization import load_tokenizer
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
                    if isinstance(doc_id, jobs.BadRecord):
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
                                       _narrow(tokens), lengths)
                    local[split] += 1
            logger.info("read %s part %d/%d: %d documents", path, unit.part + 1, unit.num_parts,
                        sum(local.values()))
        except Exception as e:  # noqa: BLE001 - any unreadable file is a dead letter, not a crash
            if not opened and unit.part > 0:
                return  # the file itself cannot be opened: every part fails alike, part 0 says so
            self.bad.inc()
            record = (f"part {unit.part + 1}/{unit.num_parts}" if opened and unit.num_parts > 1
                      else "file")
            logger.error("cannot read %s (%s): %s", path, record, e)
            yield beam.pvalue.TaggedOutput(DEAD, jobs.BadRecord(
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
        name = os.path.basename(unit.path)
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
                        jobs.BadRecord(unit.path, f"row {row + i}", "null doc_id or sentences")
                        for i, (doc_id, s) in enumerate(zip(ids, sentences))]
                yield keys, [s or [] for s in sentences]
                row += len(ids)


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
                   _narrow(np.concatenate(carried)))

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


def _narrow(ids: np.ndarray) -> np.ndarray:
    """uint16 when every id fits (BERT vocabularies), else int32."""
    fits = not ids.size or (int(ids.min()) >= 0 and int(ids.max()) < 1 << 16)
    return ids.astype(np.uint16 if fits else np.int32, copy=False)


MIN_BUCKETS = 16
"""Fewest pack and (automatic) join groups: the FnApiRunner deals a stage's groups out to its
workers whole, so a handful of large groups would leave a worker idle."""
INSTANCES_PER_JOIN_BUCKET = 8_192
"""Automatic join groups: about this many instances' plans each."""


def _estimated_instances(num_tokens: int, cfg: InstanceConfig) -> float:
    return num_tokens * cfg.dupe_factor / max(1, cfg.max_num_tokens // 2)


def join_bucket_count(num_tokens: int, cfg: InstanceConfig, job: ShardJobConfig) -> int:
    """Groups of the random-next join (--join_buckets, or from the split's token count).

    Grouping does not change any instance, so the output does not depend on it.
    """
    if job.join_buckets:
        return job.join_buckets
    return max(MIN_BUCKETS, math.ceil(_estimated_instances(num_tokens, cfg)
                                      / INSTANCES_PER_JOIN_BUCKET))


def pack_bucket_count(num_tokens: int, cfg: InstanceConfig, job: ShardJobConfig) -> int:
    """Groups of instances packed and sorted together, from the split's token count.

    Depends on the corpus alone (not on workers), so the output does not either.
    """
    return max(MIN_BUCKETS, math.ceil(_estimated_instances(num_tokens, cfg)
                                      / job.instances_per_pack_bucket))


def key_bucket(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Bucket b holds keys in [b, b + 1) * 2**64 / num_buckets: bucket order is key order."""
    return ((keys >> np.uint64(32)) * np.uint64(num_buckets)) >> np.uint64(32)


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

    def __init__(self, cfg: InstanceConfig, job: ShardJobConfig, vocab_path: str,
                 flush_plans: int = 16_384):
        self.cfg, self.job, self.vocab_path, self.flush_plans = cfg, job, vocab_path, flush_plans
        self.instances = beam.metrics.Metrics.counter("make_shards", "instances")
        self.requests = beam.metrics.Metrics.counter("make_shards", "random_next_requests")

    def setup(self):
        from pipelines.tokenization import read_vocab
        self.vocab = Vocab.from_tokens(read_vocab(self.vocab_path))

    def start_bundle(self):
        self.pending: dict[tuple[str, int], list[InstancePlan]] = defaultdict(list)
        self.buffered = 0

    def process(self, doc: TokenizedDoc, counts):
        cfg, job = self.cfg, self.job
        idx = _Indexes.cached(self, counts)
        doc_index = idx.offsets[(doc.split, doc.file_index, doc.part)] + doc.local_index
        num_docs = idx.num_docs[doc.split]
        join_buckets = join_bucket_count(idx.num_tokens[doc.split], cfg, job)
        segments = doc.segments()
        if cfg.next_sentence:
            yield (doc.split, doc_index % join_buckets), to_bytes((doc_index, doc))
        for pass_index in range(cfg.dupe_factor):
            for plan in plan_document(segments, doc_index, num_docs, pass_index, cfg):
                source = doc_index if plan.random_doc_index is None else plan.random_doc_index
                self.pending[(doc.split, source % join_buckets)].append(plan)
                self.buffered += 1
        if self.buffered >= self.flush_plans:
            yield from self._flush(lambda v: v, idx)

    def finish_bundle(self):
        cache = getattr(self, "_indexes_cache", None)  # None: the bundle had no documents
        yield from self._flush(_windowed, cache and cache[1])

    def _flush(self, wrap, idx: _Indexes | None):
        if not self.cfg.next_sentence:
            for (split, _), plans in self.pending.items():
                instances = finalize_instances(plans, self.vocab, self.cfg)
                self.instances.inc(len(instances))
                buckets = pack_bucket_count(idx.num_tokens[split], self.cfg, self.job)
                yield from instance_outputs(split, instances, plans, buckets, self.cfg, wrap)
        else:
            for key, plans in self.pending.items():
                self.requests.inc(sum(p.random_doc_index is not None for p in plans))
                yield wrap((key, to_bytes(PlanBatch.from_plans(plans))))
        logger.debug("flushed %d instance plans", self.buffered)
        self.pending.clear()
        self.buffered = 0


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


def bucket_totals(parts: Iterable[LengthBatch], cfg: InstanceConfig, pack: bool
                 ) -> tuple[int, int, int, int]:
    """(rows, instances, tokens, masked) of one pack bucket, as `pack_rows` will lay it out."""
    parts = list(parts)

    def cat(name):
        return np.concatenate([getattr(p, name) for p in parts])
    lengths = cat("lengths")
    masked = sum(p.num_masked for p in parts)
    if not pack:
        return len(lengths), len(lengths), int(lengths.sum()), masked
    order = np.lexsort((cat("instance_index"), cat("pass_index"), cat("doc_index"), cat("keys")))
    rows = len(packing.pack_lengths(lengths[order], cfg.max_seq_length))
    return rows, len(lengths), int(lengths.sum()), masked


def instance_outputs(split: str, instances: list, plans: list[InstancePlan], buckets: int,
                     cfg: InstanceConfig, wrap=lambda v: v) -> Iterator[beam.pvalue.TaggedOutput]:
    """Columnar batches of instances per pack bucket ("instances"), and their `LengthBatch`es
    ("lengths"); `wrap` windows the values when emitted from finish_bundle."""
    for key, part in bucket_instances(split, instances, plans, buckets, cfg):
        yield beam.pvalue.TaggedOutput("instances", wrap((key, to_bytes(WireBatch.of(part)))))
        yield beam.pvalue.TaggedOutput("lengths", wrap((key, LengthBatch.of(part))))


def bucket_instances(split: str, instances: list, plans: list[InstancePlan], buckets: int,
                     cfg: InstanceConfig) -> Iterator[tuple[tuple[str, int], packing.InstanceBatch]]:
    """Columnar batches of instances, one per shuffle-key range (pack bucket)."""
    doc = [p.doc_index for p in plans]
    pas = [p.pass_index for p in plans]
    ins = [p.instance_index for p in plans]
    batch = packing.InstanceBatch.from_instances(
        instances, packing.shuffle_keys(cfg.random_seed, doc, pas, ins), doc, pas, ins)
    bucket = key_bucket(batch.keys, buckets)
    for b in np.unique(bucket).tolist():
        yield (split, b), batch.take(np.flatnonzero(bucket == b))


class FillRandomNextFn(beam.DoFn):
    """A join bucket (its documents, the plans keyed to it) -> finalized instances.

    Random-next plans draw B from the bucket's documents; actual-next plans have theirs.
    Outputs "instances" and "lengths" (`instance_outputs`).
    """

    def __init__(self, cfg: InstanceConfig, job: ShardJobConfig, vocab_path: str,
                 chunk: int = 16_384):
        self.cfg, self.job, self.vocab_path, self.chunk = cfg, job, vocab_path, chunk
        self.instances = beam.metrics.Metrics.counter("make_shards", "instances")

    def setup(self):
        from pipelines.tokenization import read_vocab
        self.vocab = Vocab.from_tokens(read_vocab(self.vocab_path))

    def process(self, element, counts):
        (split, _), grouped = element
        grouped = [from_bytes(v) for v in grouped]
        docs = {v[0]: v[1] for v in grouped if not isinstance(v, PlanBatch)}
        buckets = pack_bucket_count(_Indexes.cached(self, counts).num_tokens[split], self.cfg,
                                    self.job)
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
                    filled.append(fill_random_next(plan, segments_of(r), self.cfg))
                else:
                    filled.append(plan)
                plans.append(plan)
        for start in range(0, len(plans), self.chunk):
            instances = finalize_instances(filled[start:start + self.chunk], self.vocab, self.cfg)
            self.instances.inc(len(instances))
            yield from instance_outputs(split, instances, plans[start:start + self.chunk],
                                        buckets, self.cfg)


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

    def shard_stats(self, max_seq_length: int) -> shards.ShardStats:
        """The same numbers as `shards.row_stats` on the rows, from the columns at once."""
        b = self.batch
        labels = b.next_sentence_labels
        bins = np.minimum(b.lengths.astype(np.int64) * shards.HISTOGRAM_BINS
                          // (max_seq_length + 1), shards.HISTOGRAM_BINS - 1)
        return shards.ShardStats(
            num_rows=len(self.row_sizes), num_instances=len(b), num_tokens=int(b.lengths.sum()),
            num_masked=int(b.num_masked.sum()), num_random_next=int((labels == 1).sum()),
            num_nsp=int((labels >= 0).sum()),
            length_histogram=np.bincount(bins, minlength=shards.HISTOGRAM_BINS).tolist())

    def take_rows(self, rows: np.ndarray) -> RowGroup:
        first = np.concatenate([[0], np.cumsum(self.row_sizes)])[:-1]
        order = packing.index_ranges(first[rows], self.row_sizes[rows])
        pos = None if self.positions is None else self.positions[rows]
        return RowGroup(self.batch.take(order), self.row_sizes[rows], pos)


def pack_and_assign(key: tuple[str, int], parts: Iterable[WireBatch],
                    bucket_stats: dict, cfg: InstanceConfig, job: ShardJobConfig,
                    vocab_size: int) -> Iterator[tuple[tuple[str, int], ShardPart]]:
    """A pack bucket's instances -> its rows -> (split, shard) parts (`assign_to_shards`)."""
    split, bucket = key
    group = pack_rows(packing.InstanceBatch.concat([from_bytes(p).unpack() for p in parts]), cfg,
                      job.pack)
    if group.stats() != tuple(bucket_stats[key]):
        # The global ranks come from `bucket_totals` on the LengthBatches: a mismatch would
        # misplace rows silently, so it stops the job.
        raise RuntimeError(f"pack bucket {key}: rows {group.stats()} differ from the "
                           f"counted {tuple(bucket_stats[key])}")
    for shard_key, part in assign_to_shards(split, bucket, group, bucket_stats, cfg, job,
                                            vocab_size):
        yield shard_key, to_bytes(ShardPart(WireBatch.of(part.batch), part.row_sizes,
                                            part.positions))


def pack_rows(batch: packing.InstanceBatch, cfg: InstanceConfig, pack: bool) -> RowGroup:
    """Shuffle a bucket by key, then lay instances out as rows (packed or one per row)."""
    batch = batch.shuffled()
    if not pack:
        return RowGroup(batch, np.ones(len(batch), np.int64))
    order, sizes = packing.rows_order(packing.pack_lengths(batch.lengths, cfg.max_seq_length))
    return RowGroup(batch.take(order), sizes)


def assign_to_shards(split: str, bucket: int, group: RowGroup, bucket_stats: dict,
                     cfg: InstanceConfig, job: ShardJobConfig, vocab_size: int
                     ) -> Iterator[tuple[tuple[str, int], RowGroup]]:
    """Rows of one bucket -> (split, shard) parts, by global rank round robin."""
    mine = {b: s for (sp, b), s in bucket_stats.items() if sp == split}
    offset = sum(mine[b][0] for b in mine if b < bucket)
    num_shards = split_num_shards(mine.values(), job, vocab_size)
    shard, position = shards.assign_round_robin(offset + np.arange(len(group.row_sizes)),
                                                num_shards)
    for s in np.unique(shard).tolist():
        rows = np.flatnonzero(shard == s)
        part = group.take_rows(rows)
        yield (split, s), RowGroup(part.batch, part.row_sizes, position[rows])


def split_num_shards(bucket_stats: Iterable[tuple[int, int, int, int]], job: ShardJobConfig,
                     vocab_size: int) -> int:
    """Shards of a split from its (rows, instances, tokens, masked) per pack bucket."""
    totals = [sum(column) for column in zip(*bucket_stats)] or [0, 0, 0, 0]
    rows, instances, tokens, masked = totals
    est = shards.estimated_bytes(rows, instances, tokens, masked, vocab_size)
    return shards.choose_num_shards(rows, est, int(job.target_shard_mb * 2 ** 20), job.num_shards)


def write_group(output: str, split: str, index: int, group: RowGroup, cfg: InstanceConfig,
                job: ShardJobConfig, vocab_tokens: list[str]) -> shards.ShardInfo:
    stats = group.shard_stats(cfg.max_seq_length)
    if job.format == "jsonl":
        return shards.write_jsonl_shard(output, split, index,
                                        packing.to_rows(group.batch, group.row_sizes),
                                        vocab_tokens, cfg.max_seq_length, stats)
    blocks = packing.encode_blocks(group.batch, group.row_sizes, job.rows_per_block,
                                   len(vocab_tokens))
    return shards.write_tar(output, split, index, blocks, stats)


class WriteShardFn(beam.DoFn):
    """(split, shard index) and its row parts -> the written shard's ShardInfo (JSON)."""

    def __init__(self, output: str, cfg: InstanceConfig, job: ShardJobConfig, vocab_path: str):
        self.output, self.cfg, self.job, self.vocab_path = output, cfg, job, vocab_path
        self.written = beam.metrics.Metrics.counter("make_shards", "shards")
        self.rows = beam.metrics.Metrics.counter("make_shards", "rows")

    def setup(self):
        from pipelines.tokenization import read_vocab
        self.vocab_tokens = read_vocab(self.vocab_path)

    def process(self, element):
        (split, index), parts = element
        parts = [from_bytes(p) for p in parts]
        whole = RowGroup(packing.InstanceBatch.concat([p.wire.unpack() for p in parts]),
                         np.concatenate([p.row_sizes for p in parts]),
                         np.concatenate([p.positions for p in parts]))
        group = whole.take_rows(np.argsort(whole.positions, kind="stable"))
        info = write_group(self.output, split, index, group, self.cfg, self.job,
                           self.vocab_tokens)
        self.written.inc()
        self.rows.inc(info.stats.num_rows)
        logger.info("wrote %s: %d rows, %d bytes", info.file, info.stats.num_rows, info.bytes)
        yield info.to_json()


class CreateInstances(beam.PTransform):
    """Tokenized documents -> {"instances": ((split, pack bucket), InstanceBatch),
    "lengths": ((split, pack bucket), LengthBatch)}, random next drawn from all documents."""

    def __init__(self, cfg: InstanceConfig, job: ShardJobConfig, vocab_path: str):
        super().__init__()
        self.cfg, self.job, self.vocab_path = cfg, job, vocab_path

    def expand(self, docs):
        counts = (docs
                  | "CountKey" >> beam.Map(lambda d: ((d.split, d.file_index, d.part),
                                                      (1, len(d.tokens))))
                  | "CountPerFile" >> beam.CombinePerKey(_sum_pairs))
        counts_side = beam.pvalue.AsDict(counts)
        planned = docs | "Plan" >> beam.ParDo(
            PlanDocumentsFn(self.cfg, self.job, self.vocab_path), counts_side).with_outputs(
                "instances", "lengths", main="join")
        if not self.cfg.next_sentence:
            return {"instances": planned.instances, "lengths": planned.lengths}
        filled = (planned.join
                  | "JoinRandomNext" >> beam.GroupByKey()
                  | "FillRandomNext" >> beam.ParDo(
                      FillRandomNextFn(self.cfg, self.job, self.vocab_path),
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

    def __init__(self, output: str, cfg: InstanceConfig, job: ShardJobConfig, vocab_path: str,
                 vocab_size: int):
        super().__init__()
        self.output, self.cfg, self.job = output, cfg, job
        self.vocab_path, self.vocab_size = vocab_path, vocab_size

    def expand(self, created):
        cfg, job, vocab_size = self.cfg, self.job, self.vocab_size
        stats = beam.pvalue.AsDict(
            created["lengths"]
            | "GroupLengths" >> beam.GroupByKey()
            | "BucketStats" >> beam.MapTuple(
                lambda key, parts: (key, bucket_totals(parts, cfg, job.pack))))
        return (created["instances"]
                | "GroupByKeyRange" >> beam.GroupByKey()
                | "PackAndAssign" >> beam.FlatMap(
                    lambda kv, stats: pack_and_assign(kv[0], kv[1], stats, cfg, job, vocab_size),
                    stats)
                | "GroupByShard" >> beam.GroupByKey()
                | "Write" >> beam.ParDo(WriteShardFn(self.output, cfg, job, self.vocab_path)))


def build_scalable_pipeline(p, files: list[str], output: str, vocab_path: str,
                            cfg: InstanceConfig, job: ShardJobConfig, vocab_size: int):
    """Wire the scalable job into pipeline `p`; returns the PCollection of shard infos (JSON)."""
    read = (p
            # Largest parts first, each under its own key: the FnApiRunner deals a grouped
            # stage's keys out to its workers round robin in arrival order, so the work splits
            # evenly (Create's own reshuffle uses random keys).
            | "Files" >> beam.Create(list(enumerate(sorted(
                read_parts(files, job.read_part_kb * 1024), key=lambda u: -u.num_bytes))),
                reshuffle=False)
            | "SpreadParts" >> beam.GroupByKey()
            | "ReadDocuments" >> beam.ParDo(ReadDocumentsFn(
                vocab_path, job.do_lower_case, job.validation_fraction)).with_outputs(
                    DEAD, main="docs"))
    _ = (read[DEAD] | "DeadLetters" >> beam.io.WriteToText(
        storage.join(output, jobs.DEAD_LETTER_DIR, "make_shards"), file_name_suffix=".jsonl",
        num_shards=1, shard_name_template=""))
    return (read.docs
            | "CreateInstances" >> CreateInstances(cfg, job, vocab_path)
            | "WriteShards" >> WriteShards(output, cfg, job, vocab_path, vocab_size))


# ----------------------------------------------------------------------------------------------
# Reference mode
# ----------------------------------------------------------------------------------------------

def read_all_documents(files: list[str], tokenizer, validation_fraction: float
                       ) -> tuple[dict[str, list[list[np.ndarray]]], list[jobs.BadRecord], int]:
    """Every document of every file, in input order, split by doc_id hash; and bad records."""
    from tqdm import tqdm

    docs: dict[str, list] = {"train": [], "validation": []}
    bad: list[jobs.BadRecord] = []
    empty = 0
    for path in tqdm(files, desc="read", unit="file", file=sys.stderr):
        try:
            if is_parquet(path):
                with storage.open_read(path, "rb") as f:
                    table = corpus_parquet(f, path).read(columns=["doc_id", "sentences"])
                batches = [(table.column(0).to_pylist(), table.column(1).to_pylist())]
            else:
                with storage.open_read(path, "rb") as f:
                    lines_docs, file_bad = parse_reference_text(f.read(), path)
                bad += file_bad
                name = os.path.basename(path)
                batches = [([f"{name}:{i}" for i in range(len(lines_docs))], lines_docs)]
        except Exception as e:  # noqa: BLE001 - any unreadable file is a dead letter
            bad.append(jobs.BadRecord(path, "file", f"{type(e).__name__}: {e}"))
            continue
        for doc_ids, sentences in batches:
            for row, (doc_id, sents) in enumerate(zip(doc_ids, sentences)):
                if doc_id is None or sents is None:
                    bad.append(jobs.BadRecord(path, f"row {row}", "null doc_id or sentences"))
            pairs = [(d, s) for d, s in zip(doc_ids, sentences) if d is not None and s is not None]
            for (doc_id, _), (tokens, lengths) in zip(
                    pairs, tokenize_documents(tokenizer, [s for _, s in pairs])):
                if len(lengths) == 0:
                    empty += 1
                    continue
                docs[split_of(doc_id, validation_fraction)].append(
                    np.split(tokens, np.cumsum(lengths)[:-1]))
    return docs, bad, empty


def run_reference(files: list[str], output: str, vocab_path: str, cfg: InstanceConfig,
                  job: ShardJobConfig) -> tuple[list[shards.ShardInfo], dict]:
    """One process, one random stream: `create_instances_reference`, then the same writers."""
    from tqdm import tqdm

    from pipelines.tokenization import load_tokenizer, read_vocab

    vocab_tokens = read_vocab(vocab_path)
    vocab = Vocab.from_tokens(vocab_tokens)
    tokenizer = load_tokenizer(vocab_path, job.do_lower_case, split_special_tokens=True)
    docs, bad, empty = read_all_documents(files, tokenizer, job.validation_fraction)
    _write_dead_letters(output, bad)
    infos = []
    counters = {"documents": sum(len(d) for d in docs.values()), "empty_documents": empty,
                "bad_records": len(bad), "instances": 0,
                **{f"documents_{split}": len(docs[split]) for split in shards.SPLITS}}
    for split in shards.SPLITS:
        if not docs[split]:
            continue
        logger.info("%s: creating instances from %d documents (one random stream)", split,
                    len(docs[split]))
        instances = create_instances_reference(docs[split], vocab, cfg)
        counters["instances"] += len(instances)
        n = len(instances)
        batch = packing.InstanceBatch.from_instances(
            instances, np.arange(n, dtype=np.uint64), np.zeros(n), np.zeros(n), np.arange(n))
        if job.pack:
            order, sizes = packing.rows_order(packing.pack_lengths(batch.lengths,
                                                                   cfg.max_seq_length))
            group = RowGroup(batch.take(order), sizes)
        else:
            group = RowGroup(batch, np.ones(n, np.int64))
        # The reference order is already shuffled (its final rng.shuffle); like the reference
        # writer, deal it round robin over the output files.
        num_shards = split_num_shards([group.stats()], job, len(vocab_tokens))
        shard, _ = shards.assign_round_robin(np.arange(len(group.row_sizes)), num_shards)
        for s in tqdm(range(num_shards), desc=f"write {split}", unit="shard", file=sys.stderr):
            infos.append(write_group(output, split, s, group.take_rows(np.flatnonzero(shard == s)),
                                     cfg, job, vocab_tokens))
    return infos, counters


def _write_dead_letters(output: str, bad: list[jobs.BadRecord]) -> None:
    path = storage.join(output, jobs.DEAD_LETTER_DIR, "make_shards.jsonl")
    storage.atomic_write_text(path, "".join(b.to_json() + "\n" for b in bad))


# ----------------------------------------------------------------------------------------------
# Manifest and run()
# ----------------------------------------------------------------------------------------------

def build_manifest(infos: list[shards.ShardInfo], options: dict, vocab_path: str,
                   vocab_size: int, cfg: InstanceConfig, job: ShardJobConfig,
                   counters: dict) -> dict:
    infos = sorted(infos, key=lambda i: (shards.SPLITS.index(i.split), i.index))
    totals = shards.ShardStats()
    splits = {}
    for split in shards.SPLITS:
        mine = [i for i in infos if i.split == split]
        if not mine:
            continue
        s = shards.ShardStats()
        for i in mine:
            s.add(i.stats)
        totals.add(s)
        per = [i.stats.num_rows for i in mine]
        splits[split] = {"num_shards": len(mine), "num_rows": s.num_rows,
                         "num_instances": s.num_instances, "num_tokens": s.num_tokens,
                         "min_rows_per_shard": min(per), "max_rows_per_shard": max(per)}
    L = cfg.max_seq_length
    edges = [round(b * (L + 1) / shards.HISTOGRAM_BINS) for b in range(shards.HISTOGRAM_BINS + 1)]
    is_folder = (vocab_path.endswith("/") or not vocab_path.endswith(".txt")
                 if storage.is_remote(vocab_path) else os.path.isdir(vocab_path))
    vocab_file = storage.join(vocab_path.rstrip("/"), "vocab.txt") if is_folder else vocab_path
    return {
        "stage": "make_shards",
        "options": options,
        "config_hash": storage.config_hash(options),
        "vocab": {"path": vocab_file, "sha256": storage.sha256_file(vocab_file),
                  "vocab_size": vocab_size},
        "vocab_size": vocab_size,
        "max_seq_length": L,
        "max_predictions_per_seq": cfg.max_predictions_per_seq,
        "packed": job.pack,
        "nsp": cfg.next_sentence,
        "format": job.format,
        "mode": job.mode,
        "next_sentence_label": "1 = B is a random segment, 0 = B is the actual next, -1 = no NSP",
        "shards": [i.manifest_entry() for i in infos],
        "splits": splits,
        "totals": {
            "num_rows": totals.num_rows, "num_instances": totals.num_instances,
            "num_tokens": totals.num_tokens, "num_masked": totals.num_masked,
            "num_random_next": totals.num_random_next,
            "random_next_share": totals.num_random_next / totals.num_nsp if totals.num_nsp else 0.0,
            "padding_share": shards.padded_share(totals, L),
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


def _remove_stale(output: str, infos: list[shards.ShardInfo]) -> list[str]:
    if storage.is_remote(output):
        return []
    keep = {i.file for i in infos}
    stale = [n for n in os.listdir(output) if _SHARD_FILE.match(n) and n not in keep]
    for name in stale:
        os.unlink(os.path.join(output, name))
    return stale


def run(argv: list[str] | None = None) -> dict:
    """Make shards; returns the manifest written to `<output>/manifest.json`."""
    jobs.configure_logging()
    args, beam_options = jobs.parse_job_args(build_parser(), argv)
    cfg, job = configs_from_args(args)
    from pipelines.tokenization import read_vocab
    vocab_size = len(read_vocab(args.vocab))
    files = select_inputs(storage.expand_inputs(args.input))
    options = {"input": files, "vocab": args.vocab, "instance": asdict(cfg), "job": asdict(job)}
    logger.info("make_shards: %d input file(s) -> %s\n%s", len(files), args.output,
                "\n".join(f"  {k}: {v}" for k, v in {**asdict(cfg), **asdict(job)}.items()))
    storage.makedirs(args.output)
    storage.withdraw_manifest(args.output)  # a crash must not leave a complete-looking mix
    start = time.perf_counter()
    if job.mode == "reference":
        infos, counters = run_reference(files, args.output, args.vocab, cfg, job)
    else:
        infos, counters = _run_scalable(files, args, beam_options, cfg, job, vocab_size)
    stale = _remove_stale(args.output, infos)
    if stale:
        logger.info("removed %d shard(s) left from an earlier run", len(stale))
    counters["seconds"] = round(time.perf_counter() - start, 3)
    manifest = build_manifest(infos, options, args.vocab, vocab_size, cfg, job, counters)
    storage.write_manifest(args.output, manifest)
    t = manifest["totals"]
    logger.info("make_shards: %d instances in %d rows, %d shards, %.1f s (%.0f instances/s); "
                "random-next share %.3f, padding share %.3f", t["num_instances"], t["num_rows"],
                len(infos), counters["seconds"], t["num_instances"] / max(counters["seconds"], 1e-9),
                t["random_next_share"], t["padding_share"])
    return manifest


def _run_scalable(files, args, beam_options, cfg, job, vocab_size):
    infos_path = storage.join(args.output, _SHARD_INFOS)
    with beam.Pipeline(runner=jobs.local_runner(beam_options), options=beam_options) as p:
        infos = build_scalable_pipeline(p, files, args.output, args.vocab, cfg, job, vocab_size)
        _ = (infos | "CollectInfos" >> beam.combiners.ToList()
             | "SaveInfos" >> beam.Map(lambda lines: storage.atomic_write_text(
                 infos_path, "".join(line + "\n" for line in sorted(lines)))))
    result = p.result
    with storage.open_read(infos_path) as f:
        infos = [shards.ShardInfo.from_json(line) for line in f if line.strip()]
    if storage.is_remote(infos_path):
        beam.io.filesystems.FileSystems.delete([infos_path])
    else:
        os.unlink(infos_path)
    return infos, _beam_counters(result)


if __name__ == "__main__":
    # Run the module under its package name, so the classes Beam pickles for its workers are
    # `pipelines.make_shards.X`, importable there, not `__main__.X`.
    from pipelines import make_shards as _job  # noqa: PLW0406

    _job.run()
