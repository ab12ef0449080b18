"""Beam job: documents folders (extract_wikipedia, extract_books) -> the sentence-split corpus.

    beam run pipelines/build_corpus.py --input out/wiki,out/books --output out/corpus --text_output
    python pipelines/build_corpus.py --input out/wiki,out/books --output out/corpus \\
        --direct_num_workers=2 --direct_running_mode=multi_processing

Steps: read every documents Parquet file (row group by row group), remove exact duplicate
documents across all sources (the text of all passages after NFKC, case folding and whitespace
collapsing; the smallest doc_id is kept, the others counted and listed in
`<output>/duplicates/`), split each passage into sentences (`pipelines.corpus.sentences`), and write
`corpus-{i:05d}-of-{n:05d}.parquet` (pipelines.corpus.documents.CORPUS_SCHEMA), sorted by doc_id in each
shard. `--text_output` also writes `corpus-....txt` next to each shard in the reference text format
(one sentence per line, a blank line between documents, same order as the Parquet shard).

Bad records go to `<output>/dead_letter/` and are counted: a document with no sentence, and a
doc_id that two inputs use for different texts (the one from the smaller source_file is kept).

Quality filters: a source that declares them (`SourceConfig.quality`, pipelines/corpus/quality.py:
length bounds, language identification, Gopher's repetition and symbol rules; none by default)
has its documents checked after the exact deduplication; each one dropped is counted per rule
(`<source>/dropped_<rule>` in the ledger, `quality_dropped` in all) and listed with the rule and
its figure in `<output>/quality/` (written only when some source declares filters).

The mixture: after deduplication and sentence splitting, each document is kept, dropped or
repeated by its source's weight (`--sources`, pipelines/documents/source.py: a sampling factor,
0.5 keeps about half the documents by a hash of (source, doc_id), 3 keeps each three times,
the copies named `<doc_id>#r1`, `#r2`, written to their original's shard); a source not
listed has weight 1. Applied after the exact deduplication because copies are duplicates by
design: before it, they would be removed again. The manifest's `ledger` has a row per source
(the documents' `source`): what its extraction job read (records, input bytes, bad records,
from that folder's manifest), then here documents, text bytes (UTF-8 of the passages),
sentences and words (whitespace-separated) in and out, what each step dropped (duplicates,
doc_id conflicts, near-duplicates, each quality rule as `dropped_<rule>`, no sentence, sampled
out), repeats added, and its share of the final corpus (of documents and of text bytes); with
the source's weight and licence label.

`manifest.json` is written last: config + hash, counts, the ledger, inputs (with each input
folder's config_hash), outputs with sha256.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import apache_beam as beam
from apache_beam import pvalue

from common import errors, storage
from common.settings import check
from pipelines import jobs, parquet_io, waves
from pipelines.corpus import near_duplicates as near
from pipelines.corpus import sentences
from pipelines.corpus.documents import CORPUS_SCHEMA, DOCUMENT_SCHEMA
from pipelines.corpus.filter_quality import FilterQuality
from pipelines.corpus.near_duplicates import NearDuplicateConfig
from pipelines.corpus.quality import QualityConfig
from pipelines.corpus.remove_near_duplicates import NearDuplicatePairs, removed_line
from pipelines.disk_full import disk_full_reported
from pipelines.documents import source as mixture
from pipelines.documents.source import SourceConfig

NAMESPACE = "build_corpus"
PREFIX = "corpus"
DUPLICATES_FILE = "duplicates/duplicates-00000-of-00001.jsonl"
NEAR_DUPLICATES_FILE = "near_duplicates/near_duplicates-00000-of-00001.jsonl"
"""The near-duplicates removed, each with the doc_id it duplicates (written when on)."""
QUALITY_FILE = "quality/dropped-00000-of-00001.jsonl"
"""The documents the quality filters dropped (written when a source declares filters)."""
LOCAL_WAVE_MB = 8.0
"""Input MB per wave on Beam's local runner when `wave_mb` is unset (documents Parquet): a
wave's pipeline peaks near 0.5 GB with one worker (benchmarks/bench_local_memory.py)."""
COUNTERS = ("input_files", "documents_read", "duplicates_removed", "doc_id_conflicts",
            "documents_without_sentences", "near_duplicates_removed", "quality_dropped",
            "bad_records", "documents", "passages", "sentences")
