"""Beam job: a user's own text (JSONL, CSV/TSV, Parquet, plain text, a `datasets` folder) ->
documents.

    beam run pipelines/extract_documents.py --input data/sample/jsonl --kind jsonl \\
        --name poems --id_field id --title_field title --output out/poems_documents
    python pipelines/extract_documents.py --input 'notes/*.txt' --kind text \\
        --split blank_line --name notes --output out/notes --licence "CC BY 4.0"
    python pipelines/extract_documents.py --input corpus.txt --kind text --split line \\
        --name lines --output out/lines

One source per command line (its fields are pipelines.documents.source.SourceConfig's flags,
`--input` its path; a `--config FILE` holds the same fields); `run` takes several and writes
them into one documents folder. Each kind's reader is in pipelines/documents/readers.py: a
folder gives its kind's files (jsonl: .jsonl/.json/.ndjson, csv, tsv/.tab, parquet,
hf_datasets: the .arrow files of a `save_to_disk` folder, read with pyarrow; text: every file
but the other kinds'), subfolders too; a file named directly is read whatever its name. Every
record becomes one document (`doc_id` "<source name>/<id field>", or "<source name>/<file
below the input folder>:line<N>" / ":row<N>" without an id field; `source` the source's name;
passages: the text's blocks between blank lines, whitespace collapsed; a text source with
`--split line` makes one document of each non-empty line). The source's weight is
applied later, by build_corpus, after deduplication (pipelines/documents/source.py).

Bad records go to `<output>/dead_letter/` naming the file and the line or row, and are counted
per source and reason (manifest `sources.<name>.bad`): invalid JSON, a line that is no JSON
object, a missing or non-string text field, undecodable bytes (not UTF-8), empty text, an
unreadable file. A source whose every record is bad fails the job with one line naming the
source, and no manifest is written.

Output: `documents-{i:05d}-of-{n:05d}.parquet` (pipelines.corpus.documents.DOCUMENT_SCHEMA, so
build_corpus reads it as it reads the wikipedia and books jobs' output), dead letters, and
`manifest.json` written last (config + hash, counts, per-source counts with licence, inputs,
skipped files, outputs with sha256).
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import apache_beam as beam
from apache_beam import pvalue

from common import errors, settings, storage
from pipelines import jobs, parquet_io, waves
from pipelines.corpus.documents import DOCUMENT_SCHEMA
from pipelines.documents import readers
from pipelines.documents.source import SourceConfig

NAMESPACE = "extract_documents"
OUTPUT_VERSION = 1
"""Changes when the same input and options give other records (ids, fields, text rules)."""
PREFIX = "documents"
SOURCE_COUNTS = ("records_read", "bad_records", "documents")
"""Per-source counters, in manifest order (plus `bad_<reason code>`)."""
log = logging.getLogger(__name__)

Count = Callable[[str, str], None]
"""(source name, counter name) -> bump that counter by one."""


@dataclass(frozen=True)
class ExtractDocumentsConfig(waves.ShardedOutput):
    """Resolved options of one extract_documents run (saved in the manifest, hashed);
    `num_shards` and `wave_mb` are `waves.ShardedOutput`'s."""
    sources: tuple[SourceConfig, ...]
    """The sources to read (generic kinds: text, jsonl, parquet, csv, tsv, hf_datasets)."""
    output: str
    """The documents folder."""

    def __post_init__(self):
        super().__post_init__()
        settings.check(bool(self.sources), "sources", "no source given")
        names = [s.name for s in self.sources]
        settings.check(len(set(names)) == len(names), "sources",
                       f"source names must be unique, got {names}")
        for source in self.sources:
            settings.check(source.generic, "kind", f"source {source.name!r}: kind "
                           f"{source.kind} has its own job (pipelines/extract_{source.kind}.py)")


# ---------------------------------------------------------------- reading one file

def read_file(source: SourceConfig, file: storage.InputFile, count: Count
              ) -> Iterator[dict | errors.BadRecord]:
    """The documents of one input file, and a BadRecord per record that cannot be one."""
    read = 0
    try:
        with storage.open_read(file.path, "rb") as stream:
            for record in readers.READERS[source.kind](stream, file.name, source):
                read += 1
                count(source.name, "records_read")
                row = readers.document(source, file.path, file.name, record) \
                    if isinstance(record, readers.Raw) else record
                if isinstance(row, readers.Bad):
                    yield _bad(source, file, row, count)
                else:
                    count(source.name, "documents")
                    yield row
    except (OSError, ValueError, csv.Error) as e:  # pyarrow's errors are ValueErrors/OSErrors
        count(source.name, "records_read")
        where = "file" if read == 0 else f"records after {read}"
        yield _bad(source, file, readers.Bad(where, "unreadable", f"unreadable: {e}"), count)


