"""What every Beam job shares: `--input`/`--output` flags, Beam options, dead letters, logging.

A job module defines `run(config, ...inputs, output, beam_args) -> dict` (returns its manifest)
and a thin `main(argv)`: its flags come from its config dataclass (`config_parser`). Flags the
job's parser does not know are handed to Beam's `PipelineOptions`, so the standard options
(`--runner`, `--direct_num_workers`, `--project`, `--region`, `--temp_location`, `--setup_file`,
`--sdk_container_image`, ...) work on every job. `--help` (`job_help`) shows the job's
docstring with its examples as written, then its flags grouped: input and output, then the
config's settings, each with its docstring and default. With `--runner=DataflowRunner` the
command line first checks what Dataflow needs (`dataflow_preflight`: Beam's GCP extra,
`--project`, `--region`, a gs:// `--temp_location`, Google credentials unless `--no_auth`) and
ends in one line naming what is missing, exit 2, before Beam starts.

Every job's manifest starts with `manifest_head` (job, output version, config and its hash)
and is written by `publish_manifest`, last, as it marks the output complete.

What a run leaves when it fails or is killed:
- a full disk: the job ends with one line, `<job>: error: no space left on the device writing
  <path>: <space> left there` (exit 2), and writes no manifest (`disk_full_reported`);
- a kill -9: the `atomic_open` temporaries it was writing and its Beam file sinks'
  `beam-temp-*` folders stay; the next run of the same job into the same folder removes them
  on start (`remove_stale_temporaries`), never any other file;
- Beam's worker processes (`--direct_running_mode=multi_processing`) end with the process that
  started them, the job or the flow that runs it, even when it is killed (`local_runner`,
  `pipelines/beam_worker.py`).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence

from common import storage
from common.errors import (
    DISK_FULL_ERRNOS,
    USER_ERRORS,
    DiskFullError,
    NoOutputError,
    debug_requested,
    disk_full,
    is_user_error,
)


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
            handler.addFilter(_DISK_FULL_FILTER)


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


def manifest_head(job: str, config, config_hash: str, output_version: int | None = None
                  ) -> dict:
    """The first entries of a job's manifest: the job, its output version (where it has one),
    its resolved config and that config's hash (what a flow compares to reuse an output)."""
    import dataclasses

    version = {} if output_version is None else {"output_version": output_version}
    return {"stage": job, **version, "config": dataclasses.asdict(config),
            "config_hash": config_hash}


def publish_manifest(logger: logging.Logger, job: str, manifest: dict, summary,
                     dead_letters: str) -> dict:
    """Write `manifest` into `manifest["config"]["output"]`, last, as it marks the output
    complete; log the job's `summary` and warn of its dead letters. Returns the manifest as
    later stages read it (tuples as lists)."""
    output = manifest["config"]["output"]
    storage.write_manifest(output, manifest)
    manifest = storage.read_manifest(output)
    logger.info("%s: %s", job, summary)
    warn_dead_letters(logger, job, manifest["counts"]["bad_records"], dead_letters)
    return manifest


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
# A full disk
# ----------------------------------------------------------------------------------------------

# A worker's error reaches the runner as text when the worker is another process (Beam's Fn
# API sends `ProcessBundleResponse.error`, a formatted traceback, and the runner raises
# `RuntimeError(that text)`), so the ENOSPC of a multi-processing run is found in the text:
# our DiskFullError's line (its path), else Python's `[Errno 28] <strerror>: '<path>'` (pyarrow
# writes `[errno 28]`). In-process, Beam re-raises it as a RuntimeError whose context is the
# original error, which `disk_full` finds.
_DISK_FULL_LINE = re.compile(
    r"DiskFullError: no space left on the device writing (?P<path>.+?)"
    r"(?:: it needs (?P<needed>[\d.]+ [KMGT]?B))?(?:[:,] [\d.]+ [KMGT]?B left there)?"
    r"(?: \[while running '[^\n]*'\])*$", re.MULTILINE)
_ERRNO_TEXT = re.compile(r"\[errno (?P<errno>\d+)\][^:'\n]*(?:: '(?P<path>[^'\n]+)')?",
                         re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}


def beam_disk_full(error: BaseException, path: str | None = None) -> DiskFullError | None:
    """`error` (anything a Beam run raises) as a DiskFullError naming the file being written
    when a full disk (ENOSPC, EDQUOT) caused it, else None. `path`: where the job writes, named
    when the error does not say which file."""
    found = disk_full(error)
    if found is not None:
        return found if found.path != "its output" or path is None else DiskFullError(path)
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        found = disk_full_in_text(str(error), path)
        if found is not None:
            return found
        error = error.__cause__ or error.__context__
    return None


def disk_full_in_text(text: str, path: str | None = None) -> DiskFullError | None:
    """The DiskFullError a traceback or error message `text` tells of, else None."""
    match = _DISK_FULL_LINE.search(text)
    if match:
        needed = match.group("needed")
        number, unit = needed.split() if needed else (None, None)
        return DiskFullError(match.group("path"),
                             int(float(number) * _UNITS[unit]) if number else None)
    for match in _ERRNO_TEXT.finditer(text):
        if int(match.group("errno")) in DISK_FULL_ERRNOS:
            return DiskFullError(match.group("path") or path or "its output")
    return None


@contextlib.contextmanager
def disk_full_reported(output: str) -> Iterator[None]:
    """Around a pipeline run: a full disk in any of its writes (ours, Beam's sinks, in a worker
    process or not) is raised as one DiskFullError naming the file (else `output`), so the job
    and the flow that runs it report one line; the job writes no manifest after it."""
    try:
        yield
    except Exception as e:
        full = None if isinstance(e, DiskFullError) else beam_disk_full(e, output)
        if full is None:
            raise
        raise full from None


