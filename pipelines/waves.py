"""Waves: a job run as several bounded pipelines on Beam's local runner, whose memory then
follows a wave, not the corpus.

The local runner (the FnApiRunner) holds every grouped collection of a pipeline in memory, so
a pipeline's peak grows with its input (~20-75 bytes per input byte, benchmarks/
bench_local_memory.py). A job that groups records by a key (build_corpus: documents by content,
then by doc_id) runs instead as
  1. a scatter pipeline, with no grouping: each record is appended to the scratch partition of
     its key (`ScatterFn`, `partition_of`), and
  2. one pipeline per partition (a wave) that reads that partition alone (`ReadScratch`):
     every record of a key is in it, so grouping within the wave is grouping in the whole.
A wave can scatter again by another key for the next family of waves. Distributed runners
(Dataflow, Flink, Spark) spill their shuffles to disk and run the job as one pipeline.

The extraction jobs (extract_books, extract_documents) share one pipeline, `run_to_shards`:
their files spread over the workers, a DoFn per job, documents written as shards (in waves when
the input is larger than `wave_mb`) and dead letters; their `num_shards` and `wave_mb`
settings are `ShardedOutput`'s.

Scratch files are JSON lines under `<output>/.waves/` (local only; removed when the job ends and
when the next run starts). A scatter appends a bundle's records per partition in one write per
file, so a reader sees whole lines; the local runner fails the job rather than retrying a
bundle, so no record is appended twice.
"""
from __future__ import annotations

import contextlib
import hashlib
import heapq
import json
import math
import os
import shutil
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import apache_beam as beam

from common import storage
from common.settings import check

SCRATCH = ".waves"
LOCAL_SHARD_WAVE_MB = 64.0
"""Input MB per wave of the extraction jobs on Beam's local runner when `wave_mb` is unset:
they only hold the shard being written."""
FLUSH_BYTES = 16 << 20
"""A scatter writes out what it holds once it holds this many bytes of JSON."""


@dataclass(frozen=True, kw_only=True)
class ShardedOutput:
    """The output settings of an extraction job whose shards are its waves (`run_to_shards`)."""
    num_shards: int = 0
    """Parquet files to write; 0 = one per 256 MB of input."""
    wave_mb: float | None = None
    """Input MB per wave: above it, documents go to scratch partitions by shard and each shard
    is written whole after the pipeline (pipelines/waves.py), so a local run's memory follows
    a shard, not the input; a shard per wave at least. 0 = one pipeline. Unset:
    `waves.LOCAL_SHARD_WAVE_MB` on Beam's local runner, 0 on a distributed runner (Dataflow,
    Flink, Spark)."""

    def __post_init__(self):
        check(self.num_shards >= 0, "num_shards",
              f"must be >= 0 (0 = automatic), got {self.num_shards}")
        check(self.wave_mb is None or self.wave_mb >= 0, "wave_mb",
              f"must be >= 0 (0 = one pipeline), got {self.wave_mb}")


def wave_count(input_bytes: int, wave_mb: float) -> int:
    """Waves for `input_bytes` of input at `wave_mb` MB each (0: one)."""
    if wave_mb <= 0:
        return 1
    return max(1, math.ceil(input_bytes / (wave_mb * 2 ** 20)))


def partition_of(key: str, count: int) -> int:
    """A key's partition among `count`: a hash that is the same in every process and run."""
    return int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big") % count


def scratch_folder(output: str) -> str:
    if storage.is_remote(output):
        raise ValueError(f"--output {output}: running in waves (wave_mb > 0) needs a local "
                         "output folder for its scratch partitions; on a distributed runner "
                         "leave wave_mb unset (one pipeline)")
    return os.path.join(output, SCRATCH)


def clear_scratch(output: str) -> None:
    """Remove the scratch partitions (of this run when it ends, of a killed run at start)."""
    if not storage.is_remote(output):
        shutil.rmtree(os.path.join(output, SCRATCH), ignore_errors=True)


def partition_files(scratch: str, name: str, partition: int) -> list[str]:
    """The files of one partition of scatter `name`, in name order."""
    folder = os.path.join(scratch, name, f"p{partition:05d}")
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)) if os.path.isdir(folder) else []


