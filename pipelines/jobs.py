"""What every Beam job shares: `--input`/`--output` flags, Beam options, dead letters, logging.

A job module defines `build_parser()` (its own options) and `run(argv=None) -> dict` (returns its
manifest). Flags the job's parser does not know are handed to Beam's `PipelineOptions`, so the
standard options (`--runner`, `--direct_num_workers`, `--project`, `--region`, `--temp_location`,
`--setup_file`, `--sdk_container_image`, ...) work on every job.
"""
from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
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