LEDGER_NAMESPACE = "build_corpus.sources"
"""Per-source counters, named `<source>/<counter>`."""
LEDGER_COUNTS = ("documents_in", "bytes_in", "duplicates_removed", "doc_id_conflicts",
                 "near_duplicates_removed", "without_sentences", "sentences_in", "words_in",
                 "sampled_out", "repeats_added", "documents_out", "bytes_out", "sentences_out",
                 "words_out")
log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CorpusOutput:
    """The output settings of a job that writes a corpus (build_corpus, decontaminate)."""
    num_shards: int = 0
    """Parquet files to write; 0 = one per 256 MB of input Parquet."""
    text_output: bool = False
    """Also write each shard in the reference text format (one sentence per line, a blank
    line between documents) next to it (.txt)."""

    def __post_init__(self):
        check(self.num_shards >= 0, "num_shards",
              f"must be >= 0 (0 = automatic), got {self.num_shards}")


@dataclass(frozen=True)
class BuildCorpusConfig(CorpusOutput):
    """Resolved options of one build_corpus run (saved in the manifest, hashed);
    `num_shards` and `text_output` are `CorpusOutput`'s."""
    input: str
    """Documents folders or Parquet files (local or gs://...), separated by commas."""
    output: str
    """The corpus folder."""
    sources: tuple[SourceConfig, ...] = ()
    """The mixture: each source's weight and licence, by name (a JSON list of sources, as
    extract_documents takes them); a source not listed has weight 1."""
    near_duplicates: NearDuplicateConfig | None = None
    """Near-duplicate removal after the exact one (MinHash + LSH, pipelines/corpus/
    near_duplicates.py: shingle_size, num_perm, bands, threshold, seed); None: off."""
    wave_mb: float | None = None
    """Input MB per wave (Parquet counted uncompressed): above it, the job runs as waves of
    bounded pipelines (documents scattered by content, then by doc_id, to scratch files;
    pipelines/waves.py), so a local run's memory follows the wave, not the corpus; one corpus
    shard per id wave. The output is that of one pipeline with as many shards. 0 = one
    pipeline. Unset: `LOCAL_WAVE_MB` on Beam's local runner, 0 on a distributed runner
    (Dataflow, Flink, Spark)."""

    def __post_init__(self):
        super().__post_init__()
        check(self.wave_mb is None or self.wave_mb >= 0, "wave_mb",
              f"must be >= 0 (0 = one pipeline), got {self.wave_mb}")
        names = [s.name for s in self.sources]
        check(len(set(names)) == len(names), "sources", f"source names repeat: {names}")

    def weights(self) -> dict[str, float]:
        return {s.name: s.weight for s in self.sources}

    def quality(self) -> dict[str, QualityConfig]:
        """The quality filters of the sources that declare them, by source name."""
        return {s.name: s.quality for s in self.sources if s.quality is not None}


def _count(source: str, name: str, value: int = 1) -> None:
    beam.metrics.Metrics.counter(LEDGER_NAMESPACE, f"{source}/{name}").inc(value)


def text_bytes(passages: Iterable[str]) -> int:
    return sum(len(p.encode("utf-8")) for p in passages)


def words(sentences_: Iterable[str]) -> int:
    return sum(len(s.split()) for s in sentences_)


def weighted(row: dict, weight: float) -> list[dict]:
    """A corpus row's copies under its source's weight (pipelines/documents/source.py)."""
    return [{**row, "doc_id": doc_id}
            for doc_id in mixture.copy_ids(row["source"], row["doc_id"], weight)]


def corpus_shard_key(doc_id: str) -> str:
    """What a row's corpus shard is the hash of: its original's doc_id, so a weighted source's
    copies are made and written by the id wave of their original (waves write whole shards)."""
    return mixture.original_id(doc_id)


def normalized_text(passages: Iterable[str]) -> str:
    """What "the same document" means: NFKC, case folded, every whitespace run one space."""
    text = unicodedata.normalize("NFKC", " ".join(passages)).casefold()
    return " ".join(text.split())


def dedupe_key(record: dict) -> str:
    return hashlib.sha256(normalized_text(record["passages"]).encode("utf-8")).hexdigest()


def _order(record: dict) -> tuple:
    # A total order: GroupByKey hands records over in any order, and two inputs may give the
    # same doc_id and source_file (one documents folder passed twice, re-extracted differently).
    return record["doc_id"], record["source_file"], record["title"], list(record["passages"])


