"""Training-step throughput of our BertForPreTraining vs `transformers.BertForPreTraining`.

One process, the same BERT-base config, weights, batch and optimizer for both (fused AdamW, so
the comparison is of the models), in three precisions: fp32; bf16 = autocast over fp32 weights;
bf16-params = the model in bf16 with fp32 master weights in the optimizer (what DeepSpeed's bf16
mode does in our trainer). Steps alternate between the two models; each step is timed in CPU
seconds of this process (robust to other processes' load, unlike wall time, also printed) and
the best step counts (as in `timeit`).

1. Dense batches (no padding), seq 128 x batch 8 and seq 512 x batch 2: tokens/s and the ratio.
2. Phase-2 packing on the shared corpus as our pipeline makes it (`make_phase2_shards.py`:
   extract_wikipedia + extract_books + build_corpus + make_shards --max_seq_length 512
   --max_predictions_per_seq 80 --pack; built under /tmp on first use), or `--shards DIR`.
   Ours trains on a seeded sample of packed rows, the peer on the same instances one per row
   with padding; useful (non-padding) tokens/s, and the whole-data estimate (ratio per row x
   instances per packed row).
3. Useful model FLOP/s (`useful_flops`: 6 x layer params x the tokens each layer must see, the
   last layer at the masked positions and [CLS]s only, + masked-LM head at the masked positions
   + attention within instances) as a share of a 4096^3 matmul measured in the same run.
4. One layer's attention core, forward + backward with dropout, on sampled packed rows: the
   old block-diagonal-mask SDPA vs per-instance attention (`model.attention.attend_instances`).
5. `--profile`: where ours spends a forward + backward (matrix products, dtype casts, the rest)
   and the bound on the ratio and the FLOP/s share if the rest took no time (`StepProfile`).

Both models run with malloc set up as our trainer sets it on CPU (freed memory kept for reuse,
`training.launch.keep_freed_memory`); `--malloc default` leaves glibc's settings.

Run: `.venv/bin/python benchmarks/bench_model.py --threads 1 [--quick] [--steps N] [--shards DIR]`.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from common.shard_format import Row
from model.bert import PRESETS, BertConfig
from model.bert_hf import state_to_hf
from model.heads import BertForPreTraining
from training.launch import keep_freed_memory

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
console = Console(width=150)


@dataclass(frozen=True)
class BenchConfig:
    """What to measure."""

    steps: int = 3
    """Timed steps per model and setting (after `warmup`)."""
    warmup: int = 1
    """Untimed steps per model and setting."""
    dtypes: tuple[str, ...] = ("fp32", "bf16", "bf16-params")
    """Precisions: fp32, bf16 (autocast over fp32 weights), bf16-params (bf16 weights, fp32
    master copies in the optimizer)."""
    dense_shapes: tuple[tuple[int, int], ...] = ((128, 8), (512, 2))
    """(seq length, batch) of the dense runs."""
    packed_rows: int = 2
    """Rows of 512 tokens per step in the packing run (both models); 0 skips the run."""
    shards: str | None = None
    """A packed 512-token shard folder; None: the shared corpus's phase-2 shards
    (`make_phase2_shards.py`, built under /tmp on first use)."""
    matmul_reps: int = 3
    """Timed repetitions of the 4096^3 matmul."""
    profile: bool = False
    """Also profile one forward + backward of ours per setting: its time in matrix products,
    in dtype casts and in everything else, and the bound that gives (`StepProfile`)."""
    recipe_batch: int = 256
    """Sequences per optimizer update in the paper's recipe (both phases): the amortised FLOP/s
    share charges each step's update at rows / recipe_batch of its cost, as gradient
    accumulation does; the step as timed pays a whole update for 2-8 rows."""

    def __post_init__(self):
        if self.steps < 1 or self.warmup < 0:
            raise ValueError("--steps must be >= 1 and --warmup >= 0")
        unknown = set(self.dtypes) - {"fp32", "bf16", "bf16-params"}
        if unknown:
            raise ValueError(f"--dtypes: unknown {sorted(unknown)}")


# ------------------------------------------------------------------------------------ FLOPs

def matmul_flops_per_s(dtype: torch.dtype, reps: int, n: int = 4096) -> float:
    """Best of `reps` n^3 matmuls per CPU second of this process: the machine's practical peak."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        a @ b
        best = min(best, time.process_time() - start)
    return 2 * n**3 / best


