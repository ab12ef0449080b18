"""Beam job: a corpus folder + its contamination audit -> the corpus without those passages.

    python pipelines/decontaminate.py --input out/corpus --audit out/audit --output out/corpus-clean

Removes every passage the audit (pipelines/audit_contamination.py) lists in
`contaminated_passages.jsonl` (doc_id, passage index) from the corpus it audited, and splits the
remaining passages into sentences again (`pipelines.corpus.sentences.split_passages`, the same
function build_corpus uses, so an untouched document keeps its sentences exactly). A document
left with no passage or no sentence is dropped and counted. The output has build_corpus's
layout and schema (`corpus-{i:05d}-of-{n:05d}.parquet`, pipelines.corpus.documents.CORPUS_SCHEMA,
sorted by doc_id; `--text_output` adds the reference text format), so train_vocab and
make_shards read it as they read any corpus.

The audit must be of this corpus: its manifest's input config_hash must be the corpus's
(passage indexes mean nothing in another corpus); the job refuses another, naming both.

The list of passages is read by each worker in `setup()` (it holds only what overlaps: small
next to the corpus); the corpus streams through, grouped only by output shard as build_corpus
writes it. `manifest.json` is written last: config, its hash (with the corpus's and the audit's
config_hash: the output is addressed by its content), counts (documents_read, documents,
documents_dropped, passages_read, passages_removed, passages, sentences), outputs with sha256.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import apache_beam as beam

from common import storage
from common.settings import check
from pipelines import jobs, parquet_io
from pipelines.audit_contamination import PASSAGES_FILE
from pipelines.build_corpus import CorpusOutput, select_inputs
from pipelines.corpus import sentences
from pipelines.corpus.documents import CORPUS_SCHEMA
from pipelines.disk_full import disk_full_reported

NAMESPACE = "decontaminate"
PREFIX = "corpus"
COUNTERS = ("input_files", "documents_read", "documents", "documents_dropped", "passages_read",
            "passages_removed", "passages", "sentences", "bad_records")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DecontaminateConfig(CorpusOutput):
    """Resolved options of one decontaminate run (saved in the manifest, hashed);
    `num_shards` and `text_output` are `build_corpus.CorpusOutput`'s."""
    input: str
    """The corpus folder the audit read."""
    output: str
    """The decontaminated corpus folder."""
    audit: str = ""
    """The audit_contamination output folder of that corpus."""


def without_passages(row: dict, removed: frozenset[int]) -> dict | None:
    """A corpus row without the passages at the indexes `removed`, its sentences split again;
    None when no passage or no sentence is left."""
    kept = [p for i, p in enumerate(row["passages"]) if i not in removed]
    split = sentences.split_passages(kept)
    if not kept or not split:
        return None
    return {**row, "passages": kept, "sentences": split}


def read_removals(audit: str) -> dict[str, frozenset[int]]:
    """{doc_id: passage indexes to remove} from an audit folder's passage list."""
    removals: dict[str, set[int]] = {}
    with storage.open_read(storage.join(audit, PASSAGES_FILE)) as f:
        for line in f:
            if line.strip():
                entry = json.loads(line)
                removals.setdefault(entry["doc_id"], set()).add(int(entry["passage"]))
    return {doc_id: frozenset(numbers) for doc_id, numbers in removals.items()}


class RemovePassagesFn(beam.DoFn):
    """Corpus row -> the row without its listed passages (none when nothing is left)."""

    def __init__(self, audit: str):
        self.audit = audit
        self.removals: dict[str, frozenset[int]] = {}
        self.counters = {name: beam.metrics.Metrics.counter(NAMESPACE, name) for name in COUNTERS}

    def setup(self):
        self.removals = read_removals(self.audit)

    def process(self, row: dict):
        removed = self.removals.get(row["doc_id"], frozenset())
        self.counters["documents_read"].inc()
        self.counters["passages_read"].inc(len(row["passages"]))
        self.counters["passages_removed"].inc(sum(i in removed for i in range(len(row["passages"]))))
        kept = without_passages(row, removed) if removed else row
        if kept is None:
            self.counters["documents_dropped"].inc()
            return
        self.counters["documents"].inc()
        self.counters["passages"].inc(len(kept["passages"]))
        self.counters["sentences"].inc(len(kept["sentences"]))
        yield kept