def _bad(source: SourceConfig, file: storage.InputFile, bad: readers.Bad, count: Count
         ) -> errors.BadRecord:
    count(source.name, "bad_records")
    count(source.name, f"bad_{bad.code}")
    return errors.BadRecord(file.path, bad.location, bad.reason)


class ReadFileFn(beam.DoFn):
    """Wires `read_file`: (source index, InputFile) -> documents, plus tagged dead letters."""

    def __init__(self, sources: tuple[SourceConfig, ...]):
        self.sources = sources

    def process(self, element):
        index, file = element
        for row in read_file(self.sources[index], file, _bump):
            if isinstance(row, errors.BadRecord):
                yield pvalue.TaggedOutput("dead_letter", row.to_json())
            else:
                yield row


def _bump(source: str, name: str) -> None:
    beam.metrics.Metrics.counter(NAMESPACE, f"{source}/{name}").inc()


# ---------------------------------------------------------------- inputs

@dataclass(frozen=True)
class SourceFiles:
    """A source's input files, and the files of its folders that are not of its kind."""
    files: list[storage.InputFile]
    skipped: list[str]


def select_inputs(source: SourceConfig) -> SourceFiles:
    """The source's files, sorted; a folder's files of other kinds are skipped (listed). Raises
    FileNotFoundError naming the source when none is left."""
    files, skipped = [], []
    for part in (p for p in source.path.split(",") if p.strip()):
        found = storage.expand_input_files(part)
        named = len(found) == 1 and found[0].path == part  # a file named directly: taken
        for f in found:
            (files if named or readers.takes_file(source.kind, f.name) else skipped).append(f)
    files = sorted({f.path: f for f in files}.values(), key=lambda f: f.path)
    if not files:
        raise FileNotFoundError(f"source {source.name!r}: {source.path!r} holds no "
                                f"{source.kind} files ({len(skipped)} other file(s) skipped)")
    return SourceFiles(files, sorted(f.path for f in skipped))


# ---------------------------------------------------------------- the job

def build_parser() -> argparse.ArgumentParser:
    """The job's flags: `--input`, the fields of one source (`SourceConfig`, help from its
    docstring; the weight is build_corpus's), `--num_shards`, `--config`, `--set`."""
    parser = jobs.job_parser(__doc__.splitlines()[0])
    group = jobs.config_group(parser, SourceConfig, skip=("path", "weight"))
    group.add_argument("--num_shards", default=None,
                       help=settings.field_docs(ExtractDocumentsConfig)["num_shards"])
    group.add_argument("--wave_mb", default=None,
                       help=settings.field_docs(ExtractDocumentsConfig)["wave_mb"])
    group.add_argument("--config", metavar="FILE",
                       help="the source's fields (YAML or JSON: field: value); flags win")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="set a field of the source (repeatable); flags win over it")
    return parser


def config_from_args(args: argparse.Namespace) -> ExtractDocumentsConfig:
    """The settings file, `--set`s and flags, in that order, as a one-source config."""
    values = settings.load_file(args.config) if args.config else {}
    values = settings.merge(values, settings.parse_assignments(args.set))
    values.update({f.name: getattr(args, f.name) for f in dataclasses.fields(SourceConfig)
                   if getattr(args, f.name, None) is not None})
    values = {"name": values.get("kind", ""), **values, "path": args.input}
    if not values.get("kind"):
        raise settings.SettingError("kind", "is required: one of "
                                    + settings.choice_list(readers.READERS))
    source = settings.build(SourceConfig, values, label="--")
    num_shards = settings.convert_setting("--num_shards", args.num_shards or 0, int)
    wave_mb = (None if args.wave_mb is None
               else settings.convert_setting("--wave_mb", args.wave_mb, float))
    return ExtractDocumentsConfig(sources=(source,), output=args.output, num_shards=num_shards,
                                  wave_mb=wave_mb)


