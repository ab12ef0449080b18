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
waves and `run()`. Its config is `pipelines/shards/config.py`'s `MakeShardsConfig` (the
settings, `ShardsConfig`, and the run's paths), passed whole. The Beam wiring (the DoFns,
`CreateInstances`, `WriteShards`, `build_scalable_pipeline`) is `pipelines/shards/pipeline.py`,
the manifest `pipelines/shards/manifest.py`. The data work is pure code in
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
from collections.abc import Sequence
from dataclasses import asdict, fields, replace

import apache_beam as beam

from common import errors, storage
from pipelines import jobs, parquet_io, waves
from pipelines.disk_full import disk_full_reported
from pipelines.shards import reference, shard_files
from pipelines.shards.config import LOCAL_WAVE_MB, MakeShardsConfig, ShardJobConfig, ShardsConfig
from pipelines.shards.instances import InstanceConfig
from pipelines.shards.manifest import build_manifest
from pipelines.shards.pipeline import DEAD_LETTERS, Wave, build_scalable_pipeline, wave_num_shards
from pipelines.shards.reading import ReadPart, input_waves, read_parts, select_inputs

logger = logging.getLogger("make_shards")

_SHARD_FILE = re.compile(r"^(train|validation)-\d{6}\.(tar|jsonl)$")
_SHARD_INFOS = ".make_shards-shard-infos.jsonl"
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
# run() and its waves
# ----------------------------------------------------------------------------------------------

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
    """The command line: flags -> `MakeShardsConfig` -> `run`."""
    args, beam_args = build_parser().parse_known_args(argv)
    base = MakeShardsConfig(input=args.input, vocab=args.vocab, output=args.output)
    return run(jobs.config_from_args(args, base), beam_args)


def run(config: MakeShardsConfig, beam_args: Sequence[str] = ()) -> dict:
    """Make shards of the corpus at `config.input` (a file, glob or folder) with the vocabulary
    at `config.vocab` into `config.output`; returns the manifest written to
    `<output>/manifest.json`."""
    input, vocab, output = config.input, config.vocab, config.output
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
    if manifest.sections["totals"]["num_instances"] == 0:
        raise jobs.nothing_produced(f"instances ({counters.get('documents', 0)} documents, "
                                    f"{counters.get('empty_documents', 0)} empty)", input,
                                    num_bad, dead_letters)
    written = manifest.write(output)
    t = written["totals"]
    logger.info("make_shards: %d instances in %d rows, %d shards, %.1f s (%.0f instances/s); "
                "random-next share %.3f, padding share %.3f", t["num_instances"], t["num_rows"],
                len(infos), counters["seconds"], t["num_instances"] / max(counters["seconds"], 1e-9),
                t["random_next_share"], t["padding_share"])
    jobs.warn_dead_letters(logger, "make_shards", num_bad, dead_letters)
    return written


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