def keep_first(records: Iterable[dict]) -> tuple[dict, list[dict]]:
    """(the record kept: smallest doc_id, then source_file, title, passages; the others)."""
    ordered = sorted(records, key=_order)
    return ordered[0], ordered[1:]


def corpus_record(record: dict) -> dict:
    """A documents row -> a corpus row: the same fields plus the passages' sentences."""
    return {"doc_id": record["doc_id"], "source": record["source"],
            "source_file": record["source_file"], "title": record["title"],
            "passages": list(record["passages"]),
            "sentences": sentences.split_passages(record["passages"])}


class KeepFirstFn(beam.DoFn):
    """(key, records with that key) -> the record `keep_first` keeps; each other one bumps the
    `COUNTERS` (the first also per source) and is tagged as `set_aside` makes it."""

    COUNTERS: tuple[str, ...] = ()

    def __init__(self):
        self.counters = [beam.metrics.Metrics.counter(NAMESPACE, name) for name in self.COUNTERS]

    def process(self, element):
        key, records = element
        kept, others = keep_first(records)
        for other in others:
            for counter in self.counters:
                counter.inc()
            _count(other["source"], self.COUNTERS[0])
            yield self.set_aside(key, other, kept)
        yield kept

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        raise NotImplementedError


class DedupeFn(KeepFirstFn):
    """(content hash, records with that content) -> the kept record; duplicates tagged."""

    COUNTERS = ("duplicates_removed",)

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        return pvalue.TaggedOutput("duplicates", _duplicate_line(other, kept))


def _duplicate_line(removed: dict, kept: dict) -> str:
    return json.dumps({"removed": removed["doc_id"], "removed_file": removed["source_file"],
                       "kept": kept["doc_id"], "kept_file": kept["source_file"]}, ensure_ascii=False)


class UniqueIdFn(KeepFirstFn):
    """(doc_id, records) -> one record; a doc_id used for two different texts is a dead letter."""

    COUNTERS = ("doc_id_conflicts", "bad_records")

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        reason = f"doc_id also used by {kept['source_file']} for a different text (kept that one)"
        return pvalue.TaggedOutput("dead_letter",
                                   errors.BadRecord(other["source_file"], key, reason).to_json())


class SplitSentencesFn(beam.DoFn):
    """documents row -> corpus row; a document with no sentence is a dead letter."""

    def __init__(self):
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def process(self, record: dict):
        row = corpus_record(record)
        if not row["sentences"]:
            _count(record["source"], "without_sentences")
            self.counters["documents_without_sentences"].inc()
            self.counters["bad_records"].inc()
            yield pvalue.TaggedOutput("dead_letter", errors.BadRecord(
                record["source_file"], record["doc_id"], "document has no sentence").to_json())
            return
        _count(row["source"], "sentences_in", len(row["sentences"]))
        _count(row["source"], "words_in", words(row["sentences"]))
        yield row


class MixFn(beam.DoFn):
    """corpus row -> its copies under its source's weight (none: sampled out)."""

    def __init__(self, weights: dict[str, float]):
        self.weights = weights
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def process(self, row: dict):
        kept = weighted(row, self.weights.get(row["source"], 1.0))
        source, size = row["source"], text_bytes(row["passages"])
        if not kept:
            _count(source, "sampled_out")
        _count(source, "repeats_added", max(len(kept) - 1, 0))
        for name, value in (("documents_out", 1), ("bytes_out", size),
                            ("sentences_out", len(row["sentences"])),
                            ("words_out", words(row["sentences"]))):
            _count(source, name, value * len(kept))
        self.counters["documents"].inc(len(kept))
        self.counters["passages"].inc(len(row["passages"]) * len(kept))
        self.counters["sentences"].inc(len(row["sentences"]) * len(kept))
        yield from kept


class NearDuplicateFn(beam.DoFn):
    """(doc_id, {"rows", "near"}) -> (doc_id, rows), or a "near_duplicates" line naming the
    smallest doc_id it duplicates."""

    def __init__(self):
        self.removed = beam.metrics.Metrics.counter(NAMESPACE, "near_duplicates_removed")

    def process(self, element):
        doc_id, joined = element
        rows, kept = list(joined["rows"]), sorted(joined["near"])
        if not rows:
            return
        if not kept:
            yield doc_id, rows
            return
        for row in rows:
            self.removed.inc()
            _count(row["source"], "near_duplicates_removed")
            yield pvalue.TaggedOutput("near_duplicates", removed_line(row, kept[0]))