def build_parser() -> argparse.ArgumentParser:
    """The job's flags: one per `DecontaminateConfig` field, help from its docstring."""
    return jobs.config_parser(__doc__.splitlines()[0], DecontaminateConfig)


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: flags -> `DecontaminateConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    config = jobs.config_from_args(args, DecontaminateConfig(input=args.input,
                                                             output=args.output))
    return run(config, beam_args)


def check_audit(config: DecontaminateConfig, folders: dict[str, str]) -> str:
    """The audit's config_hash, once its manifest shows it audited `config.input`."""
    check(bool(config.audit), "audit", "is required: the audit_contamination folder of --input")
    manifest = storage.read_manifest(config.audit)
    if manifest is None or manifest.get("stage") != "audit_contamination":
        raise FileNotFoundError(f"--audit {config.audit!r} has no audit_contamination "
                                "manifest.json: the audit did not finish")
    audited = sorted(manifest.get("input_config_hashes", {}).values())
    if audited != sorted(folders.values()):
        raise ValueError(f"--audit {config.audit} audited the corpus with config_hash "
                         f"{','.join(audited)}, not --input {config.input} "
                         f"({','.join(sorted(folders.values()))}): run the audit on this corpus")
    return manifest["config_hash"]


def run(config: DecontaminateConfig, beam_args: Sequence[str] = ()) -> dict:
    """Write `config.input` without the passages `config.audit` lists into `config.output`;
    returns the manifest (a summary on a dry run)."""
    jobs.configure_logging()
    options = jobs.beam_pipeline_options(beam_args)
    listed, folders = select_inputs(config.input)
    audit_hash = check_audit(config, folders)
    files = [f.path for f in listed]
    num_shards = config.num_shards or parquet_io.auto_num_shards(sum(f.size_bytes for f in listed))
    text_column = "sentences" if config.text_output else None
    dry_run = jobs.is_dry_run(options)
    if not dry_run:  # a dry run leaves an earlier output as it is
        storage.makedirs(config.output)
        parquet_io.clear_previous_output(config.output, PREFIX)
    with disk_full_reported(config.output):
        pipeline = _run_pipeline(config, files, num_shards, text_column, options)
    if dry_run:
        return jobs.dry_run_summary(NAMESPACE, pipeline)
    counts = parquet_io.query_counters(pipeline.result, NAMESPACE, COUNTERS)
    return finish(config, folders, audit_hash, num_shards, text_column, counts)


def _run_pipeline(config: DecontaminateConfig, files: list[str], num_shards: int,
                  text_column: str | None, options):
    with beam.Pipeline(runner=jobs.local_runner(options), options=options) as pipeline:
        read = (pipeline
                | "Files" >> beam.Create(files)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.ParDo(parquet_io.ReadRowsFn(NAMESPACE, list(CORPUS_SCHEMA.names)))
                .with_outputs("dead_letter", main="rows"))
        clean = read.rows | "Remove" >> beam.ParDo(RemovePassagesFn(config.audit))
        _ = clean | "WriteCorpus" >> parquet_io.WriteParquetShards(
            config.output, PREFIX, num_shards, CORPUS_SCHEMA, text_column)
        _ = read.dead_letter | "WriteDeadLetters" >> parquet_io.WriteSortedLines(
            parquet_io.dead_letter_path(config.output))
    return pipeline


def finish(config: DecontaminateConfig, folders: dict[str, str], audit_hash: str,
           num_shards: int, text_column: str | None, counts: dict[str, int]) -> dict:
    """After the pipeline: complete the shard set, check counts against rows, write manifest."""
    shards = parquet_io.finish_shards(config.output, PREFIX, num_shards, CORPUS_SCHEMA,
                                      text_column)
    dead_letters = parquet_io.finish_dead_letters(config.output, counts["bad_records"] > 0)
    parquet_io.check_documents_written(config.output, config.input, shards, counts,
                                       dead_letters)
    manifest = jobs.stage_manifest(
        NAMESPACE, config, parquet_io.content_hash(
            {**dataclasses.asdict(config), "inputs": sorted(folders.values()),
             "audit": audit_hash}),
        counts=counts, inputs=None,
        outputs=parquet_io.output_records(config.output, [*shards, dead_letters]),
        num_shards=num_shards, input_config_hashes=folders, audit_config_hash=audit_hash)
    return jobs.publish_manifest(log, NAMESPACE, manifest, counts, dead_letters)


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main(NAMESPACE, main))