class ScatterFn(beam.DoFn):
    """(partition, JSON-able record) -> appended to `<scratch>/<name>/p<partition>/<writer>.jsonl`.

    Each DoFn instance appends to files of its own, so writers never share a file."""

    def __init__(self, scratch: str, name: str):
        self.scratch, self.name = scratch, name

    def setup(self):
        self.writer = uuid.uuid4().hex

    def start_bundle(self):
        self.pending: dict[int, list[str]] = defaultdict(list)
        self.size = 0

    def process(self, element: tuple[int, dict]):
        partition, record = element
        line = json.dumps(record, ensure_ascii=False)
        self.pending[partition].append(line)
        self.size += len(line)
        if self.size >= FLUSH_BYTES:
            self._flush()

    def finish_bundle(self):
        self._flush()

    def _flush(self):
        for partition, lines in self.pending.items():
            folder = os.path.join(self.scratch, self.name, f"p{partition:05d}")
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{self.writer}.jsonl"), "a", encoding="utf-8") as f:
                f.write("".join(line + "\n" for line in lines))
        self.pending.clear()
        self.size = 0


class Scatter(beam.PTransform):
    """Records -> their scratch partitions by `key(record)` (`partition_of`)."""

    def __init__(self, scratch: str, name: str, count: int, key: Callable[[dict], str]):
        super().__init__()
        self.scratch, self.name, self.count, self.key = scratch, name, count, key

    def expand(self, records):
        count, key = self.count, self.key
        return (records
                | "Partition" >> beam.Map(lambda r: (partition_of(key(r), count), r))
                | "Append" >> beam.ParDo(ScatterFn(self.scratch, self.name)))


def read_lines(path: str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


class ReadScratch(beam.PTransform):
    """One partition of a scatter -> its records (the files spread over the workers)."""

    def __init__(self, scratch: str, name: str, partition: int):
        super().__init__()
        self.files = partition_files(scratch, name, partition)

    def expand(self, pbegin):
        return (pbegin
                | "Files" >> beam.Create(self.files)
                | "Spread" >> beam.Reshuffle()
                | "Read" >> beam.FlatMap(read_lines))


def merge_sorted_files(parts: Iterable[str], target: str) -> int:
    """Sorted line files -> one sorted file at `target` (atomic, streaming); the parts are
    removed. Returns the line count."""
    parts = [p for p in parts if os.path.exists(p)]
    lines = 0
    storage.makedirs(os.path.dirname(target))
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(p, encoding="utf-8")) for p in parts]
        with storage.atomic_open(target, "w") as out:
            for line in heapq.merge(*handles):
                out.write(line)
                lines += 1
    for path in parts:
        os.unlink(path)
    return lines


class WriteShards(beam.PTransform):
    """Records -> `num_shards` sorted Parquet shards (`parquet_io.WriteParquetShards`); in
    waves (`scratch` set), to their shard's scratch partition instead, each shard then written
    whole by `write_scattered_shards` after the pipeline: one shard in memory at a time."""

    def __init__(self, output: str, prefix: str, num_shards: int, schema, scratch: str | None):
        super().__init__()
        self.output, self.prefix, self.num_shards = output, prefix, num_shards
        self.schema, self.scratch = schema, scratch

    def expand(self, records):
        from pipelines import parquet_io

        if self.scratch is None:
            return records | "Write" >> parquet_io.WriteParquetShards(
                self.output, self.prefix, self.num_shards, self.schema)
        return records | "Scatter" >> Scatter(self.scratch, "shards", self.num_shards,
                                              lambda r: r["doc_id"])


def write_scattered_shards(scratch: str, output: str, prefix: str, num_shards: int,
                           schema) -> None:
    """Each shard's scratch partition (`WriteShards` in waves) -> its Parquet shard, sorted as
    one pipeline writes it; the partitions' shard is the doc_id's (`partition_of` is
    `parquet_io.stable_shard`)."""
    from common.logs import progress
    from pipelines import parquet_io

    for shard in progress(range(num_shards), desc=f"write {prefix} shards", unit="shard",
                      disable=num_shards < 2):
        records = [r for path in partition_files(scratch, "shards", shard)
                   for r in read_lines(path)]
        if records:
            parquet_io.write_shard(output, prefix, shard, num_shards, records, schema)