class Dedupe(beam.PTransform):
    """Documents rows -> {"kept": one row per text (`keep_first`), "duplicates": JSON lines}.
    Groups by content: every copy of a text must reach it (one pipeline, or one content wave)."""

    def expand(self, documents):
        deduped = (documents
                   | "ByContent" >> beam.Map(lambda r: (dedupe_key(r), r))
                   | "GroupContent" >> beam.GroupByKey()
                   | "Dedupe" >> beam.ParDo(DedupeFn()).with_outputs("duplicates", main="kept"))
        return {"kept": deduped.kept, "duplicates": deduped.duplicates}


class Finish(beam.PTransform):
    """Rows of distinct texts -> {"corpus": unique doc_ids that pass their source's quality
    filters (`quality`, by source; none when absent), split into sentences, repeated or
    sampled by their source's weight (`weights`, by source; 1 when absent), "dead_letter" and
    "quality_dropped": JSON lines}. Groups by doc_id: every row of a doc_id must reach it (one
    pipeline, or one id wave)."""

    def __init__(self, weights: dict[str, float] | None = None,
                 quality: dict[str, QualityConfig] | None = None):
        super().__init__()
        self.weights, self.quality = weights or {}, quality or {}

    def expand(self, inputs):
        """`inputs`: the rows, or {"kept": rows, "near": `NearDuplicatePairs`' pairs}."""
        kept, pairs = (inputs["kept"], inputs["near"]) if isinstance(inputs, dict) else (inputs,
                                                                                         None)
        by_id = kept | "ById" >> beam.Map(lambda r: (r["doc_id"], r))
        if pairs is None:
            grouped, removed = by_id | "GroupId" >> beam.GroupByKey(), None
        else:
            joined = ({"rows": by_id, "near": pairs} | "JoinNear" >> beam.CoGroupByKey()
                      | "Near" >> beam.ParDo(NearDuplicateFn()).with_outputs(
                          "near_duplicates", main="grouped"))
            grouped, removed = joined.grouped, joined.near_duplicates
        unique = grouped | "UniqueId" >> beam.ParDo(UniqueIdFn()).with_outputs(
            "dead_letter", main="unique")
        filtered = unique.unique | "Quality" >> FilterQuality(self.quality)
        split = (filtered["kept"]
                 | "Sentences" >> beam.ParDo(SplitSentencesFn()).with_outputs("dead_letter",
                                                                                main="corpus"))
        mixed = split.corpus | "Mix" >> beam.ParDo(MixFn(self.weights))
        dead = (unique.dead_letter, split.dead_letter) | "DeadLetters" >> beam.Flatten()
        return {"corpus": mixed, "dead_letter": dead, "quality_dropped": filtered["dropped"],
                "near_duplicates": removed}


class BuildCorpus(beam.PTransform):
    """Composite: documents rows -> `Dedupe` -> `Finish`: {"corpus": rows, "duplicates" and
    "dead_letter", "quality_dropped": JSON lines}."""

    def __init__(self, weights: dict[str, float] | None = None,
                 quality: dict[str, QualityConfig] | None = None,
                 near_duplicates: NearDuplicateConfig | None = None):
        super().__init__()
        self.weights, self.quality = weights or {}, quality or {}
        self.near_duplicates = near_duplicates

    def expand(self, documents):
        deduped = documents | "Dedupe" >> Dedupe()
        inputs = deduped["kept"]
        if self.near_duplicates is not None:
            inputs = {"kept": inputs, "near": deduped["kept"] | "NearDuplicates"
                      >> NearDuplicatePairs(self.near_duplicates)}
        finished = inputs | "Finish" >> Finish(self.weights, self.quality)
        return {**finished, "duplicates": deduped["duplicates"]}


def build_parser() -> argparse.ArgumentParser:
    """The job's flags: one per `BuildCorpusConfig` field, help from its docstring."""
    return jobs.config_parser(__doc__.splitlines()[0], BuildCorpusConfig)


