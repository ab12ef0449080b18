"""`bert-glue`: `bert-finetune` fixed to the GLUE family, `--data` being the GLUE folder itself.

    bert-glue --model <checkpoint folder> --data <GLUE folder> --tasks rte,mrpc --output runs/glue

`--model` is our exported folder, a `model.hf.save_checkpoint` folder or any Hugging Face BERT
folder; `--data` is a `download_glue_data.py` folder (`RTE/train.tsv`, ...) or a Hugging Face
`datasets` GLUE folder (`rte/train-*.parquet`, ...). Defaults are the paper's recipe.

Every data file, the checkpoint and its tokenizer are checked before the first task trains; the
results are rewritten after each finished task (a later failure keeps them). A bad input prints
`bert-glue: error: <message>` and exits 2 (`--debug` or BERT_DEBUG=1 shows the traceback).
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from common import extras

with extras.needed_by("bert-glue"):  # without the train extra: one line, not a traceback
    from finetune import cli
    from finetune.glue.family import FAMILY
    from finetune.glue.tasks import parse_tasks
    from finetune.options import FinetuneConfig, TaskJob


@dataclass(frozen=True)
class GlueCommandConfig(cli.CommandConfig):
    """`bert-glue`'s settings: `bert-finetune`'s, its data being the GLUE folder itself."""

    data: str | None = None
    """GLUE data folder (TSV or Hugging Face datasets layout)."""
    tasks: tuple[str, ...] = ()
    """GLUE tasks (rte,mrpc) or all."""

    def required(self) -> tuple[str, ...]:
        """Every `REQUIRED` setting: a task file's tasks are not GLUE's, the data is."""
        return cli.REQUIRED


def build_parser() -> argparse.ArgumentParser:
    return cli.build_parser(prog="bert-glue", description=__doc__,
                            config_class=GlueCommandConfig)


def config_from_args(args: argparse.Namespace) -> FinetuneConfig:
    return cli.command_config(args, GlueCommandConfig()).for_recipe(FAMILY.recipe("rte"))


def task_jobs(config: GlueCommandConfig) -> list[TaskJob]:
    """One job per GLUE task; the data folder is `data` itself."""
    family = cli.with_options(FAMILY, config)
    loop_config = config.for_recipe(FAMILY.recipe("rte"))
    return [TaskJob(family, spec.name, config.data, loop_config)
            for spec in parse_tasks(config.task_names())]


@extras.reports_missing("bert-glue")
def main(argv: Sequence[str] | None = None) -> int:
    return cli.run_main(build_parser(), argv, task_jobs, "results.md", GlueCommandConfig())


if __name__ == "__main__":
    raise SystemExit(main())
