"""Deterministic, atomic Parquet shards and dead-letter files for the document and corpus jobs.

A record goes to shard `stable_shard(doc_id, num_shards)` (a hash that does not change between
runs or Python processes, unlike `hash()`); each shard is sorted by `doc_id` and written in one
piece through `storage.atomic_open`, so a re-run over the same inputs gives identical bytes.
Layout: `<output>/<prefix>-{index:05d}-of-{count:05d}.parquet` (+ `.txt` in the reference text
format when asked) and
`<output>/dead_letter/dead_letter-00000-of-00001.jsonl` (one `errors.BadRecord` JSON per line).
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable

import apache_beam as beam
import pyarrow as pa

from common import errors, storage
from common.manifest import ShardRecord

DEAD_LETTER_FILE = "dead_letter-00000-of-00001.jsonl"
TARGET_SHARD_BYTES = 256 << 20  # input bytes per output shard when --num_shards=0 (auto)
ROW_GROUP_ROWS = 1024  # readers (train_vocab, build_corpus) stream a shard row group by row group
COMPRESSION = "zstd"


def content_hash(config) -> str:
    """Hash of what decides a job's content: its config without --output (where it goes)."""
    fields = dataclasses.asdict(config) if dataclasses.is_dataclass(config) else dict(config)
    return storage.config_hash({k: v for k, v in fields.items() if k != "output"})


def stable_shard(key: str, num_shards: int) -> int:
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % num_shards


def auto_num_shards(total_input_bytes: int) -> int:
    return max(1, math.ceil(total_input_bytes / TARGET_SHARD_BYTES))


def shard_name(prefix: str, index: int, count: int) -> str:
    return f"{prefix}-{index:05d}-of-{count:05d}.parquet"


def shard_path(output: str, prefix: str, index: int, count: int) -> str:
    return storage.join(output, shard_name(prefix, index, count))


def write_shard(output: str, prefix: str, index: int, count: int, records: Iterable[dict],
                schema: pa.Schema, text_column: str | None = None) -> str:
    """Write one shard's records, sorted by (doc_id, source_file), atomically; returns its path.

    With `text_column`, also writes `<prefix>-....txt` in the reference text format: that
    column's items one per line, a blank line between records.
    """
    import pyarrow.parquet as pq

    rows = sorted(records, key=lambda r: (r["doc_id"], r["source_file"]))
    table = pa.Table.from_pylist(rows, schema=schema)
    path = shard_path(output, prefix, index, count)
    with storage.atomic_open(path, "wb") as f:
        pq.write_table(table, f, row_group_size=ROW_GROUP_ROWS, compression=COMPRESSION)
    if text_column is not None:
        storage.atomic_write_text(text_shard_path(output, prefix, index, count),
                                  reference_text([r[text_column] for r in rows]))
    return path


class StreamingShardWriter:
    """Writes records to one open Parquet file as they come, `row_group_rows` per row group, so
    a worker holds one row group, not the shard (extract_wikipedia: one shard per dump split)."""

    def __init__(self, file, schema: pa.Schema, row_group_rows: int = ROW_GROUP_ROWS):
        import pyarrow.parquet as pq

        self._writer = pq.ParquetWriter(file, schema, compression=COMPRESSION)
        self._schema, self._row_group_rows = schema, row_group_rows
        self._batch: list[dict] = []
        self.num_rows = 0

    def write(self, record: dict) -> None:
        self._batch.append(record)
        self.num_rows += 1
        if len(self._batch) >= self._row_group_rows:
            self._flush()

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def _flush(self) -> None:
        if self._batch:
            self._writer.write_table(pa.Table.from_pylist(self._batch, schema=self._schema))
            self._batch = []


def text_shard_path(output: str, prefix: str, index: int, count: int) -> str:
    return storage.join(output, f"{prefix}-{index:05d}-of-{count:05d}.txt")


def reference_text(documents: Iterable[Iterable[str]]) -> str:
    """BERT's input text format: one sentence per line, a blank line after every document.

    The blank line after the last one too: BERT's generator reads all its input files as one
    stream of lines, so without it a file's last document would go on into the next file.
    """
    return "".join("\n".join(sentences) + "\n\n" for sentences in documents)


def finish_shards(output: str, prefix: str, count: int, schema: pa.Schema,
                  text_column: str | None = None) -> list[str]:
    """After the pipeline: write the shards no record hashed to (empty, so the set is complete).
    Returns all shard paths in order (text shards after the Parquet ones)."""
    paths = [shard_path(output, prefix, i, count) for i in range(count)]
    for i, path in enumerate(paths):
        if not storage.exists(path):
            write_shard(output, prefix, i, count, [], schema, text_column)
    if text_column is not None:
        paths += [text_shard_path(output, prefix, i, count) for i in range(count)]
    return paths


