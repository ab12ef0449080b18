"""Training-step throughput of our ModernBERT MLM model vs transformers' `ModernBertForMaskedLM`.

One process, the same config, weights and batch for both: ours is
`model.heads.BertForPreTraining(cfg, next_sentence=False)` on the masked positions (its last
layer computes only those queries), the peer `transformers.ModernBertForMaskedLM` with
`attn_implementation="sdpa"` and `sparse_prediction=True` (the head only at labelled tokens, as
ModernBERT trained; the stronger peer), weights copied through model/modernbert_hf.py's
`state_to_hf`, labels -100 except at the masked positions. 30% of the real tokens are masked, as
ModernBERT trains. A step is forward + backward of the MLM loss (no optimizer update).

Shapes: `modernbert_tiny` and a base-shaped model (modernbert_base's widths, `--base_layers`
layers: one global + two local is one period of its pattern), at 512 and 2,048 tokens per row;
batches of full rows, and padded batches whose rows are shorter (lengths `PADDED_FRACTIONS` of
T). Steps alternate between the two models on the same batch; each step is timed in CPU seconds
of this process (wall beside it); the medians count. Tokens/s counts real tokens.

Run: `.venv/bin/python benchmarks/bench_modernbert.py [--repeats N] [--models tiny,base]
[--lengths 512,2048] [--dtypes fp32]`.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from model.attention import batch_layout, instance_ids
from model.heads import BertForPreTraining
from model.modernbert import ModernBertConfig, modernbert_base, modernbert_tiny
from model.modernbert_hf import hf_config, state_to_hf

console = Console(width=150)
MASKED_LM_PROB = 0.3
"""ModernBERT's masking share (paper section 2.2)."""
MASK_ID = 50284
"""ModernBERT's [MASK] id (its tokenizer's)."""
ROWS = {512: 4, 2048: 2}
"""Rows per batch at each length: 2,048 or 4,096 tokens a step."""
PADDED_FRACTIONS = {4: (1.0, 0.7, 0.45, 0.25), 2: (1.0, 0.55)}
"""Row lengths of a padded batch as shares of T (the first row full)."""


def model_config(name: str, length: int, base_layers: int) -> ModernBertConfig:
    if name == "tiny":
        return modernbert_tiny(max_position_embeddings=max(length, 1024))
    return modernbert_base(num_hidden_layers=base_layers)