class _DiskFullLogFilter(logging.Filter):
    """Drops Beam's ERROR records of a full disk (a worker's traceback, logged once by the
    worker and once more by the runner): the job's one-line error says it."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR or not record.name.startswith("apache_beam"):
            return True
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += "\n" + str(record.exc_info[1])
        return disk_full_in_text(text, None) is None


_DISK_FULL_FILTER = _DiskFullLogFilter()


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


# ----------------------------------------------------------------------------------------------
# Dataflow without what it needs
# ----------------------------------------------------------------------------------------------

CREDENTIALS_TIMEOUT_S = 5.0
"""How long the credentials lookup may take (google-auth pings the metadata server, up to 3
tries of 3 s each where nothing answers); past it, no credentials were found."""
_GCP_EXTRA = "pip install -e '.[gcp]' (or apache-beam[gcp]==2.77.0)"


def dataflow_preflight(argv: Sequence[str]) -> None:
    """Before a `--runner=DataflowRunner` job builds anything: a ValueError naming everything
    it lacks, in one line (Beam would retry the credentials for about two minutes and then end
    in a long traceback): Beam's GCP extra, `--project`, `--region` (or CLOUDSDK_COMPUTE_REGION),
    a `--temp_location` (or `--staging_location`) of the form gs://BUCKET/FOLDER with a bucket
    name Beam accepts, and Google credentials as google-auth finds them (GOOGLE_APPLICATION_CREDENTIALS, gcloud's application-default file, the metadata
    server), unless `--no_auth`. Any other runner: nothing is checked."""
    options = _dataflow_options(argv)
    if options is None:
        return
    missing = []
    if not _imports("apache_beam.runners.dataflow.internal.apiclient"):
        missing.append(f"Beam's GCP extra (apache-beam[gcp]: {_GCP_EXTRA})")
    if not options.project:
        missing.append("--project=...")
    elif not re.fullmatch(r"[a-z][-a-z0-9:.]+[a-z0-9]", options.project):
        # Beam refuses a project number or description after building the whole graph
        missing.append(f"--project={options.project} (a project ID such as my-project, not "
                       "its number or name)")
    if not (options.region or os.environ.get("CLOUDSDK_COMPUTE_REGION")):
        missing.append("--region=...")
    locations = {name: getattr(options, name) for name in ("temp_location", "staging_location")
                 if getattr(options, name)}
    bad = [f"--{name}={path} (gs://BUCKET/FOLDER, a bucket name of 3 to 63 characters a-z 0-9 "
           "- _ .)" for name, path in locations.items() if not _gcs_folder(path)]
    missing += bad or ([] if locations else ["--temp_location=gs://BUCKET/tmp"])
    if not options.no_auth:
        problem = missing_credentials()
        if problem:
            missing.append(problem)
    if missing:
        raise ValueError(f"--runner=DataflowRunner needs {'; '.join(missing)}")


def _dataflow_options(argv: Sequence[str]) -> argparse.Namespace | None:
    """The Beam options the preflight reads, when `argv` names the Dataflow runner (Beam takes
    `DataflowRunner`, `dataflow` or a dotted path to the class), else None."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for name in ("runner", "project", "region", "temp_location", "staging_location"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--no_auth", action="store_true")
    options, _ = parser.parse_known_args(list(argv))
    runner = str(options.runner or "").rsplit(".", 1)[-1].lower()
    return options if runner in ("dataflowrunner", "dataflow") else None


def _gcs_folder(path: str) -> bool:
    """Whether `path` is a gs:// folder whose bucket name Beam accepts (an invalid one makes it
    fall back on a default bucket that it then tries to create)."""
    match = re.fullmatch(r"gs://([^/]+)/(.+)", path)
    return bool(match) and re.fullmatch(r"[a-z0-9][-_a-z0-9.]{1,61}[a-z0-9]",
                                        match.group(1)) is not None


def _imports(module: str) -> bool:
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def missing_credentials(timeout_s: float = CREDENTIALS_TIMEOUT_S) -> str | None:
    """None when google-auth finds Google credentials, else what to set up (one phrase)."""
    key_file = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if key_file and not os.path.isfile(key_file):
        return (f"Google credentials: GOOGLE_APPLICATION_CREDENTIALS={key_file} is no file "
                "(a service account's JSON key)")
    if not _imports("google.auth"):
        return f"Google credentials, and google-auth to read them ({_GCP_EXTRA})"
    import threading

    import google.auth
    import google.auth.exceptions

    found: list[BaseException | None] = []

    def lookup() -> None:
        try:
            google.auth.default()
            found.append(None)
        except google.auth.exceptions.GoogleAuthError as error:
            found.append(error)

    # A daemon thread: where the metadata server does not answer, the process ends without
    # waiting for google-auth's pings.
    thread = threading.Thread(target=lookup, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not found:
        return (f"Google credentials (none found within {timeout_s:g} s: no "
                "GOOGLE_APPLICATION_CREDENTIALS, no gcloud application-default login, the "
                "metadata server does not answer)")
    error = found[0]
    if error is not None:
        first = str(error).strip().split(". ")[0].rstrip(".")
        return (f"Google credentials ({first}: run `gcloud auth application-default login` or "
                "set GOOGLE_APPLICATION_CREDENTIALS to a service account's JSON key file)")
    return None
