"""The `beam` command: `beam run pipelines/<job>.py [job options] [Beam pipeline options]`.

Apache Beam's Python SDK ships no such executable; this one loads the job file (or module) and
calls its `main(argv)` (`run(argv)` for a job without one), so `beam run ...` and
`python pipelines/<job>.py ...` are the same job.
A user error (ValueError, FileNotFoundError, ... from the job's options or inputs) prints
`<job>: error: <message>` and exits 2 (1: the job ran but produced nothing); `--debug` or
BERT_DEBUG=1 shows the traceback. `beam run pipelines/<job>.py --help` lists the job's settings
(grouped, each with its docstring and default) under the job's own docstring and its examples;
`--runner=DataflowRunner` without credentials, `--project`, `--region` or a gs://
`--temp_location` ends in one line naming what is missing, before Beam starts
(`pipelines.dataflow.dataflow_preflight`).
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from common import extras


def load_job(target: str):
    """The job module: a file path runs that very file (one of ours by its module name), a
    name is a module (`make_shards` = `pipelines.make_shards`)."""
    if not (target.endswith(".py") or os.sep in target):
        return importlib.import_module(target if "." in target else f"pipelines.{target}")
    if not os.path.isfile(target):
        raise SystemExit(f"beam: no job file {target!r}")
    name = os.path.splitext(os.path.basename(target))[0]
    for module in (f"pipelines.{name}", f"flows.{name}"):
        if _is_module_file(module, target):
            # One of ours (a job, or flows/audit_contamination.py): import it by its name, so
            # that what Beam pickles for its workers names an importable module, not a file.
            return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(name, target)
    if spec is None or spec.loader is None:
        raise SystemExit(f"beam: cannot load job file {target!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_module_file(module: str, path: str) -> bool:
    """Whether importing `module` would load the file at `path`."""
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # no such package
        return False
    return bool(spec and spec.origin and os.path.isfile(spec.origin)
                and os.path.samefile(spec.origin, path))


@extras.reports_missing("beam")  # the jobs import Beam: without the data extra, one line
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="beam", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run"])
    parser.add_argument("job", help="job file (pipelines/make_shards.py) or module name")
    if len(argv) < 2 or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    args = parser.parse_args(argv[:2])
    job = load_job(args.job)
    command_line = getattr(job, "main", None) or getattr(job, "run", None)
    if command_line is None:
        raise SystemExit(f"beam: {args.job} has no main(argv) or run(argv) function")
    from pipelines import jobs

    # A user error (bad option, missing input, nothing produced) is one line, not a traceback.
    return jobs.main(job.__name__.rsplit(".", 1)[-1], command_line, argv[2:],
                     prog=f"beam run {args.job}")


if __name__ == "__main__":
    sys.exit(main())