def make_batch(rows: int, length: int, padded: bool, vocab_size: int,
               seed: int) -> tuple[dict, dict, int]:
    """(our inputs, the peer's, real tokens): random ids, 30% of each row's real tokens
    (not the first or last) masked."""
    g = torch.Generator().manual_seed(seed)
    lengths = [round(length * f) for f in PADDED_FRACTIONS[rows]] if padded else [length] * rows
    ids = torch.randint(1000, vocab_size, (rows, length), generator=g)
    mask = (torch.arange(length)[None] < torch.tensor(lengths)[:, None]).long()  # (B, T)
    ids = ids.masked_fill(mask == 0, 0)
    counts = [round(MASKED_LM_PROB * n) for n in lengths]
    M = max(counts)
    positions = torch.zeros(rows, M, dtype=torch.long)
    targets = torch.full((rows, M), -100, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    for b, (n, m) in enumerate(zip(lengths, counts)):
        where = (torch.randperm(n - 2, generator=g)[:m] + 1).sort().values
        positions[b, :m], targets[b, :m] = where, ids[b, where]
        labels[b, where] = ids[b, where]
        ids[b, where] = MASK_ID
    layout = batch_layout(instance_ids(mask, None, ids))
    ours = {"input_ids": ids, "attention_mask": mask, "masked_lm_positions": positions,
            "masked_lm_ids": targets, "layout": layout}
    peer = {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return ours, peer, sum(lengths)


def build_models(config: ModernBertConfig) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Ours and the peer with the same weights, in training mode."""
    import transformers

    torch.manual_seed(0)
    ours = BertForPreTraining(config, next_sentence=False).train()
    peer = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        **hf_config(config), sparse_prediction=True, attn_implementation="sdpa")).train()
    missing, unexpected = peer.load_state_dict(state_to_hf(ours.state_dict()), strict=False)
    if unexpected or [k for k in missing if "decoder.weight" not in k]:
        raise RuntimeError(f"weight copy to the peer failed: {missing} {unexpected}")
    return ours, peer


@dataclass
class Result:
    model: str
    length: int
    batch: str
    dtype: str
    tokens: int
    ours_s: float
    peer_s: float
    ours_wall_s: float
    peer_wall_s: float
    loss_diff: float

    @property
    def ratio(self) -> float:
        return self.peer_s / self.ours_s


def step(model: torch.nn.Module, inputs: dict, dtype: str) -> float:
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16"
                else contextlib.nullcontext())
    with autocast:
        loss = model(**inputs).loss
    loss.backward()
    model.zero_grad(set_to_none=True)
    return loss.item()


def measure(name: str, length: int, padded: bool, dtype: str, base_layers: int,
            repeats: int) -> Result:
    config = model_config(name, length, base_layers)
    ours, peer = build_models(config)
    rows = ROWS[length]
    ours_in, peer_in, tokens = make_batch(rows, length, padded, config.vocab_size, seed=length)
    times = {"ours": [], "peer": []}
    losses = {}
    for i in range(repeats + 1):  # the first round warms up
        for key, model, inputs in (("ours", ours, ours_in), ("peer", peer, peer_in)):
            cpu, wall = time.process_time(), time.perf_counter()
            losses[key] = step(model, inputs, dtype)
            if i:
                times[key].append((time.process_time() - cpu, time.perf_counter() - wall))
    med = {k: (statistics.median(c for c, _ in v), statistics.median(w for _, w in v))
           for k, v in times.items()}
    label = "padded" if padded else "full"
    r = Result(name, length, f"{rows}x{length} {label}", dtype, tokens, med["ours"][0],
               med["peer"][0], med["ours"][1], med["peer"][1], abs(losses["ours"] - losses["peer"]))
    console.print(f"  {name} {r.batch} {dtype}: ours {r.ours_s:.2f} CPU s, peer {r.peer_s:.2f} "
                  f"CPU s -> {r.ratio:.2f}x (wall {r.ours_wall_s:.2f} / {r.peer_wall_s:.2f} s); "
                  f"|loss diff| {r.loss_diff:.1e}", highlight=False)
    return r


def table(results: list[Result]) -> Table:
    t = Table(title="ModernBERT MLM training step (fwd + bwd): ours vs transformers (sdpa)")
    for column in ("model", "batch", "dtype", "real tokens", "ours tok/s", "peer tok/s",
                   "ratio ours/peer", "ours wall s", "peer wall s"):
        t.add_column(column)
    for r in results:
        t.add_row(r.model, r.batch, r.dtype, str(r.tokens), f"{r.tokens / r.ours_s:.0f}",
                  f"{r.tokens / r.peer_s:.0f}", f"{r.ratio:.2f}x", f"{r.ours_wall_s:.2f}",
                  f"{r.peer_wall_s:.2f}")
    t.caption = "CPU seconds of this process, medians; target >= 1.00x"
    return t


def main(argv: list[str] | None = None) -> list[Result]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,base", help="tiny, base (base-shaped)")
    p.add_argument("--lengths", default="512,2048")
    p.add_argument("--batches", default="full,padded")
    p.add_argument("--dtypes", default="fp32",
                   help="fp32, bf16 (autocast; only where the CPU has bf16 matmuls)")
    p.add_argument("--base_layers", type=int, default=3,
                   help="layers of the base-shaped model (modernbert_base has 22)")
    p.add_argument("--repeats", type=int, default=3, help="timed steps per model and setting")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    console.print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args}")
    results = []
    for name in args.models.split(","):
        for length in (int(n) for n in args.lengths.split(",")):
            for batch in args.batches.split(","):
                for dtype in args.dtypes.split(","):
                    results.append(measure(name, length, batch == "padded", dtype,
                                           args.base_layers, args.repeats))
    console.print(table(results))
    return results


if __name__ == "__main__":
    main()