def select_inputs(pattern: str) -> tuple[list[storage.InputFile], dict[str, str]]:
    """(documents Parquet files with their listed sizes, {input folder: its manifest's
    config_hash}).

    A folder given as input must hold a manifest.json (its stage finished); raises naming it."""
    folders: dict[str, str] = {}
    for part in (p for p in pattern.split(",") if p):
        if (not storage.is_remote(part) and os.path.isdir(part)) or part.endswith("/"):
            manifest = storage.read_manifest(part)
            if manifest is None:
                raise FileNotFoundError(f"--input {part!r} has no manifest.json: the job that "
                                        "writes it did not finish")
            folders[part] = manifest.get("config_hash", "")
    files = sorted((f for f in storage.expand_input_files(pattern) if f.path.endswith(".parquet")),
                   key=lambda f: f.path)
    if not files:
        raise FileNotFoundError(f"--input {pattern!r} holds no Parquet files")
    return files, folders


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: flags -> `BuildCorpusConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    config = jobs.config_from_args(args, BuildCorpusConfig(input=args.input, output=args.output))
    return run(config, beam_args)


def run(config: BuildCorpusConfig, beam_args: Sequence[str] = ()) -> dict:
    """Build the corpus of `config.input`'s documents into `config.output`; returns the
    manifest."""
    jobs.configure_logging()
    options = jobs.beam_pipeline_options(beam_args)
    config = resolve_wave_mb(config, options)
    listed, folders = select_inputs(config.input)
    files = [f.path for f in listed]
    sizes = {f.path: f.size_bytes for f in listed}  # from the listing: no lookup per file
    total = sum(sizes.values())
    num_waves, num_shards = waves.shard_plan(
        sum(f.size_bytes for f in parquet_io.with_uncompressed_sizes(listed)) if config.wave_mb
        else total, config.wave_mb, config.num_shards, parquet_io.auto_num_shards(total))
    text_column = "sentences" if config.text_output else None
    log.info("build_corpus: %d input files, %d shard(s), %d wave(s)", len(files), num_shards,
             num_waves)
    log.debug("build_corpus config: %s", dataclasses.asdict(config))
    jobs.warn_if_too_large_for_local_runner(log, NAMESPACE, total // num_waves, options)
    dry_run = jobs.is_dry_run(options)
    if not dry_run:  # a dry run leaves an earlier output as it is
        storage.makedirs(config.output)
        parquet_io.clear_previous_output(config.output, PREFIX, [
            duplicates_path(config.output), quality_path(config.output),
            near_duplicates_path(config.output)])
        waves.clear_scratch(config.output)
    if dry_run:
        with _pipeline(options) as pipeline:
            _one_pipeline(pipeline, config, files, num_shards, text_column)
        return jobs.dry_run_summary(NAMESPACE, pipeline)
    if num_waves == 1:
        results = [_run_one(config, files, num_shards, text_column, options)]
    else:
        results = _run_waves(config, files, num_waves, num_shards, text_column, options)
    counts = _summed(c for c, _ in results)
    by_source: dict[str, dict[str, int]] = {}
    for _, sources in results:
        for source, values in sources.items():
            by_source[source] = _summed([by_source.get(source, {}), values])
    ledger = build_ledger(config.sources, extraction_counts(folders), by_source)
    return finish(config, files, folders, sizes, num_shards, text_column, counts, ledger,
                  num_waves)


def resolve_wave_mb(config: BuildCorpusConfig, options) -> BuildCorpusConfig:
    return waves.resolve_wave_mb(config, options, LOCAL_WAVE_MB)


def _summed(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for d in dicts:
        for name, value in d.items():
            total[name] = total.get(name, 0) + value
    return total


class _Read(NamedTuple):
    rows: beam.PCollection
    dead_letter: beam.PCollection


def _read(pipeline, files: list[str]) -> _Read:
    """The documents rows of `files`, counted in per source, and the dead letters."""
    read = (pipeline
            | "Files" >> beam.Create(files)
            | "Spread" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(parquet_io.ReadRowsFn(
                NAMESPACE, DOCUMENT_SCHEMA.names, "documents_read")).with_outputs(
                    "dead_letter", main="rows"))
    return _Read(read.rows | "CountIn" >> beam.Map(_counted_in), read.dead_letter)


def _counted_in(row: dict) -> dict:
    _count(row["source"], "documents_in")
    _count(row["source"], "bytes_in", text_bytes(row["passages"]))
    return row


def _pipeline(options):
    return beam.Pipeline(runner=jobs.local_runner(options), options=options)


Counts = tuple[dict[str, int], dict[str, dict[str, int]]]
"""A finished pipeline's counters: the job's, and the ledger's by source."""


def _run(output: str, options, build: Callable[[beam.Pipeline], None]) -> Counts:
    """Run the pipeline `build` wires; its counters (`Counts`)."""
    with disk_full_reported(output), _pipeline(options) as pipeline:
        build(pipeline)
    return (parquet_io.query_counters(pipeline.result, NAMESPACE, COUNTERS),
            parquet_io.query_counters_by_source(pipeline.result, LEDGER_NAMESPACE, LEDGER_COUNTS))


def _one_pipeline(pipeline, config: BuildCorpusConfig, files: list[str], num_shards: int,
                  text_column: str | None) -> None:
    """The whole job wired into one pipeline."""
    read = _read(pipeline, files)
    built = read.rows | "Build" >> BuildCorpus(config.weights(), config.quality(),
                                                config.near_duplicates)
    dead_letters = (read.dead_letter, built["dead_letter"]) | "AllDeadLetters" >> beam.Flatten()
    _ = built["corpus"] | "WriteCorpus" >> parquet_io.WriteParquetShards(
        config.output, PREFIX, num_shards, CORPUS_SCHEMA, text_column, corpus_shard_key)
    _ = dead_letters | "WriteDeadLetters" >> parquet_io.WriteSortedLines(
        parquet_io.dead_letter_path(config.output))
    _ = built["duplicates"] | "WriteDuplicates" >> parquet_io.WriteSortedLines(
        duplicates_path(config.output))
    if config.quality():
        _ = built["quality_dropped"] | "WriteQualityDropped" >> parquet_io.WriteSortedLines(
            quality_path(config.output))
    if config.near_duplicates is not None:
        _ = built["near_duplicates"] | "WriteNearDuplicates" >> parquet_io.WriteSortedLines(
            near_duplicates_path(config.output))


def _run_one(config: BuildCorpusConfig, files: list[str], num_shards: int,
             text_column: str | None, options) -> Counts:
    return _run(config.output, options, lambda p: _one_pipeline(p, config, files, num_shards,
                                                                text_column))


def _scatter(config: BuildCorpusConfig, files: list[str], num_waves: int, options) -> Counts:
    """Read every document and scatter it to its content partition."""
    scratch = waves.scratch_folder(config.output)

    def build(pipeline):
        read = _read(pipeline, files)
        _ = read.rows | "Scatter" >> waves.Scatter(scratch, "content", num_waves, dedupe_key)
        _ = read.dead_letter | "WriteDeadLetters" >> parquet_io.WriteSortedLines(
            os.path.join(scratch, "lines", "dead_letter-read.jsonl"))
    return _run(config.output, options, build)


def _content_wave(config: BuildCorpusConfig, wave: int, num_waves: int, num_shards: int,
                  options) -> Counts:
    """One content partition: `Dedupe`, the kept rows scattered to their corpus shard."""
    scratch = waves.scratch_folder(config.output)

    def build(pipeline):
        deduped = (pipeline | "Read" >> waves.ReadScratch(scratch, "content", wave)
                   | "Dedupe" >> Dedupe())
        _ = deduped["kept"] | "Scatter" >> waves.Scatter(
            scratch, "ids", num_shards, lambda r: corpus_shard_key(r["doc_id"]))
        _ = deduped["duplicates"] | "WriteDuplicates" >> parquet_io.WriteSortedLines(
            os.path.join(scratch, "lines", f"duplicates-{wave:05d}.jsonl"))
        if config.near_duplicates is not None:
            _ = (deduped["kept"]
                 | "Bands" >> beam.FlatMap(near.band_records, config.near_duplicates)
                 | "AsRecords" >> beam.MapTuple(lambda key, v: {"key": key, "id": v[0],
                                                               "sig": v[1]})
                 | "ScatterBands" >> waves.Scatter(scratch, "bands", num_waves,
                                                   lambda r: r["key"]))
    return _run(config.output, options, build)


def _band_wave(config: BuildCorpusConfig, wave: int, num_shards: int, options) -> Counts:
    """One band partition: its buckets' confirmed pairs, scattered by the removed doc_id (to
    the id wave of its corpus shard)."""
    scratch = waves.scratch_folder(config.output)

    def build(pipeline):
        _ = (pipeline | "Read" >> waves.ReadScratch(scratch, "bands", wave)
             | "Keyed" >> beam.Map(lambda r: (r["key"], (r["id"], r["sig"])))
             | "GroupBand" >> beam.GroupByKey()
             | "Confirm" >> beam.FlatMap(lambda kv, c: near.bucket_pairs(kv[1], c),
                                         config.near_duplicates)
             | "AsRecords" >> beam.MapTuple(lambda removed, kept: {"removed": removed,
                                                                   "kept": kept})
             | "Scatter" >> waves.Scatter(scratch, "near", num_shards,
                                          lambda r: corpus_shard_key(r["removed"])))
    return _run(config.output, options, build)


def _id_wave(config: BuildCorpusConfig, shard: int, num_shards: int, text_column: str | None,
             options) -> Counts:
    """One id partition: `Finish`, written as its corpus shard."""
    scratch = waves.scratch_folder(config.output)

    def build(pipeline):
        kept = pipeline | "Read" >> waves.ReadScratch(scratch, "ids", shard)
        if config.near_duplicates is not None:
            kept = {"kept": kept, "near": (
                pipeline | "ReadNear" >> waves.ReadScratch(scratch, "near", shard)
                | "Pairs" >> beam.Map(lambda r: (r["removed"], r["kept"])))}
        finished = kept | "Finish" >> Finish(config.weights(), config.quality())
        _ = finished["corpus"] | "WriteCorpus" >> parquet_io.WriteParquetShards(
            config.output, PREFIX, num_shards, CORPUS_SCHEMA, text_column, corpus_shard_key)
        _ = finished["dead_letter"] | "WriteDeadLetters" >> parquet_io.WriteSortedLines(
            os.path.join(scratch, "lines", f"dead_letter-{shard:05d}.jsonl"))
        _ = finished["quality_dropped"] | "WriteQualityDropped" >> parquet_io.WriteSortedLines(
            os.path.join(scratch, "lines", f"quality-{shard:05d}.jsonl"))
        if config.near_duplicates is not None:
            _ = finished["near_duplicates"] | "WriteNear" >> parquet_io.WriteSortedLines(
                os.path.join(scratch, "lines", f"near-{shard:05d}.jsonl"))
    return _run(config.output, options, build)


def _run_waves(config: BuildCorpusConfig, files: list[str], num_waves: int, num_shards: int,
               text_column: str | None, options) -> list[Counts]:
    """The job as bounded pipelines (pipelines/waves.py), each in a process of its own: scatter
    the documents by content; per content wave, `Dedupe` and scatter the kept rows by doc_id
    (by the corpus shard they go to); per id wave, `Finish` and write that shard. The dead
    letters and duplicates of every pipeline are merged, sorted, at the end."""
    from common.logs import progress

    ran = [waves.run_isolated(_scatter, config, files, num_waves, options)]
    for wave in progress(range(num_waves), desc="build_corpus content waves", unit="wave"):
        ran.append(waves.run_isolated(_content_wave, config, wave, num_waves, num_shards,
                                      options))
    if config.near_duplicates is not None:
        for wave in progress(range(num_waves), desc="build_corpus band waves", unit="wave"):
            ran.append(waves.run_isolated(_band_wave, config, wave, num_shards, options))
    for shard in progress(range(num_shards), desc="build_corpus id waves", unit="wave"):
        ran.append(waves.run_isolated(_id_wave, config, shard, num_shards, text_column, options))
    lines = os.path.join(waves.scratch_folder(config.output), "lines")
    names = sorted(os.listdir(lines)) if os.path.isdir(lines) else []
    for prefix, target in (("dead_letter-", parquet_io.dead_letter_path(config.output)),
                           ("duplicates-", duplicates_path(config.output)),
                           ("quality-", quality_path(config.output)),
                           ("near-", near_duplicates_path(config.output))):
        parts = [os.path.join(lines, n) for n in names if n.startswith(prefix)]
        if parts:
            waves.merge_sorted_files(parts, target)
    waves.clear_scratch(config.output)
    return ran


def extraction_counts(folders: dict[str, str]) -> dict[str, dict]:
    """What each source's extraction job read, from the input folders' manifests: records read,
    bad records, input bytes (and licence where declared), by source name."""
    found: dict[str, dict] = {}
    for folder in folders:
        manifest = storage.read_manifest(folder) or {}
        counts = manifest.get("counts", {})
        inputs = sum(i.get("bytes", i.get("size_bytes", 0)) for i in manifest.get("inputs", []))
        if manifest.get("stage") == "extract_documents":
            for name, entry in manifest.get("sources", {}).items():
                found[name] = {k: entry[k] for k in ("records_read", "bad_records",
                                                     "input_bytes", "licence")}
        elif manifest.get("stage") == "extract_books":
            found["books"] = {"records_read": counts.get("files_read", 0),
                              "bad_records": counts.get("bad_records", 0), "input_bytes": inputs}
        elif manifest.get("stage") == "extract_wikipedia":
            found["wikipedia"] = {"records_read": counts.get("pages_read", 0),
                                  "bad_records": counts.get("bad_records", 0),
                                  "input_bytes": inputs}
    return found


def build_ledger(sources: Sequence[SourceConfig], extracted: dict[str, dict],
                 counts: dict[str, dict[str, int]]) -> dict[str, dict]:
    """The mixture ledger: per source, its declaration, what its extraction read, what this job
    took in, dropped, repeated and wrote, and its share of the corpus."""
    declared = {s.name: s for s in sources}
    total_docs = sum(c["documents_out"] for c in counts.values()) or 1
    total_bytes = sum(c["bytes_out"] for c in counts.values()) or 1
    ledger = {}
    for name in sorted(counts.keys() | declared.keys()):
        row = counts.get(name, dict.fromkeys(LEDGER_COUNTS, 0))
        source = declared.get(name)
        read = extracted.get(name, {})
        ledger[name] = {
            "weight": source.weight if source else 1.0,
            "licence": (source.licence if source else "") or read.get("licence", ""),
            "records_read": read.get("records_read"), "bad_records": read.get("bad_records"),
            "input_bytes": read.get("input_bytes"),
            **row,
            "share_documents": round(row["documents_out"] / total_docs, 4),
            "share_bytes": round(row["bytes_out"] / total_bytes, 4)}
    return ledger


def duplicates_path(output: str) -> str:
    return storage.join(output, *DUPLICATES_FILE.split("/"))


def near_duplicates_path(output: str) -> str:
    return storage.join(output, *NEAR_DUPLICATES_FILE.split("/"))


def quality_path(output: str) -> str:
    return storage.join(output, *QUALITY_FILE.split("/"))


def finish(config: BuildCorpusConfig, files: list[str], folders: dict[str, str],
           sizes: dict[str, int], num_shards: int, text_column: str | None,
           counts: dict[str, int], ledger: dict[str, dict] | None = None,
           num_waves: int = 1) -> dict:
    """After the pipeline: complete the shard set, check counts against rows, write manifest."""
    shards = parquet_io.finish_shards(config.output, PREFIX, num_shards, CORPUS_SCHEMA, text_column)
    dead_letters = parquet_io.finish_dead_letters(config.output, counts["bad_records"] > 0)
    duplicates = parquet_io.finish_lines_file(duplicates_path(config.output),
                                              counts["duplicates_removed"] > 0)
    dropped = ([parquet_io.finish_lines_file(quality_path(config.output),
                                             counts["quality_dropped"] > 0)]
               if config.quality() else [])
    if config.near_duplicates is not None:
        dropped.append(parquet_io.finish_lines_file(near_duplicates_path(config.output),
                                                    counts["near_duplicates_removed"] > 0))
    parquet_io.check_documents_written(config.output, config.input, shards, counts,
                                       dead_letters)
    manifest = {
        **jobs.manifest_head(NAMESPACE, config, parquet_io.content_hash(
            {**dataclasses.asdict(config), "inputs": sorted(folders.values())})),
        "num_shards": num_shards,
        "waves": num_waves,
        "counts": counts,
        "ledger": ledger or {},
        "inputs": [{"path": f, "bytes": sizes[f]} for f in files],
        "input_config_hashes": folders,
        "outputs": parquet_io.outputs_entry(config.output,
                                            [*shards, dead_letters, duplicates, *dropped]),
    }
    return jobs.publish_manifest(log, NAMESPACE, manifest, counts, dead_letters)


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main(NAMESPACE, main))
