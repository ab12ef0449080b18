"""Does the new head's initial spread move GLUE scores? A paired diagnostic for issue 5.

Our classification head starts as BERT's reference `run_classifier.py` starts it: N(0, 0.02)
truncated at 2 std (std 0.0176). transformers' BertForSequenceClassification, the peer of
bench_glue.py, starts it untruncated: 1.137x wider. This runs OUR fine-tuning twice per seed,
identical but for the head's initial weights, which the second run multiplies by that factor
(the same draws, the peer's spread). Same data order, same dropout masks, same everything else,
so the difference per seed is the effect of the spread alone.

    .venv/bin/python benchmarks/glue_head_scale.py --tasks mrpc --seeds 1,2 --threads 1
"""
from __future__ import annotations

import argparse
import math
import os

import torch

from model.glue import data as glue_data
from model.glue import finetune as ft
from model.glue.metrics import task_score
from model.glue.tasks import parse_tasks

WIDER = 1 / math.sqrt(1 - 4 * math.exp(-2) / math.sqrt(2 * math.pi) / math.erf(math.sqrt(2)))
"""std of N(0, 1) over std of N(0, 1) truncated at +-2: 1.137."""


def run(encoder, prepared: ft.PreparedTask, lr: float, seed: int, cfg: ft.FinetuneConfig,
        head_scale: float) -> float:
    """Our fine-tuning run of `bench_glue.run_ours`, the new head's weights times
    `head_scale` (a multiplication: no random number is drawn, so all else stays paired)."""
    model = ft.build_model(encoder, prepared.task.num_labels, seed)
    with torch.no_grad():
        model.classifier.weight.mul_(head_scale)
    ft.train(model, prepared.train, lr, seed, cfg)
    return 100 * task_score(ft.evaluate(model, prepared, cfg))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", default="mrpc")
    p.add_argument("--seeds", default="1,2")
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads:
        torch.set_num_threads(args.threads)
    from bench_glue import default_data_dir, default_model_dir  # this script's folder

    model_dir, data_dir = default_model_dir(), default_data_dir()
    encoder = ft.load_encoder(model_dir)
    for task in parse_tasks(args.tasks):
        for seed in (int(s) for s in args.seeds.split(",")):
            cfg = ft.FinetuneConfig(learning_rates=(args.learning_rate,), seeds=(seed,),
                                    predict_test=False, progress=False)
            tokenizer = glue_data.load_glue_tokenizer(model_dir, cfg.max_seq_length)
            prepared = ft.prepare_task(task, data_dir, tokenizer, cfg)
            scores = [run(encoder, prepared, args.learning_rate, seed, cfg, scale)
                      for scale in (1.0, WIDER)]
            print(f"{task.name} seed {seed}: reference head {scores[0]:.2f}, "
                  f"{WIDER:.3f}x wider head {scores[1]:.2f}, diff {scores[1] - scores[0]:+.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