def useful_flops(config: BertConfig, model: BertForPreTraining,
                 instances: list[tuple[int, int]]) -> float:
    """Training FLOPs (forward + backward = 3 x forward) of the work the losses need in a step.

    `instances` holds (tokens, masked positions) per instance. A linear layer costs 6 x params
    x the tokens it must see; attention scores and mixing 12 x H x queries x keys per layer,
    within each instance only. The losses read the last layer only at the masked positions and
    the [CLS] (its "queries"): there only the keys and values are needed at every token, the
    query projection, attention output and feed-forward at the queries alone. The MLM head
    counts at the masked positions (its vocabulary projection is tied, so not in the layer
    params), pooler and NSP head once per instance.
    """
    H, layers = config.hidden_size, config.num_hidden_layers
    layer_params = sum(p.numel() for p in model.bert.layers[0].parameters())
    key_value_params = 2 * (H * H + H)  # two thirds of the fused QKV projection
    tokens = sum(n for n, _ in instances)
    queries = sum(q + 1 for _, q in instances)
    linear = (6 * layer_params * tokens * (layers - 1)
              + 6 * key_value_params * tokens + 6 * (layer_params - key_value_params) * queries)
    attention = 12 * H * (sum(n * n for n, _ in instances) * (layers - 1)
                          + sum(n * (q + 1) for n, q in instances))
    heads = (6 * H * (H + config.vocab_size) * sum(q for _, q in instances)
             + 6 * (H * H + 2 * H) * len(instances))
    return linear + attention + heads


# ------------------------------------------------------------------------------------ data

def dense_rows(batch: int, seq: int, vocab_size: int, seed: int) -> list[Row]:
    """Random full-length unpacked rows with BERT's masking density (15%, NSP labels)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(batch):
        ids = rng.integers(1000, vocab_size, seq)
        num_masked = round(0.15 * seq)
        positions = np.sort(rng.choice(np.arange(1, seq - 1), num_masked, replace=False))
        segment = (np.arange(seq) >= seq // 2).astype(np.uint8)
        rows.append(Row(ids, segment, np.zeros(seq, np.uint8), positions, ids[positions],
                        np.array([rng.integers(0, 2)], np.int8)))
    return rows


def shard_rows(folder: str) -> list[Row]:
    """All rows of the train shards of a shard folder."""
    import tarfile

    from common.shard_format import MEMBER_SUFFIX, decode_block

    rows = []
    for tar_path in sorted(Path(folder).glob("train-*.tar")):
        with tarfile.open(tar_path) as tar:
            for member in tar:
                if member.isfile() and member.name.endswith(MEMBER_SUFFIX):
                    rows += decode_block(tar.extractfile(member).read())
    if not rows:
        raise FileNotFoundError(f"{folder}: no train-*.tar shards with {MEMBER_SUFFIX} members")
    return rows


def unpack_rows(rows: list[Row]) -> list[Row]:
    """Packed rows -> one row per instance (the peer's input)."""
    out = []
    for row in rows:
        seq = np.asarray(row.sequence_ids)
        for k in range(len(row.next_sentence_labels)):
            where = np.flatnonzero(seq == k)
            lo, hi = where[0], where[-1] + 1
            keep = (row.masked_lm_positions >= lo) & (row.masked_lm_positions < hi)
            out.append(Row(row.input_ids[lo:hi], row.segment_ids[lo:hi],
                           np.zeros(hi - lo, np.uint8), row.masked_lm_positions[keep] - lo,
                           row.masked_lm_ids[keep], row.next_sentence_labels[k:k + 1]))
    return out


def collate(rows: list[Row]) -> dict[str, torch.Tensor]:
    from training.batching import collate as loader_collate

    return loader_collate(rows, pad_to_multiple_of=8)


def hf_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same unpacked batch in `transformers`' form: labels (B, T), -100 where not masked."""
    labels = torch.full_like(batch["input_ids"], -100)
    valid = batch["masked_lm_ids"] >= 0
    rows = torch.arange(labels.shape[0])[:, None].expand_as(valid)
    labels[rows[valid], batch["masked_lm_positions"][valid]] = batch["masked_lm_ids"][valid]
    if batch["next_sentence_label"].dim() != 1:
        raise ValueError("the peer takes one instance per row")
    return {"input_ids": batch["input_ids"], "token_type_ids": batch["token_type_ids"],
            "attention_mask": batch["attention_mask"], "labels": labels,
            "next_sentence_label": batch["next_sentence_label"]}


# ------------------------------------------------------------------------------------ models

def build_models(config: BertConfig) -> tuple[BertForPreTraining, torch.nn.Module]:
    """Ours and the peer with the same weights, in training mode (dropout on)."""
    import transformers

    torch.manual_seed(0)
    ours = BertForPreTraining(config).train()
    peer = transformers.BertForPreTraining(
        transformers.BertConfig(**config.to_dict(), attn_implementation="sdpa")).train()
    missing, unexpected = peer.load_state_dict(state_to_hf(ours.state_dict()), strict=False)
    if unexpected or [k for k in missing if "decoder" not in k]:
        raise RuntimeError(f"weight copy to the peer failed: {missing} {unexpected}")
    return ours, peer


@dataclass(frozen=True)
class TrainStep:
    """One training step in its two parts: forward + backward of the batch (`micro`), then the
    optimizer update (`update`), whose cost does not depend on the batch."""

    micro: Callable[[], None]
    update: Callable[[], None]


def train_step_fn(model: torch.nn.Module, inputs: dict[str, torch.Tensor],
                  dtype: str) -> TrainStep:
    """fp32; bf16: autocast over fp32 weights; bf16-params: the model in bf16, AdamW on fp32
    master copies (what DeepSpeed's bf16 mode does in our trainer)."""
    if dtype == "bf16-params":
        return _bf16_params_step(model, inputs)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)

    def micro() -> None:
        autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16"
                    else contextlib.nullcontext())
        with autocast:
            loss = model(**inputs).loss
        loss.backward()

    def update() -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return TrainStep(micro, update)


