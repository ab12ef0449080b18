"""What every Beam job shares: `--input`/`--output` flags, Beam options, dead letters, logging.

A job module defines `run(config, beam_args) -> dict` (returns its manifest): `config` is the
job's typed config, its settings and where it reads and writes (`input`, `output`, make_shards'
`vocab`), and `beam_args` the Beam pipeline options. The command line (`main(argv)`, thin) and
the flow (flows/steps.py) both call it. A job whose settings are a flow section of their own
(`WikipediaConfig`, `VocabConfig`, `ShardsConfig`) extends them with those paths
(`with_paths`), and its manifest records the settings alone (`settings_of`), so where the
output goes never changes its hash. Its flags come from the settings (`config_parser`). Flags the
job's parser does not know are handed to Beam's `PipelineOptions`, so the standard options
(`--runner`, `--direct_num_workers`, `--project`, `--region`, `--temp_location`, `--setup_file`,
`--sdk_container_image`, ...) work on every job. `--help` (`job_help`) shows the job's
docstring with its examples as written, then its flags grouped: input and output, then the
config's settings, each with its docstring and default. With `--runner=DataflowRunner` the
command line first checks what Dataflow needs (`pipelines.dataflow.dataflow_preflight`: Beam's
GCP extra, `--project`, `--region`, a gs:// `--temp_location`, Google credentials unless
`--no_auth`) and ends in one line naming what is missing, exit 2, before Beam starts.

Every job's manifest is a `common.manifest.Manifest` (`stage_manifest`: job, output version,
config and its hash, counts, inputs, outputs with their sha256, and the job's own sections),
written by `publish_manifest`, last, as it marks the output complete.

What a run leaves when it fails or is killed:
- a full disk: the job ends with one line, `<job>: error: no space left on the device writing
  <path>: <space> left there` (exit 2), and writes no manifest
  (`pipelines.disk_full.disk_full_reported`);
- a kill -9: the `atomic_open` temporaries it was writing and its Beam file sinks'
  `beam-temp-*` folders stay; the next run of the same job into the same folder removes them
  on start (`remove_stale_temporaries`), never any other file;
- Beam's worker processes (`--direct_running_mode=multi_processing`) end with the process that
  started them, the job or the flow that runs it, even when it is killed (`local_runner`,
  `pipelines/beam_worker.py`).
"""
from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence

from common import storage
from common.errors import USER_ERRORS, NoOutputError, debug_requested, is_user_error
from common.manifest import Manifest
from pipelines.dataflow import dataflow_preflight
from pipelines.disk_full import DISK_FULL_LOG_FILTER, beam_disk_full


def job_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Any other flag is a standard Apache Beam pipeline option (--runner,\n"
        "--direct_num_workers, --project, --region, --temp_location, ...).",
    )
    where = parser.add_argument_group("input and output")
    where.add_argument("--input", required=True,
                       help="a file, glob or folder (local or any Beam filesystem, e.g. gs://); "
                            "several separated by commas")
    where.add_argument("--output", required=True, help="output folder (local or gs://...)")
    return parser


def config_parser(description: str, config_class: type,
                  aliases: Sequence[tuple[str, str, str, str]] = ()) -> argparse.ArgumentParser:
    """A job's parser with a flag per field of its config dataclass (help from the field's
    docstring, and its default), `--config FILE` (YAML or JSON) and `--set KEY=VALUE`, the
    overrides every entry point takes, grouped under the config's name. `aliases`: (flag,
    field, value, help) for flags that set a field to a fixed value (`--cased` sets
    do_lower_case=false). A config with `input` and `output` fields takes them from
    `--input`/`--output`."""
    parser = job_parser(description)
    group = config_group(parser, config_class, skip=("input", "output"))
    for flag, field, value, help_text in aliases:
        group.add_argument(flag, dest=field, action="store_const", const=value, help=help_text)
    group.add_argument("--config", metavar="FILE",
                       help="settings file (YAML or JSON: field: value); flags win over it")
    group.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a setting (repeatable); flags win over it")
    return parser


def config_group(parser: argparse.ArgumentParser, config_class: type,
                 skip: Sequence[str] = ()) -> argparse._ArgumentGroup:
    """An argument group of `parser` titled with `config_class` and holding a flag per field
    (`common.settings.add_config_flags`), each help ending with the field's default."""
    import dataclasses

    from common.settings import add_config_flags

    group = parser.add_argument_group(
        f"settings ({config_class.__name__}, {config_class.__module__.replace('.', '/')}.py)")
    add_config_flags(group, config_class, skip=skip)
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING
                else f.default_factory() for f in dataclasses.fields(config_class)}
    for action in group._group_actions:  # argparse keeps a group's actions only there
        default = defaults.get(action.dest, dataclasses.MISSING)
        if default is not dataclasses.MISSING:
            shown = repr(default).replace("%", "%%")
            action.help = f"{action.help} (default: {shown})" if action.help else shown
    return group