def main(argv: Sequence[str] | None = None) -> dict:
    """The command line: flags -> `ExtractDocumentsConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    return run(config_from_args(args), beam_args)


def run(config: ExtractDocumentsConfig, beam_args: Sequence[str] = ()) -> dict:
    """Read `config.sources` into the documents folder `config.output`; returns the manifest."""
    jobs.configure_logging()
    options = jobs.beam_pipeline_options(beam_args)
    config = waves.resolve_wave_mb(config, options, waves.LOCAL_SHARD_WAVE_MB)
    selected = {s.name: select_inputs(s) for s in config.sources}
    elements = [(i, f) for i, s in enumerate(config.sources) for f in selected[s.name].files]
    total = sum(f.size_bytes for _, f in elements)
    num_waves, num_shards = waves.shard_plan(total, config.wave_mb, config.num_shards,
                                             parquet_io.auto_num_shards(total))
    log.info("extract_documents: %d source(s), %d file(s), %d shard(s), %d wave(s)",
             len(config.sources), len(elements), num_shards, num_waves)
    log.debug("extract_documents config: %s", dataclasses.asdict(config))
    pipeline = waves.run_to_shards(options, elements, ("Read", ReadFileFn(config.sources)),
                                   config.output, (num_waves, num_shards), PREFIX,
                                   DOCUMENT_SCHEMA)
    if jobs.is_dry_run(options):
        return jobs.dry_run_summary(NAMESPACE, pipeline)
    counts = parquet_io.query_counters_by_source(pipeline.result, NAMESPACE)
    return finish(config, selected, num_shards, counts)


def source_entry(source: SourceConfig, files: SourceFiles, counts: dict[str, int]) -> dict:
    """The manifest's entry for one source: its declaration, input and counts."""
    bad = {name.removeprefix("bad_"): value for name, value in sorted(counts.items())
           if name.startswith("bad_") and name != "bad_records"}
    return {"kind": source.kind, "path": source.path, "licence": source.licence,
            "input_files": len(files.files),
            "input_bytes": sum(f.size_bytes for f in files.files),
            **{name: counts.get(name, 0) for name in SOURCE_COUNTS}, "bad": bad}


def finish(config: ExtractDocumentsConfig, selected: dict[str, SourceFiles], num_shards: int,
           counts: dict[str, dict[str, int]]) -> dict:
    """After the pipeline: complete the shard set, check each source gave documents and the
    counts match the rows, write the manifest."""
    shards = parquet_io.finish_shards(config.output, PREFIX, num_shards, DOCUMENT_SCHEMA)
    totals = {name: sum(c.get(name, 0) for c in counts.values()) for name in SOURCE_COUNTS}
    dead_letters = parquet_io.finish_dead_letters(config.output, totals["bad_records"] > 0)
    parquet_io.check_rows_written(config.output, shards, totals["documents"])
    sources = {s.name: source_entry(s, selected[s.name], counts.get(s.name, {}))
               for s in config.sources}
    for source in config.sources:
        if sources[source.name]["documents"] == 0:
            raise nothing_from(source, sources[source.name], selected[source.name],
                               dead_letters)
    manifest = jobs.stage_manifest(
        NAMESPACE, config, parquet_io.content_hash(config), OUTPUT_VERSION, counts=totals,
        inputs=[{"path": f.path, "bytes": f.size_bytes}
                for s in config.sources for f in selected[s.name].files],
        outputs=parquet_io.output_records(config.output, [*shards, dead_letters]),
        num_shards=num_shards, sources=sources,
        skipped_inputs=[p for s in config.sources for p in selected[s.name].skipped])
    summary = {name: {k: v for k, v in entry.items() if k != "path"}
               for name, entry in sources.items()}
    return jobs.publish_manifest(log, NAMESPACE, manifest, summary, dead_letters)


def nothing_from(source: SourceConfig, entry: dict, files: SourceFiles,
                 dead_letters: str) -> errors.NoOutputError:
    """The one-line error of a source that gave no document, with its first dead letter."""
    import json

    paths = {f.path for f in files.files}
    first = ""
    with storage.open_read(dead_letters) as f:
        for line in f:
            record = json.loads(line)
            if record["file"] in paths:
                first = f" (first: {record['file']} {record['record']}: {record['reason']})"
                break
    return errors.NoOutputError(
        f"source {source.name!r} ({source.kind}, {source.path}): 0 documents from "
        f"{entry['records_read']} record(s), {entry['bad_records']} bad, set aside in "
        f"{dead_letters}{first}; no manifest written")


if __name__ == "__main__":
    import sys

    sys.exit(jobs.main(NAMESPACE, main))
