"""Beam job: MediaWiki pages-articles dumps -> documents of clean passages (Parquet).

    beam run pipelines/extract_wikipedia.py --input 'dumps/enwiki-*.xml.bz2' --output out/wiki \\
        [--split_bytes 67108864] [--runner DataflowRunner ...]

Each input file is cut into splits (byte ranges of .xml, groups of bz2 streams of a multistream
.bz2; see pipelines/wikipedia/dump.py). One worker reads a split, keeps the namespace-0 articles that
are not redirects or disambiguation pages, extracts their passages (pipelines/wikipedia/wikitext.py) and
streams them to `documents-{index:05d}-of-{count:05d}.parquet`, one file per split, rows in dump
order: the split plan depends only on the input files and the config, so a re-run writes the same
bytes, whatever the runner or number of workers. Files are written under a temporary name and
renamed. Pages that cannot be read go to `dead_letter/`; `manifest.json` (config, hash, counts,
inputs, outputs with sha256) is written last. A run that keeps no article at all (e.g. its input
is not a MediaWiki dump) writes no manifest and fails naming the input and its dead letters.
A full disk ends the job with one line naming the file being written and the space left (the
space needed is not known before the pages are extracted) and no manifest; a run removes on
start the temporaries a killed run of this job left (`parquet_io.clear_previous_output`).
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import apache_beam as beam
from apache_beam.metrics import Metrics

from common import storage
from common.errors import DEAD_LETTER_DIR, BadRecord
from common.manifest import Manifest, ShardRecord
from common.settings import check
from pipelines import jobs, parquet_io
from pipelines.corpus.documents import DOCUMENT_SCHEMA, Document
from pipelines.disk_full import disk_full_reported
from pipelines.jobs import configure_logging, local_runner, nothing_produced, warn_dead_letters
from pipelines.wikipedia.dump import DumpSplit, Page, is_index_file, iter_pages, plan_splits
from pipelines.wikipedia.wikitext import Counter, extract_passages, is_disambiguation, is_redirect

STAGE = "extract_wikipedia"
OUTPUT_VERSION = 2
"""Bumped when the same dump and options give other records (ids, fields, the wikitext rules).
In the manifest, and in the flow's stage hash, so a cached output of older code is not
reused."""
METRICS_NAMESPACE = STAGE
PREFIX = "documents"
COUNT_NAMES = (
    "pages_read", "articles_kept", "skipped_redirect", "skipped_disambiguation",
    "skipped_namespace", "skipped_empty", "bad_records", "passages",
    "passages_residue_dropped", "templates_removed", "templates_unclosed", "links_unclosed",
    "page_bytes", "pages_with_invalid_utf8", "invalid_utf8_bytes_replaced",
)
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class WikipediaConfig:
    """How the dumps are cut into work and read."""
    split_bytes: int = 64 << 20
    """Input bytes per work item (bz2: whole streams; 0: one per bz2 stream)."""
    max_page_bytes: int = 16 << 20
    """Pages with larger XML are bad records (MediaWiki caps wikitext at 2 MiB)."""
    row_group_docs: int = 1000
    """Documents per Parquet row group (bounds a worker's memory)."""

    def __post_init__(self):
        check(self.split_bytes >= 0, "split_bytes", f"must be >= 0, got {self.split_bytes}")
        check(self.max_page_bytes >= 1024, "max_page_bytes",
              f"must be >= 1024, got {self.max_page_bytes}")
        check(self.row_group_docs >= 1, "row_group_docs",
              f"must be >= 1, got {self.row_group_docs}")


@dataclass(frozen=True, kw_only=True)
class ExtractWikipediaConfig(WikipediaConfig):
    """One extract_wikipedia run: the settings (`WikipediaConfig`, the flow's section) and
    where it reads and writes. The manifest records the settings and the dump files read."""
    input: str
    """MediaWiki dump(s): a file, glob or folder (local or gs://...); several separated by
    commas."""
    output: str
    """The documents folder."""


def tiny() -> WikipediaConfig:
    """Tiny splits, so the sample dump exercises the per-stream/per-range split logic."""
    return WikipediaConfig(split_bytes=0, row_group_docs=4)


# ---------------------------------------------------------------------------------------------
# Pure functions

def page_document(page: Page, source_file: str, counter: Counter) -> Document | None:
    """The document of an article page, or None (counted by reason) for any other page."""
    counter("pages_read", 1)
    counter("page_bytes", page.source_bytes)
    if page.invalid_bytes:
        counter("pages_with_invalid_utf8", 1)
        counter("invalid_utf8_bytes_replaced", page.invalid_bytes)
    if page.namespace != 0:
        counter("skipped_namespace", 1)
        return None
    if page.redirect or is_redirect(page.text):
        counter("skipped_redirect", 1)
        return None
    if is_disambiguation(page.title, page.text):
        counter("skipped_disambiguation", 1)
        return None
    passages = extract_passages(page.text, counter)
    if not passages:
        counter("skipped_empty", 1)
        return None
    counter("articles_kept", 1)
    counter("passages", len(passages))
    return Document(doc_id=f"wiki/{page.page_id}", source="wikipedia", source_file=source_file,
                    title=page.title, passages=tuple(passages))


def read_page(page: Page, source_file: str, counter: Counter) -> Document | BadRecord | None:
    """`page_document`, with a page the cleaner fails on set aside instead of failing the job."""
    try:
        return page_document(page, source_file, counter)
    except Exception as error:  # noqa: BLE001 - any failure on one page is that page's fault
        return BadRecord(source_file, f"page {page.page_id}",
                         f"extraction failed: {type(error).__name__}: {error} "
                         f"(title {page.title!r})")


@dataclass(frozen=True)
class SplitResult:
    """What one split produced: its output file and counts, and the records set aside."""
    index: int
    output: str  # file name inside the output folder
    sha256: str
    size_bytes: int
    num_documents: int
    counts: dict[str, int] = field(default_factory=dict)
    bad_records: tuple[BadRecord, ...] = ()


def extract_split(index: int, split: DumpSplit, num_splits: int, output_dir: str,
                  config: WikipediaConfig) -> SplitResult:
    """Read one split and write its documents file (atomically); returns what it did."""
    counts: collections.Counter[str] = collections.Counter()
    bad: list[BadRecord] = []

    def counter(name: str, value: int = 1) -> None:
        counts[name] += value

    name = parquet_io.shard_name(PREFIX, index, num_splits)
    path = storage.join(output_dir, name)
    started = time.monotonic()
    with storage.atomic_open(path, "wb") as f:
        writer = parquet_io.StreamingShardWriter(f, DOCUMENT_SCHEMA, config.row_group_docs)
        for page in iter_pages(split, config.max_page_bytes):
            item = read_page(page, split.path, counter) if isinstance(page, Page) else page
            if isinstance(item, BadRecord):
                LOG.warning("bad record in %s, %s: %s", item.file, item.record, item.reason)
                bad.append(item)
                counter("bad_records", 1)
            elif item is not None:
                writer.write(item.to_record())
            if isinstance(page, Page) and counts["pages_read"] % 10000 == 0:
                _log_progress(index, num_splits, counts, started)
        writer.close()
    _log_progress(index, num_splits, counts, started)
    return SplitResult(index=index, output=name, sha256=storage.sha256_file(path),
                       size_bytes=storage.file_size(path), num_documents=writer.num_rows,
                       counts=dict(counts), bad_records=tuple(bad))


def _log_progress(index: int, num_splits: int, counts: collections.Counter, started: float) -> None:
    seconds = max(time.monotonic() - started, 1e-9)
    LOG.info("split %d/%d: %d pages, %d articles, %.1f MB XML (%.1f MB/s, %.0f pages/s)",
             index + 1, num_splits, counts["pages_read"], counts["articles_kept"],
             counts["page_bytes"] / 1e6, counts["page_bytes"] / 1e6 / seconds,
             counts["pages_read"] / seconds)


def summarise(results: Sequence[SplitResult], resolved_config: dict,
              inputs: Sequence[tuple[str, int]]) -> Manifest:
    """The manifest: resolved config and its hash, totals, inputs, outputs."""
    results = sorted(results, key=lambda r: r.index)
    counts = {name: sum(r.counts.get(name, 0) for r in results) for name in COUNT_NAMES}
    return Manifest(
        stage=STAGE, output_version=OUTPUT_VERSION, config=resolved_config,
        config_hash=storage.config_hash(resolved_config), counts=counts,
        inputs=[{"path": path, "size_bytes": size} for path, size in inputs],
        outputs=tuple(ShardRecord(r.output, r.sha256, r.size_bytes,
                                  num_documents=r.num_documents) for r in results),
        sections={"dead_letter": f"{DEAD_LETTER_DIR}/{parquet_io.DEAD_LETTER_FILE}"})


def dead_letter_lines(results: Sequence[SplitResult]) -> str:
    records = [bad for r in sorted(results, key=lambda r: r.index) for bad in r.bad_records]
    return "".join(record.to_json() + "\n" for record in records)


# ---------------------------------------------------------------------------------------------
# Beam wiring

class ExtractDoFn(beam.DoFn):
    """Wires `extract_split` into Beam and mirrors its counts as Beam counters."""

    def __init__(self, output_dir: str, num_splits: int, config: WikipediaConfig):
        self.output_dir, self.num_splits, self.config = output_dir, num_splits, config

    def process(self, element: tuple[int, DumpSplit]) -> Iterator[SplitResult]:
        index, split = element
        result = extract_split(index, split, self.num_splits, self.output_dir, self.config)
        for name, value in result.counts.items():
            Metrics.counter(METRICS_NAMESPACE, name).inc(value)
        yield result


def _finalise(results: list[SplitResult], output_dir: str, resolved_config: dict,
              inputs: list[tuple[str, int]]) -> None:
    # Dead letters in split order, then file order: already deterministic, so not re-sorted.
    storage.atomic_write_text(parquet_io.dead_letter_path(output_dir), dead_letter_lines(results))
    manifest = summarise(results, resolved_config, inputs)
    if manifest.counts["articles_kept"] == 0:
        return  # nothing to mark complete: run() fails with the counts
    manifest.write(output_dir)  # last: marks the output complete


def build_parser() -> argparse.ArgumentParser:
    """The job's flags: one per `WikipediaConfig` field, help from its docstring."""
    return jobs.config_parser("Extract clean text passages from MediaWiki pages-articles XML "
                              "dumps (.xml, .xml.bz2, multistream .bz2) into Parquet documents.",
                              WikipediaConfig)


def dump_files(files: list[storage.InputFile]) -> list[storage.InputFile]:
    """The dumps among `files`: a multistream index (`...-multistream-index.txt.bz2`, or a
    partitioned dump's `...-multistream-index1.txt-p1p41242.bz2`; a folder --input holds them
    beside the dumps, as Wikimedia publishes them) is how a dump is read, not a dump."""
    return [f for f in files if not is_index_file(f.path)]


def select_dumps(pattern: str) -> list[storage.InputFile]:
    """The dump files of --input, with sizes from its listing. Raises FileNotFoundError when it
    names only multistream index files."""
    files = storage.expand_input_files(pattern)
    dumps = dump_files(files)
    if not dumps:
        raise FileNotFoundError(f"--input {pattern!r} holds only multistream index files "
                                f"({', '.join(f.name for f in files[:3])}...), no dump")
    if len(dumps) < len(files):
        LOG.info("%d multistream index file(s) are read with their dumps, not as dumps",
                 len(files) - len(dumps))
    return dumps


def _indexed_splits(inputs: list[tuple[str, int]],
                    config: WikipediaConfig) -> list[tuple[int, DumpSplit]]:
    from common.logs import progress

    # Finding the streams of a bz2 file without an index reads it once: show progress.
    with progress(total=sum(size for _, size in inputs), unit="B", unit_scale=True,
              desc="planning splits") as bar:
        splits = [s for path, size in inputs
                  for s in plan_splits(path, config.split_bytes, on_bytes=bar.update, size=size)]
    return list(enumerate(splits))


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: flags -> `ExtractWikipediaConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    base = ExtractWikipediaConfig(input=args.input, output=args.output)
    return run(jobs.config_from_args(args, base), beam_args)


def run(config: ExtractWikipediaConfig, beam_args: Sequence[str] = ()) -> dict:
    """Extract the dumps at `config.input` (a file, glob or folder) into `config.output`;
    returns the manifest written to `<output>/manifest.json`."""
    configure_logging()
    options = jobs.beam_pipeline_options(beam_args)
    input, output = config.input, config.output
    dumps = select_dumps(input)
    files = [f.path for f in dumps]
    inputs = [(f.path, f.size_bytes) for f in dumps]  # sizes from the listing: no stat per file
    # The output folder is where, not what: it stays out of the config (and its hash).
    settings = jobs.settings_of(config, WikipediaConfig)
    resolved = {"input": files, **dataclasses.asdict(settings)}
    LOG.debug("%s config: %s -> %s", STAGE, json.dumps(resolved, sort_keys=True), output)

    dry_run = jobs.is_dry_run(options)
    if not dry_run:  # a dry run leaves an earlier output as it is
        storage.makedirs(output)
        # A previous run (maybe with another split plan) must leave no shard this run does not
        # write.
        parquet_io.clear_previous_output(output, PREFIX)

    splits = _indexed_splits(inputs, settings)
    LOG.info("%d input files -> %d splits", len(files), len(splits))
    output_dir, num_splits = output, len(splits)

    with (disk_full_reported(output),
          beam.Pipeline(runner=local_runner(options), options=options) as pipeline):
        _ = (
            pipeline
            | "Splits" >> beam.Create(splits)
            | "Spread" >> beam.Reshuffle()
            | "Extract" >> beam.ParDo(ExtractDoFn(output_dir, num_splits, settings))
            | "Collect" >> beam.combiners.ToList()
            | "Finalise" >> beam.Map(_finalise, output_dir, resolved, inputs)
        )
    if dry_run:
        return jobs.dry_run_summary(STAGE, pipeline)
    totals = parquet_io.query_counters(pipeline.result, METRICS_NAMESPACE, COUNT_NAMES)
    LOG.debug("Beam metrics: %s", json.dumps(totals, sort_keys=True))  # the counts say them
    dead_letters = parquet_io.dead_letter_path(output)
    manifest = storage.read_manifest(output)
    if manifest is None:
        raise nothing_produced(f"documents ({totals['pages_read']} pages read, "
                               f"{totals['skipped_redirect']} redirects, "
                               f"{totals['skipped_empty']} empty)", input,
                               totals["bad_records"], dead_letters)
    LOG.info("counts: %s", json.dumps(manifest["counts"], sort_keys=True))
    warn_dead_letters(LOG, STAGE, manifest["counts"]["bad_records"], dead_letters)
    return manifest


if __name__ == "__main__":
    # Run the module under its package name, so the classes Beam pickles for its workers are
    # `pipelines.extract_wikipedia.X`, importable there, not `__main__.X`.
    import sys

    from pipelines import extract_wikipedia as _job  # noqa: PLW0406

    sys.exit(jobs.main(STAGE, _job.main))