def _bf16_params_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> TrainStep:
    import copy

    low = copy.deepcopy(model).to(torch.bfloat16)  # keeps the tied decoder tied
    params = list(low.parameters())
    masters = [p.detach().float().clone().requires_grad_() for p in params]
    optimizer = torch.optim.AdamW(masters, lr=1e-5, fused=True)

    def micro() -> None:
        low(**inputs).loss.backward()

    def update() -> None:
        for p, master in zip(params, masters):
            master.grad = p.grad.float()
            p.grad = None
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, master in zip(params, masters):
                p.copy_(master)

    return TrainStep(micro, update)


@dataclass(frozen=True)
class Timing:
    """Best seconds per call."""

    cpu: float
    """CPU seconds of this process (all its threads): what the work costs, whatever the load."""
    wall: float
    """Wall-clock seconds (grow when other processes take the cores)."""


@dataclass(frozen=True)
class StepTiming:
    """Best CPU seconds of a training step's parts, and of the whole step (wall too)."""

    step: Timing
    micro: float
    """Best CPU seconds of forward + backward."""
    update: float
    """Best CPU seconds of the optimizer update."""


def time_steps(steps: dict[str, TrainStep], cfg: BenchConfig) -> dict[str, StepTiming]:
    """`time_alternating` for training steps, each part timed on its own as well."""
    parts: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}

    def timed(name: str, step: TrainStep) -> Callable[[], None]:
        def run() -> None:
            start = time.process_time()
            step.micro()
            middle = time.process_time()
            step.update()
            parts[name].append((middle - start, time.process_time() - middle))
        return run

    whole = time_alternating({name: timed(name, s) for name, s in steps.items()}, cfg)
    return {name: StepTiming(whole[name], min(m for m, _ in parts[name][cfg.warmup:]),
                             min(u for _, u in parts[name][cfg.warmup:])) for name in steps}