def clear_previous_output(output: str, prefix: str, extra: Iterable[str] = ()) -> None:
    """Before a run: remove the manifest first (the folder is incomplete until the new one is
    written), then the shards, dead letters and `extra` files of an earlier run, so none can
    outlive it, and the temporaries of those files that a killed run left."""
    from apache_beam.io.filesystems import FileSystems

    from pipelines import jobs

    storage.withdraw_manifest(output)
    below = [p.removeprefix(storage.join(output, "")) for p in extra]
    jobs.remove_stale_temporaries(output, "|".join([
        rf"{re.escape(prefix)}-\d{{5}}-of-\d{{5}}\.(parquet|txt)", re.escape(storage.MANIFEST_NAME),
        re.escape(f"{errors.DEAD_LETTER_DIR}/{DEAD_LETTER_FILE}"), *map(re.escape, below)]))
    stale = [storage.join(output, f"{prefix}-*-of-*.parquet"),
             storage.join(output, f"{prefix}-*-of-*.txt"), dead_letter_path(output), *extra]
    doomed = [m.path for pattern in stale for m in FileSystems.match([pattern])[0].metadata_list]
    if doomed:
        FileSystems.delete(doomed)


def dead_letter_path(output: str) -> str:
    return storage.join(output, errors.DEAD_LETTER_DIR, DEAD_LETTER_FILE)


def write_sorted_lines(path: str, lines: Iterable[str]) -> str:
    """Lines (dead letters, duplicate lists) sorted, so a re-run writes the same bytes; atomic."""
    storage.makedirs(os.path.dirname(path))  # no-op on object stores
    storage.atomic_write_text(path, "".join(f"{line}\n" for line in sorted(lines)))
    return path


def write_dead_letters(output: str, lines: Iterable[str]) -> str:
    return write_sorted_lines(dead_letter_path(output), lines)


def check_documents_written(output: str, input: str, shards: list[str], counts: dict[str, int],
                            dead_letters: str) -> None:
    """After a corpus job: its shards hold as many rows as it counted documents, and it wrote
    some (else `jobs.nothing_produced`, naming the input and the dead letters)."""
    from pipelines import jobs

    check_rows_written(output, shards, counts["documents"])
    if counts["documents"] == 0:
        raise jobs.nothing_produced(f"documents ({counts['documents_read']} read)", input,
                                    counts["bad_records"], dead_letters)


def check_rows_written(output: str, shards: list[str], documents: int) -> None:
    """The Parquet files among `shards` hold as many rows as the job counted documents (a
    lost or doubled bundle shows here, not in a later stage)."""
    rows = sum(count_rows(p) for p in shards if p.endswith(".parquet"))
    if rows != documents:
        raise RuntimeError(f"{output}: {rows} rows written but {documents} documents counted")


def output_records(output: str, paths: list[str]) -> list[ShardRecord]:
    """The manifest's `outputs`: each path relative to the output folder, with its sha256."""
    base = str(output).rstrip("/") + "/"
    return [ShardRecord(p.removeprefix(base), storage.sha256_file(p)) for p in paths]


def query_counters(result, namespace: str, names: Iterable[str]) -> dict[str, int]:
    """The committed values of a finished pipeline's counters (0 for a counter never bumped)."""
    from apache_beam.metrics.metric import MetricsFilter

    found = {name: 0 for name in names}
    for counter in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        if counter.key.metric.name in found:
            found[counter.key.metric.name] += counter.committed or 0
    return found


def query_counters_by_source(result, namespace: str,
                             names: Iterable[str] = ()) -> dict[str, dict[str, int]]:
    """{source: {counter: committed value}} of a finished pipeline's `<source>/<counter>`
    counters, each source starting from 0 for every one of `names`."""
    from apache_beam.metrics.metric import MetricsFilter

    found: dict[str, dict[str, int]] = {}
    for counter in result.metrics().query(MetricsFilter().with_namespace(namespace))["counters"]:
        source, _, name = counter.key.metric.name.rpartition("/")
        entry = found.setdefault(source, dict.fromkeys(names, 0))
        entry[name] = entry.get(name, 0) + (counter.committed or 0)
    return found


