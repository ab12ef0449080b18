"""`bert-dag`: run the pretrain-bert flow from the command line.

    bert-dag --preset tiny                          # the demo DAG on the bundled sample
    bert-dag --preset base --set data.wikipedia=gs://bucket/enwiki-*.xml.bz2 \\
        --set data.books=gs://bucket/books/ --set finetune.data=/data/finetune
    bert-dag --preset base --data_only --output gs://bucket/runs/base ...the same --set... \\
        --set data.beam_args='["--runner=DataflowRunner","--project=my-project","--region=us-central1",
                               "--temp_location=gs://bucket/tmp","--setup_file=infra/dataflow/setup.py"]'

Dataflow's workers write to Cloud Storage: such a run needs a gs:// output and --data_only
(pre-training writes to a local or mounted folder; docs/cluster.md "On a GPU cluster").

    bert-dag --sweep flows/sweeps/learning_rate.yaml
                                                    # variants of a preset, one table and plot
                                                    # (flows/sweep.py: the file's format)

The settings are the stages' own configs (README "Settings"): vocab.*, shards.phase1.*,
shards.phase2.* (shards.<field> sets both), pretrain.* (phases by name: pretrain.phase1.steps),
launch.*, finetune.*. Values are converted to each setting's type: lists as a,b,c or a JSON
list, booleans as true/false/1/0/yes/no. base and large name their inputs (a path, or '' to skip
one).

The output is the stages' own lines (a reused stage: one line), a progress bar per long stage,
then the report, ending with what to run next (this run's preset, --config and --set
flags repeated) and where it is saved. --verbose (or
BERT_LOG_LEVEL=DEBUG, which the stages' subprocesses inherit) adds the libraries' INFO lines
and the resolved config (common/logs.py).
"""
from __future__ import annotations

import argparse
import os
import sys

from common import extras, logs, settings
from common.errors import exit_with_error

with extras.needed_by("bert-dag"):  # without the flow extra: one line, not a traceback
    from flows.config import PRESETS, parse_set_flags, resolve


def build_parser() -> argparse.ArgumentParser:
    epilog = ("settings by section (--set SECTION.NAME=VALUE or a --config file; defaults: the "
              "tiny preset's, flows/config.py):\n"
              + "\n".join(settings.settings_help(PRESETS["tiny"](), one_line=True)))
    parser = argparse.ArgumentParser(prog="bert-dag", description=__doc__, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", choices=sorted(PRESETS),
                        help="the preset (default tiny; with --sweep, the file's)")
    parser.add_argument("--config", metavar="FILE",
                        help="settings file (YAML or JSON), nested as the settings are: "
                             "{pretrain: {phase1: {steps: 50}}}; --set wins over it")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting, e.g. pretrain.phase1.steps=50 (repeatable)")
    parser.add_argument("--output", help="root folder of the run (default: runs/<preset>)")
    parser.add_argument("--data_only", action="store_true",
                        help="stop after the shards (a later full run with the same settings "
                             "and output reuses them)")
    parser.add_argument("--sweep", metavar="FILE",
                        help="run the variants a sweep file (YAML/JSON) names and report them "
                             "in one table and plot under <output>/sweeps/<name>/; --set and "
                             "--output apply to every variant")
    from training.forecast import add_plan_flags
    add_plan_flags(parser)
    logs.add_verbose_flag(parser)
    return parser


def overrides_from_args(args: argparse.Namespace) -> dict:
    """The run's overrides: the settings file, then `--set`, then `--output`."""
    overrides = settings.merge(settings.load_file(args.config) if args.config else {},
                               parse_set_flags(args.set))
    if args.output:
        remote = "://" in args.output
        overrides["output"] = args.output if remote else os.path.abspath(args.output)
    return overrides


PREFECT_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                   "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120"}
"""Prefect settings every `bert-dag` (and `make demo`) run starts with unless the environment
sets them: no telemetry (offline it logs an error), and two minutes for the temporary server to
answer (Prefect's 20 s fail on a loaded machine)."""


@extras.reports_missing("bert-dag")
def main(argv: list[str] | None = None) -> int:
    for name, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(name, value)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        overrides = overrides_from_args(args)
        if args.sweep:
            if args.data_only:
                raise ValueError("--data_only: a sweep compares pre-trained variants; run "
                                 "the data stages with the shared settings alone instead")
            from flows.sweep import load_sweep

            load_sweep(args.sweep, overrides, args.preset)  # the whole file, before Prefect starts
        else:
            # fail fast on a bad setting, before Prefect starts
            resolve(args.preset or "tiny", overrides, data_only=args.data_only or args.plan)
    except (TypeError, ValueError) as e:
        exit_with_error(parser.prog, str(e))
    if args.plan:
        return plan(args, overrides)
    if args.sweep:
        return run_sweep(os.path.abspath(args.sweep), overrides, args.preset, args.verbose)
    from flows.pretrain_bert import pretrain_bert
    from flows.server import temporary_server

    logs.setup(args.verbose)  # after Prefect's import: its console handler stays the flow's
    # Prefect's own temporary server would outlive a killed flow process: this one dies with it.
    with temporary_server():
        result = pretrain_bert(preset=args.preset or "tiny", overrides=overrides,
                               data_only=args.data_only,
                               settings_file=os.path.abspath(args.config) if args.config else "")
    print(result["markdown"])
    return 0


def plan(args: argparse.Namespace, overrides: dict) -> int:
    """`bert-dag --plan`: the forecast (flows/plan.py); starts no server, stage or rank. A bad
    flag or input is one line and exit 2."""
    from flows.plan import dag_plan

    try:
        # the forecast covers the data stages and pre-training, whatever the output (gs:// too)
        return dag_plan(resolve(args.preset or "tiny", overrides, data_only=True), args)
    except (OSError, ValueError) as e:
        print(f"bert-dag: error: {e}", file=sys.stderr, flush=True)
        return 2


def run_sweep(path: str, overrides: dict, preset: str | None, verbose: bool = False) -> int:
    from flows.server import temporary_server
    from flows.sweep import pretrain_bert_sweep

    logs.setup(verbose)
    with temporary_server():
        result = pretrain_bert_sweep(sweep=path, overrides=overrides, preset=preset)
    print(result["markdown"])
    print(f"Sweep report saved to {result['paths']['markdown']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