def time_alternating(steps: dict[str, Callable[[], None]], cfg: BenchConfig) -> dict[str, Timing]:
    """Best CPU and wall seconds per call of each function, run in alternation."""
    for fn in steps.values():
        for _ in range(cfg.warmup):
            fn()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(cfg.steps):
        for name, fn in steps.items():
            cpu, wall = time.process_time(), time.perf_counter()
            fn()
            times[name].append((time.process_time() - cpu, time.perf_counter() - wall))
    return {name: Timing(min(c for c, _ in t), min(w for _, w in t)) for name, t in times.items()}


GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm"})
"""The matrix products: where the model's FLOPs are."""


@dataclass(frozen=True)
class StepProfile:
    """Shares of one profiled forward + backward's CPU time (torch.profiler self times)."""

    gemm: float
    """Matrix products (`GEMM_OPS`)."""
    casts: float
    """Dtype conversions (`aten::_to_copy`): under autocast each linear weight to bf16 in the
    forward and its gradient back to fp32 in the backward."""

    @property
    def other(self) -> float:
        """Elementwise work, normalisation, softmax, copies, the embedding gradient, ..."""
        return 1.0 - self.gemm - self.casts

    def floor(self, micro_s: float, update_s: float) -> float:
        """Seconds per step if everything but the matrix products, the casts and the update
        took no time: the best any fusion of the other work could do."""
        return micro_s * (self.gemm + self.casts) + update_s


