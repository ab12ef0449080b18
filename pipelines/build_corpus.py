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

Where the pieces live: this file holds the config, the flags, the waves and `run()`; the data
work is `pipelines/corpus/build.py` (`Dedupe`, `Finish`, `BuildCorpus` over pure functions) and
the ledger `pipelines/corpus/ledger.py`.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import apache_beam as beam

from common import storage
from common.settings import check
from pipelines import jobs, parquet_io, waves
from pipelines.corpus import near_duplicates as near
from pipelines.corpus.build import (
    COUNTERS,
    LEDGER_COUNTS,
    LEDGER_NAMESPACE,
    NAMESPACE,
    BuildCorpus,
    Dedupe,
    Finish,
    corpus_shard_key,
    count_in_ledger,
    dedupe_key,
    text_bytes,
)
from pipelines.corpus.documents import CORPUS_SCHEMA, DOCUMENT_SCHEMA
from pipelines.corpus.ledger import build_ledger, extraction_counts
from pipelines.corpus.near_duplicates import NearDuplicateConfig
from pipelines.corpus.quality import QualityConfig
from pipelines.disk_full import disk_full_reported
from pipelines.documents.source import SourceConfig

PREFIX = "corpus"
DUPLICATES_FILE = "duplicates/duplicates-00000-of-00001.jsonl"
NEAR_DUPLICATES_FILE = "near_duplicates/near_duplicates-00000-of-00001.jsonl"
"""The near-duplicates removed, each with the doc_id it duplicates (written when on)."""
QUALITY_FILE = "quality/dropped-00000-of-00001.jsonl"
"""The documents the quality filters dropped (written when a source declares filters)."""
LOCAL_WAVE_MB = 8.0
"""Input MB per wave on Beam's local runner when `wave_mb` is unset (documents Parquet): a
wave's pipeline peaks near 0.5 GB with one worker (benchmarks/bench_local_memory.py)."""
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
    count_in_ledger(row["source"], "documents_in")
    count_in_ledger(row["source"], "bytes_in", text_bytes(row["passages"]))
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
    manifest = jobs.stage_manifest(
        NAMESPACE, config, parquet_io.content_hash(
            {**dataclasses.asdict(config), "inputs": sorted(folders.values())}),
        counts=counts, inputs=[{"path": f, "bytes": sizes[f]} for f in files],
        outputs=parquet_io.output_records(config.output,
                                          [*shards, dead_letters, duplicates, *dropped]),
        num_shards=num_shards, waves=num_waves, ledger=ledger or {},
        input_config_hashes=folders)
    return jobs.publish_manifest(log, NAMESPACE, manifest, counts, dead_letters)


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main(NAMESPACE, main))