def config_from_args(args: argparse.Namespace, base):
    """`base` (the config's defaults or a preset) with the settings file, `--set`s and then the
    flags given applied, in that order; validated once, errors naming the flag."""
    from common import settings

    given = settings.load_file(args.config) if args.config else {}
    config = settings.apply(base, given, label=f"{args.config}: config key") if given else base
    config = settings.apply(config, settings.parse_assignments(args.set), label="--set")
    return settings.config_from_flags(config, args)


def with_paths(job_class: type, settings, **paths):
    """A job config of `job_class` (a subclass of `settings`' class that adds the job's paths)
    with the fields of `settings` and the `paths` given (`input=..., output=...`)."""
    import dataclasses

    return job_class(**{f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)},
                     **paths)


def settings_of(config, settings_class: type):
    """The `settings_class` part of a job config that extends it with paths: what the job's
    manifest records and hashes (where the output goes is no part of what it is)."""
    import dataclasses

    return settings_class(**{f.name: getattr(config, f.name)
                             for f in dataclasses.fields(settings_class)})


def beam_pipeline_options(beam_args: Sequence[str]):
    """Beam's PipelineOptions of a job's Beam flags."""
    from apache_beam.options.pipeline_options import PipelineOptions

    return PipelineOptions(list(beam_args), save_main_session=False)


def parse_job_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None):
    """Split argv into the job's own options and Beam's PipelineOptions."""
    from apache_beam.options.pipeline_options import PipelineOptions

    args, beam_args = parser.parse_known_args(argv)
    return args, PipelineOptions(beam_args, save_main_session=False)


def local_runner(beam_options):
    """Beam's FnApiRunner when no --runner is given, else None (Beam picks the runner).

    The default DirectRunner first tries to download the Prism runner (a serial ~0.3 s that
    fails offline) and then falls back to the FnApiRunner anyway; naming it directly keeps
    --direct_num_workers / --direct_running_mode meaning the same on every machine.

    With `--direct_running_mode=multi_processing` the worker processes start through
    `pipelines/beam_worker.py`, which has Linux end each one when its parent dies (a kill -9
    of the job, or of the flow that runs it in-process, leaves Beam's own workers running,
    ~165 MB each). The runner takes the worker command as its documented `default_environment`;
    the running mode is then cleared from the options, because the FnApiRunner replaces its
    environment with its own command when it reads `multi_processing` there.
    """
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions
    if beam_options.view_as(StandardOptions).runner is not None:
        return None
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    direct = beam_options.view_as(DirectOptions)
    if direct.direct_running_mode != "multi_processing":
        return FnApiRunner()
    from pipelines import beam_worker
    direct.direct_running_mode = None
    return FnApiRunner(default_environment=beam_worker.environment())


def is_dry_run(beam_options) -> bool:
    """`--dry_run=True`: the runner builds the job graph and runs nothing (with DataflowRunner
    and `--no_auth`, the whole pipeline is translated and pickled without a cloud account)."""
    from apache_beam.options.pipeline_options import TestOptions
    return bool(beam_options.view_as(TestOptions).dry_run)


def dry_run_summary(job: str, pipeline) -> dict:
    """What a dry run returns instead of a manifest (nothing ran, so nothing was written or
    counted): the job, the runner and the transforms of the graph it built."""
    transforms = pipeline.to_runner_api().components.transforms
    names = sorted({t.unique_name.split("/")[0] for t in transforms.values() if t.unique_name})
    runner = type(pipeline.runner).__name__
    logging.getLogger(job).info("%s: dry run on %s: the job graph (%d transforms) was built; "
                                "nothing was run and no output was written", job, runner,
                                len(transforms))
    return {"stage": job, "dry_run": True, "runner": runner, "num_transforms": len(transforms),
            "top_level_transforms": names}


# Peak memory of a local run (FnApiRunner, one worker) = base + factor * input bytes, fitted by
# benchmarks/bench_local_memory.py on the shared books + Wikipedia replicated 1x-16x
# (benchmarks/RESULTS.md, "Local runner memory"). Input bytes: book text for extract_books, the
# documents / corpus Parquet files for build_corpus and make_shards (at --dupe_factor 2; its
# instances, and so its memory, grow with the dupe factor). Each job's outputs are grouped (by
# shard, by document hash) in the runner's memory, hence the growth with the input.
LOCAL_MEMORY_FIT = {
    "extract_books": (220e6, 5.5),
    "build_corpus": (292e6, 20.7),
    "make_shards": (218e6, 50.3),
}
MEASURED_DUPE_FACTOR = 2
LOCAL_MEMORY_ENV = "BERT_LOCAL_MEMORY_BYTES"
"""Memory the local runner may use, in bytes (default: what the machine has available, or the
container's limit when lower)."""


