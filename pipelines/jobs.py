"""What every Beam job shares: `--input`/`--output` flags, Beam options, dead letters, logging.

A job module defines `build_parser()` (its own options) and `run(argv=None) -> dict` (returns its
manifest). Flags the job's parser does not know are handed to Beam's `PipelineOptions`, so the
standard options (`--runner`, `--direct_num_workers`, `--project`, `--region`, `--temp_location`,
`--setup_file`, `--sdk_container_image`, ...) work on every job.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

DEAD_LETTER_DIR = "dead_letter"


def job_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=description,
        epilog="Any other flag is a standard Apache Beam pipeline option "
        "(--runner, --direct_num_workers, --project, --region, --temp_location, ...).",
    )
    parser.add_argument("--input", required=True,
                        help="a file, glob or folder (local or any Beam filesystem, e.g. gs://); "
                             "several separated by commas")
    parser.add_argument("--output", required=True, help="output folder (local or gs://...)")
    return parser


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
    """
    from apache_beam.options.pipeline_options import StandardOptions
    if beam_options.view_as(StandardOptions).runner is not None:
        return None
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    return FnApiRunner()


@dataclass(frozen=True)
class BadRecord:
    """A record a job set aside: written to `<output>/dead_letter/` and counted, never lost."""
    file: str
    record: str  # e.g. "page 12345", "line 7", "stream at byte 5512"
    reason: str

    def to_json(self) -> str:
        import json
        return json.dumps({"file": self.file, "record": self.record, "reason": self.reason},
                          ensure_ascii=False)


def configure_logging() -> None:
    # Beam logs a root-logger warning at import; force our format over it.
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        force=True)


class NoOutputError(ValueError):
    """The job ran but its whole input gave nothing (0 documents, 0 instances): it fails, and
    writes no manifest, so no later stage takes an empty folder for a finished one. A
    ValueError: the input's values are what is wrong."""


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

    from pipelines import storage
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


USER_ERRORS = (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
               PermissionError, NoOutputError)
"""What a user's options or inputs cause: reported in one line, not as a traceback."""
DEBUG_ENV = "BERT_DEBUG"
OUR_PACKAGES = ("pipelines", "training", "model", "finetune", "flows", "peers")
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def debug_requested() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def is_user_error(error: BaseException, kinds: tuple[type[BaseException], ...] = USER_ERRORS
                  ) -> bool:
    """Whether `error` is one of our checks speaking to the user: one of `kinds` raised by
    this project's code (its innermost frame in one of OUR_PACKAGES). The same types raised
    inside torch, DeepSpeed or Beam are bugs (ours or theirs) and keep their traceback."""
    if not isinstance(error, kinds):
        return False
    tb = error.__traceback__
    if tb is None or isinstance(error, NoOutputError):
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return is_our_file(tb.tb_frame.f_code.co_filename)


def is_our_file(path: str) -> bool:
    """Whether a source file belongs to this project's packages (not a library's)."""
    path = os.path.abspath(path)
    return any(path.startswith(os.path.join(_REPO, package) + os.sep) for package in OUR_PACKAGES)


def main(job: str, run: Callable[[list[str]], object], argv: Sequence[str] | None = None) -> int:
    """A job's command line: `run(argv)`; a user error prints `<job>: error: <message>` and
    returns 2 (1 when the job ran but produced nothing). `--debug` (or BERT_DEBUG=1)
    re-raises it with its traceback; other exceptions are bugs and always keep theirs."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or debug_requested()
    argv = [a for a in argv if a != "--debug"]
    try:
        run(argv)
    except USER_ERRORS as e:
        if debug or not is_user_error(e):
            raise
        message = str(e).strip() or type(e).__name__
        print(f"{job}: error: {message}", file=sys.stderr)
        return 1 if isinstance(e, NoOutputError) else 2
    return 0