class ReadRowsFn(beam.DoFn):
    """A Parquet file -> its rows (`columns`), one row group at a time; an unreadable file (or
    its unreadable rest) is a tagged "dead_letter". Counts `input_files`, `bad_records` and,
    when named, every row in `rows_counter`, in the job's `namespace`."""

    def __init__(self, namespace: str, columns: list[str], rows_counter: str | None = None):
        self.columns = list(columns)
        self.files = beam.metrics.Metrics.counter(namespace, "input_files")
        self.bad = beam.metrics.Metrics.counter(namespace, "bad_records")
        self.rows = rows_counter and beam.metrics.Metrics.counter(namespace, rows_counter)

    def process(self, path: str):
        import logging

        self.files.inc()
        rows = 0
        try:
            for row in parquet_rows(path, self.columns):
                rows += 1
                if self.rows:
                    self.rows.inc()
                yield row
        except (pa.ArrowException, OSError) as e:
            self.bad.inc()
            logging.getLogger("pipelines").error("dead letter: %s after row %d: %s", path,
                                                 rows, e)
            yield beam.pvalue.TaggedOutput("dead_letter", errors.BadRecord(
                path, f"rows after {rows}", f"unreadable Parquet: {e}").to_json())


class WriteParquetShards(beam.PTransform):
    """Records (dicts with `doc_id`) -> `num_shards` sorted Parquet files; outputs their paths."""

    def __init__(self, output: str, prefix: str, num_shards: int, schema: pa.Schema,
                 text_column: str | None = None, shard_key: Callable[[str], str] | None = None):
        """`shard_key(doc_id)`: the key a record's shard is the hash of (the doc_id itself
        when None)."""
        super().__init__()
        self.output, self.prefix, self.num_shards, self.schema = output, prefix, num_shards, schema
        self.text_column, self.shard_key = text_column, shard_key

    def expand(self, records):
        return (records
                | "Key" >> beam.Map(_keyed_by_shard, self.num_shards, self.shard_key)
                | "Group" >> beam.GroupByKey()
                | "Write" >> beam.Map(_write_group, self.output, self.prefix, self.num_shards,
                                      self.schema, self.text_column))


def _keyed_by_shard(record: dict, num_shards: int,
                    shard_key: Callable[[str], str] | None = None) -> tuple[int, dict]:
    key = record["doc_id"] if shard_key is None else shard_key(record["doc_id"])
    return stable_shard(key, num_shards), record


def _write_group(group: tuple[int, Iterable[dict]], output: str, prefix: str, count: int,
                 schema: pa.Schema, text_column: str | None) -> str:
    index, records = group
    return write_shard(output, prefix, index, count, records, schema, text_column)


class WriteSortedLines(beam.PTransform):
    """Lines -> one sorted file at `path` (nothing is written when no line comes: the job's
    finish step then writes the empty file, see `finish_lines_file`)."""

    def __init__(self, path: str):
        super().__init__()
        self.path = path

    def expand(self, lines):
        return (lines
                | "Key" >> beam.Map(lambda line: (0, line))
                | "Group" >> beam.GroupByKey()
                | "Write" >> beam.Map(lambda group, path: write_sorted_lines(path, group[1]),
                                      self.path))


def finish_lines_file(path: str, wrote_any: bool) -> str:
    """A lines file always exists after a run (empty when no line was written)."""
    if not wrote_any or not storage.exists(path):
        write_sorted_lines(path, [])
    return path


def finish_dead_letters(output: str, wrote_any: bool) -> str:
    return finish_lines_file(dead_letter_path(output), wrote_any)


def count_rows(path: str) -> int:
    import pyarrow.parquet as pq
    with storage.open_read(path, "rb") as f:
        return pq.ParquetFile(f).metadata.num_rows


def uncompressed_bytes(path: str) -> int:
    """A Parquet file's data size before compression, from its footer (one read): what its
    rows take once read, where the file's own size can be several times smaller."""
    import pyarrow.parquet as pq
    with storage.open_read(path, "rb") as f:
        meta = pq.ParquetFile(f).metadata
        return sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))


def with_uncompressed_sizes(files: list[storage.InputFile]) -> list[storage.InputFile]:
    """`files` with each Parquet file's size as `uncompressed_bytes` (waves are planned by
    what the rows take, not by how well they compressed); an unreadable file keeps its size
    (its reader reports it)."""
    out = []
    for f in files:
        if f.path.endswith(".parquet"):
            try:
                f = dataclasses.replace(f, size_bytes=uncompressed_bytes(f.path))
            except (OSError, ValueError, pa.ArrowException):
                pass
        out.append(f)
    return out


def parquet_rows(path: str, columns: list[str] | None = None) -> Iterable[dict]:
    """Rows of one Parquet file as dicts, one row group at a time (memory: one row group)."""
    import pyarrow.parquet as pq
    with storage.open_read(path, "rb") as f:
        parquet = pq.ParquetFile(f)
        for group in range(parquet.num_row_groups):
            yield from parquet.read_row_group(group, columns=columns).to_pylist()
