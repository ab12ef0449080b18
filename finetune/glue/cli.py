"""`bert-glue`: fine-tune a checkpoint on GLUE tasks and print the results table.

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
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence

from finetune.glue.finetune import FinetuneConfig, GlueResult, run_glue
from finetune.glue.report import markdown_table, write_report
from finetune.glue.tasks import parse_tasks
from pipelines import jobs, storage
from pipelines.jobs import debug_requested, is_user_error

log = logging.getLogger("bert-glue")

USER_ERRORS = (*jobs.USER_ERRORS, FileExistsError, FloatingPointError)
"""What bad options or inputs cause (the jobs' kinds; a GlueFormatError is a ValueError;
FloatingPointError is a diverged loss): one line on stderr and exit code 2, not a traceback."""


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}")


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}")


def build_parser() -> argparse.ArgumentParser:
    defaults = FinetuneConfig()
    p = argparse.ArgumentParser(prog="bert-glue", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint folder (ours or Hugging Face BERT)")
    p.add_argument("--vocab", default=None,
                   help="tokenizer folder (default: the --model folder's tokenizer)")
    p.add_argument("--data", required=True, help="GLUE data folder (TSV or HF datasets layout)")
    p.add_argument("--tasks", required=True, help="comma-separated tasks (rte,mrpc) or 'all'")
    p.add_argument("--output", required=True, help="folder for tables, plot and submission.zip")
    p.add_argument("--learning_rates", type=_floats, default=defaults.learning_rates,
                   help="comma-separated peak learning rates (default: 5e-5,4e-5,3e-5,2e-5)")
    p.add_argument("--seeds", type=_ints, default=defaults.seeds,
                   help="comma-separated seeds for small tasks; others use the first")
    p.add_argument("--epochs", type=float, default=defaults.epochs)
    p.add_argument("--batch_size", type=int, default=defaults.batch_size)
    p.add_argument("--max_seq_length", type=int, default=defaults.max_seq_length)
    p.add_argument("--warmup_proportion", type=float, default=defaults.warmup_proportion)
    p.add_argument("--weight_decay", type=float, default=defaults.weight_decay,
                   help="AdamW's decoupled weight decay (none on biases and LayerNorm)")
    p.add_argument("--adam_epsilon", type=float, default=defaults.adam_epsilon)
    p.add_argument("--max_grad_norm", type=float, default=defaults.max_grad_norm,
                   help="global gradient-norm clip (0 = off)")
    p.add_argument("--max_train_examples", type=int, default=None,
                   help="train on a fixed random subset of this many examples")
    p.add_argument("--max_eval_examples", type=int, default=None,
                   help="score a fixed random subset of this many dev examples")
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (faster on AVX-512 CPUs)")
    p.add_argument("--device", default=defaults.device,
                   help="auto (a GPU when torch sees one, else the CPU), cpu, cuda or cuda:N")
    p.add_argument("--no_packing", action="store_true",
                   help="pad each example to the batch's longest instead of packing rows")
    p.add_argument("--skip_bad_rows", action="store_true",
                   help="set malformed rows aside (counted, and written with their text to "
                        "<output>/dead_letter/glue_bad_rows.jsonl) instead of failing")
    p.add_argument("--no_test", action="store_true", help="do not predict the test sets")
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    p.add_argument("--num_threads", type=int, default=None,
                   help="torch CPU threads (default: torch's; 1 is faster on a busy machine)")
    p.add_argument("--debug", action="store_true",
                   help="show the traceback of a bad-input error instead of one line")
    return p


def config_from_args(args: argparse.Namespace) -> FinetuneConfig:
    return FinetuneConfig(
        max_seq_length=args.max_seq_length, batch_size=args.batch_size, epochs=args.epochs,
        learning_rates=args.learning_rates, seeds=args.seeds,
        warmup_proportion=args.warmup_proportion, weight_decay=args.weight_decay,
        adam_epsilon=args.adam_epsilon, max_grad_norm=args.max_grad_norm, bf16=args.bf16,
        pack_sequences=not args.no_packing, max_train_examples=args.max_train_examples,
        max_eval_examples=args.max_eval_examples, skip_bad_rows=args.skip_bad_rows,
        predict_test=not args.no_test, progress=not args.no_progress, device=args.device)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    finished: list[str] = []
    try:
        return run(parser, args, finished)
    except USER_ERRORS as e:
        if args.debug or debug_requested() or not is_user_error(e, USER_ERRORS):
            raise
        message = str(e).strip() or type(e).__name__
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
        if finished:
            sys.stderr.write(f"{parser.prog}: the results of {', '.join(finished)} (finished "
                             f"before the error) are in {args.output}\n")
        return 2


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, finished: list[str]) -> int:
    """The whole command for parsed `args`; bad inputs raise (main turns them into one line).

    The names of the tasks whose results are written are appended to `finished` as they are.
    """
    try:
        cfg = config_from_args(args)
        tasks = parse_tasks(args.tasks)
    except ValueError as e:
        parser.error(str(e))
    if args.num_threads is not None:
        if args.num_threads < 1:
            parser.error(f"--num_threads must be >= 1, got {args.num_threads}")
        import torch

        torch.set_num_threads(args.num_threads)
    resolved = {"model": args.model, "vocab": args.vocab, "data": args.data,
                "tasks": [t.name for t in tasks],
                "config": dataclasses.asdict(cfg)}
    log.info("resolved config (hash %s):\n%s", storage.config_hash(resolved),
             json.dumps(resolved, indent=2))
    if os.path.exists(args.output) and not os.path.isdir(args.output):
        raise NotADirectoryError(f"--output {args.output}: exists and is not a folder")
    storage.makedirs(args.output)
    storage.atomic_write_json(storage.join(args.output, "config.json"),
                              resolved | {"config_hash": storage.config_hash(resolved)})

    def write_finished(partial: GlueResult) -> None:
        if partial.pending_tasks:  # the last task's report is written (and logged) below
            _write(partial, args.output)
            finished.append(partial.tasks[-1].task)
            log.info("%s done; results so far in %s", partial.tasks[-1].task, args.output)

    result = run_glue(args.model, args.data, tasks, cfg, vocab_dir=args.vocab,
                      on_task_done=write_finished)
    paths = _write(result, args.output)
    sys.stdout.write(markdown_table(result))
    for kind, path in paths.items():
        log.info("wrote %s: %s", kind, path)
    return 0


def _write(result: GlueResult, output_dir: str) -> dict[str, str]:
    """The report of `result`; a warning names the dead-letter file when rows were set aside."""
    paths = write_report(result, output_dir)
    bad_rows = sum(t.bad_rows for t in result.tasks)
    if bad_rows:
        log.warning("%d malformed row(s) set aside (--skip_bad_rows) in %s", bad_rows,
                    paths["dead_letter"])
    return paths


if __name__ == "__main__":
    raise SystemExit(main())