def run_to_shards(options, elements: list, step: tuple[str, beam.DoFn], output: str,
                  plan: tuple[int, int], prefix: str, schema) -> beam.Pipeline:
    """An extraction job's pipeline: `elements` spread over the workers, the DoFn of `step`
    (its label, the DoFn) yielding records and `dead_letter`-tagged lines -> the `plan`'s
    (waves, shards) Parquet shards of `schema` (`WriteShards`) and the sorted dead letters.
    An earlier output is cleared first; a dry run leaves it and writes nothing. Returns the
    pipeline, whose result holds the job's counters."""
    from pipelines import jobs, parquet_io
    from pipelines.disk_full import disk_full_reported

    num_waves, num_shards = plan
    dry_run = jobs.is_dry_run(options)
    if not dry_run:  # a dry run leaves an earlier output as it is
        storage.makedirs(output)
        parquet_io.clear_previous_output(output, prefix)
        clear_scratch(output)
    scratch = scratch_folder(output) if num_waves > 1 else None
    label, fn = step
    with (disk_full_reported(output),
          beam.Pipeline(runner=jobs.local_runner(options), options=options) as pipeline):
        results = (pipeline
                   | "Files" >> beam.Create(elements)
                   | "Spread" >> beam.Reshuffle()
                   | label >> beam.ParDo(fn).with_outputs("dead_letter", main="documents"))
        _ = results.documents | "WriteDocuments" >> WriteShards(
            output, prefix, num_shards, schema, scratch)
        _ = results.dead_letter | "WriteDeadLetters" >> parquet_io.WriteSortedLines(
            parquet_io.dead_letter_path(output))
    if scratch is not None and not dry_run:
        with disk_full_reported(output):
            write_scattered_shards(scratch, output, prefix, num_shards, schema)
        clear_scratch(output)
    return pipeline


def shard_plan(input_bytes: int, wave_mb: float, num_shards: int, automatic: int
               ) -> tuple[int, int]:
    """(waves, shards) of a job whose shards are its waves: at least a shard per wave; a set
    `num_shards` below the wave count is refused."""
    count = wave_count(input_bytes, wave_mb)
    shards = num_shards or max(automatic, count)
    if count > 1 and shards < count:
        raise ValueError(f"--num_shards {shards} is fewer than the {count} waves of --wave_mb "
                         f"{wave_mb:g} (a shard per wave at least): raise num_shards or "
                         "wave_mb, or set num_shards=0 (automatic)")
    return count, shards


def resolve_wave_mb(config, options, local_mb: float):
    """A job config with `wave_mb` resolved: as set, else `local_mb` on Beam's local runner
    and 0 (one pipeline) on a distributed runner, whose shuffles spill to disk."""
    import dataclasses

    from pipelines import jobs

    if config.wave_mb is not None:
        return config
    return dataclasses.replace(config, wave_mb=local_mb if jobs.runs_locally(options) else 0.0)


PRELOAD = ["apache_beam", "pyarrow.parquet", "tokenizers", "numpy"]
"""What the fork server imports once, so a wave's process starts without importing them."""


def run_isolated(fn: Callable, *args):
    """`fn(*args)` in a process of its own, its result returned (it must pickle).

    A wave runs in a fresh process because Beam's local runner, run pipeline after pipeline in
    one process, keeps what each left behind (its workers' caches, fragmented heaps): the peak
    would creep up wave after wave. The process is forked from a fork server, which holds no
    threads and has the heavy modules imported (`PRELOAD`), so it starts in a moment; it dies
    with the job (`_die_with_job`), and it ends as soon as its result is sent, whatever
    threads Beam left running in it."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_isolated, args=(fn, args, send))
    process.start()
    send.close()
    try:
        outcome, value = receive.recv()
    except EOFError:
        process.join()
        raise RuntimeError(f"{fn.__name__}: its process ended without a result (exit code "
                           f"{process.exitcode})") from None
    finally:
        receive.close()
    process.join()
    if outcome == "error":
        raise value
    return value


def _die_with_job() -> None:
    """End this process the moment the job that asked for it ends (kill -9 too), and with it
    its Beam workers (`beam_worker.die_with_parent`). Its parent is the fork server, not the
    job, and the fork server outlives the job while this process lives: this process holds
    the fork server's liveness pipe, so the parent-death signal alone would come too late (a
    worker went on writing its shard ~10 s after the kill). multiprocessing keeps the write
    end of `parent_process().sentinel` open in the job: it reads as closed once the job is
    gone."""
    import multiprocessing
    import threading
    from multiprocessing.connection import wait

    job = multiprocessing.parent_process()
    if job is None:
        return

    def watch() -> None:
        wait([job.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="die-with-job", daemon=True).start()


def _isolated(fn: Callable, args: tuple, send) -> None:
    import logging
    import pickle
    import sys

    from pipelines import beam_worker, jobs

    code = 0
    try:
        beam_worker.die_with_parent(os.getppid())
        _die_with_job()
        jobs.configure_logging()
        try:
            outcome = ("ok", fn(*args))
        except Exception as e:  # noqa: BLE001 - it crosses back to the parent, raised there
            code = 1
            try:
                pickle.dumps(e)
                outcome = ("error", e)
            except Exception:  # noqa: BLE001 - what cannot cross back crosses as its message
                outcome = ("error", RuntimeError(f"{type(e).__name__}: {e}"))
        send.send(outcome)
    finally:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # Beam's runner threads may linger: they must not hold the exit