def available_memory_bytes() -> int:
    """BERT_LOCAL_MEMORY_BYTES if set, else the smaller of the memory available now and this
    container's cgroup limit (a container sees its host's free memory)."""
    if os.environ.get(LOCAL_MEMORY_ENV):
        return int(float(os.environ[LOCAL_MEMORY_ENV]))
    import psutil

    available = psutil.virtual_memory().available
    for limit_file in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(limit_file) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            available = min(available, int(text))
    return available


def local_memory_estimate(job: str, input_bytes: int, scale: float = 1.0) -> int | None:
    """Expected peak memory of `job` on the local runner, None for a job not measured."""
    if job not in LOCAL_MEMORY_FIT:
        return None
    base, factor = LOCAL_MEMORY_FIT[job]
    return int(base + factor * scale * input_bytes)


def warn_if_too_large_for_local_runner(logger: logging.Logger, job: str, input_bytes: int,
                                       beam_options, scale: float = 1.0) -> bool:
    """Before a local run: warn (and return True) when the input clearly needs more memory than
    there is. The local runner holds grouped data in memory; beyond it, Dataflow or a Flink or
    Spark cluster through Beam's portable runner (README, "Beyond one machine")."""
    if not runs_locally(beam_options):
        return False
    estimate = local_memory_estimate(job, input_bytes, scale)
    if estimate is None:
        return False
    available = available_memory_bytes()
    if estimate <= available:
        return False
    base, factor = LOCAL_MEMORY_FIT[job]
    logger.warning(
        "%s: %.2f GB of input needs about %.1f GB on Beam's local runner (measured: %.0f MB + "
        "%.0f bytes per input byte), more than the %.1f GB available (%s): it will likely run "
        "out of memory. Use --runner=DataflowRunner, or a Flink/Spark cluster with "
        "--runner=PortableRunner (README, \"Beyond one machine\")", job, input_bytes / 1e9,
        estimate / 1e9, base / 1e6, factor * scale, available / 1e9, LOCAL_MEMORY_ENV)
    return True


def runs_locally(beam_options) -> bool:
    from apache_beam.options.pipeline_options import StandardOptions
    runner = beam_options.view_as(StandardOptions).runner
    return runner is None or str(runner).split(".")[-1] in (
        "DirectRunner", "FnApiRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner")


def configure_logging() -> None:
    # One set-up for every command (common/logs.py): Beam's INFO lines only when verbose.
    from common import logs

    logs.setup(force=True)
    if not (_KEEP_BEAM_TRACEBACKS or debug_requested()):
        for handler in logging.getLogger().handlers:
            handler.addFilter(DISK_FULL_LOG_FILTER)


_KEEP_BEAM_TRACEBACKS = False
"""Set by `main` for `--debug`: Beam's logged tracebacks of a full disk are kept."""


def nothing_produced(what: str, input_arg: str, num_bad: int, dead_letter_path: str
                     ) -> NoOutputError:
    """The one-line error of a job that produced no `what` from `input_arg`, with the first
    dead letter's reason (most often the reason for all of them)."""
    inputs = input_arg if isinstance(input_arg, str) else ",".join(input_arg)
    first = _first_dead_letter(dead_letter_path) if num_bad else None
    example = f" (first: {first['file']} {first['record']}: {first['reason']})" if first else ""
    return NoOutputError(f"0 {what} from --input {inputs}: {num_bad} bad record(s) set aside "
                         f"in {dead_letter_path}{example}; no manifest written")


def _first_dead_letter(path: str) -> dict | None:
    import json

    from common import storage
    try:
        with storage.open_read(path) as f:
            line = f.readline()
        return json.loads(line) if line.strip() else None
    except (OSError, ValueError):
        return None  # the summary is still right without its example


def warn_dead_letters(logger: logging.Logger, job: str, num_bad: int, dead_letter_path: str) -> None:
    """The closing warning of a job that set records aside (a success log alone hides them)."""
    if num_bad:
        logger.warning("%s: %d bad record(s) set aside in %s", job, num_bad, dead_letter_path)


def stage_manifest(job: str, config, config_hash: str, output_version: int | None = None, *,
                   counts: dict, inputs: list | None, outputs: Sequence, **sections) -> Manifest:
    """A job's manifest: the job, its output version (where it has one), its resolved config and
    that config's hash (what a flow compares to reuse an output), its counts, the inputs it
    read, the files it wrote (`ShardRecord`s) and its own `sections`."""
    import dataclasses

    return Manifest(stage=job, config_hash=config_hash, config=dataclasses.asdict(config),
                    output_version=output_version, counts=counts, inputs=inputs,
                    outputs=tuple(outputs), sections=sections)