def profile_micro(step: TrainStep) -> StepProfile:
    """Profile one forward + backward; its update runs after (unprofiled), so that no
    gradients are left accumulated for the next setting's steps."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step.micro()
    step.update()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    gemm = sum(e.self_cpu_time_total for e in events if e.key in GEMM_OPS)
    casts = sum(e.cpu_time_total for e in events if e.key == "aten::_to_copy")  # with its copy_
    return StepProfile(gemm / total, casts / total)


# ------------------------------------------------------------------------------------ runs

@dataclass
class Result:
    setting: str
    dtype: str
    ours_s: float
    peer_s: float
    ours_wall_s: float
    peer_wall_s: float
    ours_tokens_per_s: float
    peer_tokens_per_s: float
    ours_flops_share: float
    peer_flops_share: float
    ours_micro_share: float
    """FLOP/s share of forward + backward alone."""
    ours_amortised_share: float
    """FLOP/s share with the update charged at rows / recipe_batch of its cost."""
    peer_amortised_share: float
    ours_floor_s: float | None = None
    """`StepProfile.floor` of ours (with `--profile`)."""

    @property
    def ratio(self) -> float:
        return self.ours_tokens_per_s / self.peer_tokens_per_s


def run_setting(name: str, ours_rows: list[Row], peer_rows: list[Row], dtype: str,
                ours: BertForPreTraining, peer: torch.nn.Module, cfg: BenchConfig,
                peak: float) -> Result:
    ours_batch, peer_batch = collate(ours_rows), hf_inputs(collate(peer_rows))
    useful_tokens = sum(len(r.input_ids) for r in ours_rows)
    assert useful_tokens == sum(len(r.input_ids) for r in peer_rows)
    flops = useful_flops(ours.config, ours, [(len(r.input_ids), len(r.masked_lm_ids))
                                             for r in unpack_rows(ours_rows)])
    ours_step = train_step_fn(ours, ours_batch, dtype)
    times = time_steps({"ours": ours_step, "peer": train_step_fn(peer, peer_batch, dtype)}, cfg)
    ours_s, peer_s = times["ours"].step.cpu, times["peer"].step.cpu
    share_of_update = len(peer_rows) / cfg.recipe_batch  # the instances both train on

    def amortised(t: StepTiming) -> float:
        return flops / (t.micro + t.update * share_of_update) / peak

    result = Result(name, dtype, ours_s, peer_s, times["ours"].step.wall,
                    times["peer"].step.wall, useful_tokens / ours_s, useful_tokens / peer_s,
                    flops / ours_s / peak, flops / peer_s / peak,
                    flops / times["ours"].micro / peak, amortised(times["ours"]),
                    amortised(times["peer"]))
    console.print(f"  {name} {dtype}: ours {ours_s:.2f} CPU s/step, peer {peer_s:.2f} CPU s/step "
                  f"-> {result.ratio:.2f}x useful tokens/s; model FLOP/s "
                  f"{result.ours_flops_share:.0%} of matmul (peer {result.peer_flops_share:.0%}); "
                  f"wall {result.ours_wall_s:.2f} / {result.peer_wall_s:.2f} s "
                  f"({result.peer_wall_s / result.ours_wall_s:.2f}x)")
    console.print(f"    parts, ours: forward+backward {times['ours'].micro:.2f} s "
                  f"({result.ours_micro_share:.0%} of matmul), update {times['ours'].update:.2f} s;"
                  f" update per {cfg.recipe_batch} sequences (the recipe's accumulation): "
                  f"{result.ours_amortised_share:.0%} (peer {result.peer_amortised_share:.0%})")
    if cfg.profile:
        prof = profile_micro(ours_step)
        result.ours_floor_s = prof.floor(times["ours"].micro, times["ours"].update)
        console.print(f"    profile, ours: forward+backward {prof.gemm:.0%} matrix products, "
                      f"{prof.casts:.0%} dtype casts, {prof.other:.0%} other; with no other work "
                      f"{result.ours_floor_s:.2f} s/step: at most {peer_s / result.ours_floor_s:.2f}x"
                      f" the peer, {flops / result.ours_floor_s / peak:.0%} of matmul")
    return result


def packing_rows(cfg: BenchConfig) -> tuple[list[Row], list[Row], float, list[Row]]:
    """(packed rows for us, the same instances unpacked for the peer, instances per packed row
    over the whole data, all packed rows)."""
    from make_phase2_shards import make_phase2_shards  # this script's folder (run as a script)

    folder = cfg.shards or make_phase2_shards()
    packed = [r for r in shard_rows(folder) if len(r.input_ids) <= 512]
    source = f"shards {folder}"
    instances = unpack_rows(packed)
    fill = sum(len(r.input_ids) for r in instances) / (512 * len(instances))
    per_row = len(instances) / len(packed)
    console.print(f"phase-2 data ({source}): {len(instances)} instances, mean length "
                  f"{512 * fill:.0f} of 512 (padded rows are {fill:.1%} real tokens), "
                  f"{per_row:.2f} instances per packed row")
    # a seeded sample of rows; the peer gets the same instances, so both train on the same tokens
    pick = np.random.default_rng(0).choice(len(packed), cfg.packed_rows, replace=False)
    ours_rows = [packed[i] for i in sorted(pick)]
    return ours_rows, unpack_rows(ours_rows), per_row, packed


def attention_core_times(rows: list[Row], config: BertConfig, dtype: str,
                         cfg: BenchConfig) -> dict[str, Timing]:
    """One layer's attention core (after the QKV projection), forward + backward, training mode:
    `before` = SDPA on whole rows with attention dropout (its math path), under the (B, 1, T, T)
    block-diagonal mask when a row holds several instances or padding; `after` = `model.attention.attend_instances` (per instance, cheaper dropout mask)."""
    from model.attention import (
        attend_instances,
        attention_mask_4d,
        attention_plan,
        instance_ids,
        split_heads,
    )

    batch = collate(rows)
    ids = instance_ids(batch["attention_mask"], batch["sequence_ids"], batch["input_ids"])
    plan, mask = attention_plan(ids), attention_mask_4d(ids)
    B, T = batch["input_ids"].shape
    A, p = config.num_attention_heads, config.attention_probs_dropout_prob
    low = torch.bfloat16 if dtype.startswith("bf16") else torch.float32
    qkv = torch.randn(B, T, 3 * config.hidden_size, dtype=low, requires_grad=True)
    grad = torch.randn(B, T, config.hidden_size, dtype=low)

    def before() -> None:
        q, k, v = split_heads(qkv, A)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
        y.transpose(1, 2).reshape(B, T, -1).backward(grad)  # (B, A, T, D) -> (B, T, H)

    def after() -> None:
        y = (attend_instances(qkv, plan, A, p) if plan is not None
             else _whole_rows(qkv, A, p))
        y.backward(grad)

    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "bf16"
                else contextlib.nullcontext())
    with autocast:
        return time_alternating({"before": before, "after": after},
                                dataclasses.replace(cfg, steps=max(cfg.steps, 3)))


def _whole_rows(qkv: torch.Tensor, num_heads: int, p: float) -> torch.Tensor:
    from model.attention import split_heads
    from model.cpu_ops import attend

    B, T, _ = qkv.shape
    return attend(*split_heads(qkv, num_heads), None, p).transpose(1, 2).reshape(B, T, -1)


def attention_comparison(packed: list[Row], config: BertConfig, cfg: BenchConfig) -> None:
    """Attention per instance vs the block-diagonal mask, on sampled packed rows with 2+
    instances and on rows of one instance (the common case on these shards)."""
    multi = [r for r in packed if len(r.next_sentence_labels) > 1]
    single = [r for r in packed if len(r.next_sentence_labels) == 1 and len(r.input_ids) == 512]
    console.print(f"attention core, one layer, fwd+bwd, training (dropout "
                  f"{config.attention_probs_dropout_prob}): {len(multi) / len(packed):.1%} of "
                  f"packed rows hold 2+ instances")
    rng = np.random.default_rng(1)
    for name, pool in (("2+ instances", multi), ("one full instance", single)):
        if len(pool) < cfg.packed_rows:
            console.print(f"  too few rows with {name} ({len(pool)}): skipped")
            continue
        rows = [pool[i] for i in sorted(rng.choice(len(pool), cfg.packed_rows, replace=False))]
        lengths = [len(r.input_ids) for r in unpack_rows(rows)]
        for dtype in cfg.dtypes:
            t = attention_core_times(rows, config, dtype, cfg)
            console.print(f"  {len(rows)} rows, {name} {lengths}, {dtype}: SDPA on whole rows "
                          f"{t['before'].cpu * 1e3:.1f} ms, per instance {t['after'].cpu * 1e3:.1f}"
                          f" ms CPU -> {t['before'].cpu / t['after'].cpu:.2f}x; x "
                          f"{config.num_hidden_layers} layers saves "
                          f"{(t['before'].cpu - t['after'].cpu) * config.num_hidden_layers:.2f}"
                          " CPU s/step")


def summary_table(results: list[Result], peaks: dict[str, float], recipe_batch: int) -> Table:
    table = Table(title="BertForPreTraining training step: ours vs transformers")
    for column in ("setting", "dtype", "ours CPU s/step", "peer CPU s/step", "ours tok/s",
                   "peer tok/s",
                   "ratio", "ours FLOP/s share", "peer FLOP/s share",
                   f"ours share, update per {recipe_batch} seq",
                   f"peer share, update per {recipe_batch} seq"):
        table.add_column(column)
    for r in results:
        table.add_row(r.setting, r.dtype, f"{r.ours_s:.2f}", f"{r.peer_s:.2f}",
                      f"{r.ours_tokens_per_s:.0f}", f"{r.peer_tokens_per_s:.0f}",
                      f"{r.ratio:.2f}x", f"{r.ours_flops_share:.0%}", f"{r.peer_flops_share:.0%}",
                      f"{r.ours_amortised_share:.0%}", f"{r.peer_amortised_share:.0%}")
    table.caption = ("matmul peak (4096^3) measured here: " +
                     ", ".join(f"{k} {v / 1e9:.0f} GFLOP/s" for k, v in peaks.items()) +
                     "; targets: dense >= 1.25x, packed >= 1.8x useful tokens/s, "
                     "FLOP/s share >= 70% fp32 / 60% bf16")
    return table


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 timed step, seq 128 dense and the packing run only")
    parser.add_argument("--steps", type=int, default=BenchConfig.steps)
    parser.add_argument("--warmup", type=int, default=BenchConfig.warmup)
    parser.add_argument("--dtypes", default=",".join(BenchConfig.dtypes),
                        help="fp32, bf16 (autocast), bf16-params (bf16 weights, fp32 masters)")
    parser.add_argument("--dense", default="128x8,512x2",
                        help="dense runs as SEQxBATCH, comma separated ('' for none)")
    parser.add_argument("--packed_rows", type=int, default=BenchConfig.packed_rows,
                        help="512-token rows per step in the packing run (0: skip it)")
    parser.add_argument("--attention", action=argparse.BooleanOptionalAction, default=True,
                        help="also time one layer's attention core: per instance vs the mask")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads (0: torch's default); 1 is steadier on a shared machine")
    parser.add_argument("--shards", default=None,
                        help="packed 512-token shard folder for the packing run (default: the "
                             "shared corpus's phase-2 shards, made by make_phase2_shards.py)")
    parser.add_argument("--preset", default="bert_base", choices=sorted(PRESETS),
                        help="model shapes (bert_base is the benchmark; bert_tiny a smoke test)")
    parser.add_argument("--profile", action="store_true",
                        help="profile one forward + backward of ours per setting: matrix "
                             "products vs casts vs the rest, and the bound that gives")
    parser.add_argument("--malloc", default="training", choices=("training", "default"),
                        help="training: malloc keeps freed memory, as our trainer sets it on CPU "
                             "(training.launch.keep_freed_memory), for both models; default: "
                             "glibc's own settings")
    args = parser.parse_args(argv)
    cfg = BenchConfig(steps=1 if args.quick else args.steps, warmup=args.warmup,
                      dtypes=tuple(args.dtypes.split(",")), shards=args.shards,
                      packed_rows=args.packed_rows, profile=args.profile,
                      dense_shapes=((128, 8),) if args.quick else tuple(
                          tuple(int(n) for n in shape.split("x"))
                          for shape in args.dense.split(",") if shape))
    if args.threads:
        torch.set_num_threads(args.threads)
    kept = args.malloc == "training" and keep_freed_memory()
    console.print(f"config: {cfg}; torch {torch.__version__}, {torch.get_num_threads()} threads, "
                  f"malloc: {'keeps freed memory' if kept else 'default'}")

    # the data first: a failure there should not come after minutes of timing
    if cfg.packed_rows:
        ours_rows, peer_rows, per_row, all_packed = packing_rows(cfg)
    matmul = {d: matmul_flops_per_s(d, cfg.matmul_reps) for d in
              {torch.float32 if d == "fp32" else torch.bfloat16 for d in cfg.dtypes}}
    peaks = {d: matmul[torch.float32 if d == "fp32" else torch.bfloat16] for d in cfg.dtypes}
    console.print("matmul 4096^3: " + ", ".join(f"{str(d).removeprefix('torch.')} "
                                                f"{v / 1e9:.0f} GFLOP/s" for d, v in matmul.items()))
    ours, peer = build_models(PRESETS[args.preset]())
    results = []
    for seq, batch in cfg.dense_shapes:
        rows = dense_rows(batch, seq, ours.config.vocab_size, seed=seq)
        for dtype in cfg.dtypes:
            results.append(run_setting(f"dense {batch}x{seq}", rows, rows, dtype, ours, peer,
                                       cfg, peaks[dtype]))
    for dtype in cfg.dtypes if cfg.packed_rows else ():
        r = run_setting(f"packed {len(ours_rows)}x512 vs padded {len(peer_rows)}x512",
                        ours_rows, peer_rows, dtype, ours, peer, cfg, peaks[dtype])
        results.append(r)
        # over the whole data: both spend about the same time on any 512-token row, so the
        # useful-token ratio is (peer s/row / ours s/row) x instances per packed row
        row_speed = (r.peer_s / len(peer_rows)) / (r.ours_s / len(ours_rows))
        console.print(f"  whole data, {dtype}: {row_speed * per_row:.2f}x useful tokens/s "
                      f"({row_speed:.2f}x per row x {per_row:.2f} instances per packed row)")
        if r.ours_floor_s:
            bound = r.peer_s / len(peer_rows) / (r.ours_floor_s / len(ours_rows)) * per_row
            console.print(f"    with no work but matrix products, casts and update: at most "
                          f"{bound:.2f}x over the whole data")
    console.print(summary_table(results, peaks, cfg.recipe_batch))
    if cfg.packed_rows and args.attention:
        attention_comparison(all_packed, ours.config, cfg)
    return results


if __name__ == "__main__":
    main()