def publish_manifest(logger: logging.Logger, job: str, manifest: Manifest, summary,
                     dead_letters: str) -> dict:
    """Write `manifest` into its config's `output`, last, as it marks the output complete; log
    the job's `summary` and warn of its dead letters. Returns the manifest as later stages read
    it (tuples as lists)."""
    written = manifest.write(manifest.config["output"])
    logger.info("%s: %s", job, summary)
    warn_dead_letters(logger, job, manifest.counts["bad_records"], dead_letters)
    return written


def main(job: str, run: Callable[[list[str]], object], argv: Sequence[str] | None = None,
         prog: str | None = None) -> int:
    """A job's command line: `run(argv)` (the job's `main`); a user error prints
    `<job>: error: <message>` and returns 2 (1 when the job ran but produced nothing).
    `--debug` (or BERT_DEBUG=1) re-raises it with its traceback; other exceptions are bugs and
    always keep theirs. `--verbose` (or BERT_LOG_LEVEL=DEBUG) logs Beam's INFO lines too. `-h`/`--help` prints the job's help (`job_help`) as `prog` (default
    `python -m pipelines.<job>`); `--runner=DataflowRunner` is checked first
    (`dataflow_preflight`). A `run` that returns an int (verify_shards) exits with it."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or debug_requested()
    if "--verbose" in argv:  # Beam's INFO lines and the config dump (common/logs.py)
        os.environ["BERT_LOG_LEVEL"] = "DEBUG"
    argv = [a for a in argv if a not in ("--debug", "--verbose")]
    global _KEEP_BEAM_TRACEBACKS
    _KEEP_BEAM_TRACEBACKS = debug
    help_text = job_help(run, prog or f"python -m pipelines.{job}") if (
        "-h" in argv or "--help" in argv) else None
    if help_text is not None:
        print(help_text, end="")
        return 0
    try:
        dataflow_preflight(argv)
        result = run(argv)
    except Exception as e:  # a full disk is found in whatever error Beam raises
        error = e if isinstance(e, USER_ERRORS) else beam_disk_full(e)
        if debug or error is None or not is_user_error(error):
            raise
        message = str(error).strip() or type(error).__name__
        print(f"{job}: error: {message}", file=sys.stderr)
        return 1 if isinstance(error, NoOutputError) else 2
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


def job_help(run: Callable, prog: str) -> str | None:
    """The `--help` of the job whose `main` is `run`: its `build_parser()`'s flags (grouped,
    each with its docstring and default) under the job module's whole docstring, whose usage
    examples print as written; None for a module without `build_parser` (its own parser
    answers)."""
    module = sys.modules.get(getattr(run, "__module__", ""))
    build = getattr(module, "build_parser", None)
    if build is None:
        return None
    parser = build()
    parser.prog = prog
    parser.description = (module.__doc__ or parser.description or "").strip("\n")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser.format_help()


# ----------------------------------------------------------------------------------------------
# What a killed run leaves
# ----------------------------------------------------------------------------------------------

_BEAM_TEMP_DIR = re.compile(r"^beam-temp-(?P<prefix>.+)-[0-9a-f]{32}$")
"""A Beam file sink's temporary folder beside its output (`FileBasedSink._create_temp_dir`)."""


def remove_stale_temporaries(output: str, written: str, beam_sinks: Sequence[str] = ()
                             ) -> list[str]:
    """Before a run into `output` (local; an object store has no temporaries to leave): remove
    what a killed run of the same job left, and return their paths below `output`:
    `atomic_open` temporaries of the files it writes (`written`: a regex of their paths below
    `output`, "/"-separated) and the `beam-temp-*` folders of its Beam file sinks (`beam_sinks`:
    their file name prefixes below `output`). Nothing else is touched."""
    if storage.is_remote(output) or not os.path.isdir(output):
        return []
    ours = re.compile(written)
    removed = []
    for root, dirs, files in os.walk(output):
        below = os.path.relpath(root, output)
        prefix = "" if below == "." else below.replace(os.sep, "/") + "/"
        for name in files:
            target = storage.temporary_target(name)
            if target is not None and ours.fullmatch(prefix + target):
                os.unlink(os.path.join(root, name))
                removed.append(prefix + name)
        for name in list(dirs):
            match = _BEAM_TEMP_DIR.match(name)
            if match and prefix + match.group("prefix") in beam_sinks:
                shutil.rmtree(os.path.join(root, name))
                dirs.remove(name)
                removed.append(prefix + name)
    if removed:
        logging.getLogger("pipelines").info("removed %d temporary file(s) left by a killed run in "
                                            "%s: %s", len(removed), output, ", ".join(removed))
    return removed
