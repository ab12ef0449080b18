"""One command that checks the training step on one GPU and measures it against NVIDIA's figures.

    python benchmarks/gpu_check.py                    # CUDA: tiny, then BERT-base and -large
    python benchmarks/gpu_check.py --device cpu       # the same checks on the tiny shapes
    python benchmarks/gpu_check.py --models bert_base --seq_lens 128 --profile
                                                      # + the profiler's busiest operators
    python benchmarks/gpu_check.py --paths dynamic,static
                                                      # each shape also with static shapes and
                                                      # the whole model compiled, side by side

For each model and sequence length (128, 512) it runs a short real pre-training: synthetic rows
(random tokens; at 512 packed as the shards pack them, ~1.15 instances per row) through the
real loader collate (`training.batching.collate`; on a GPU attention over whole rows under the
instance mask), the pre-training model with its padded vocabulary, bf16 autocast, fused
AdamW, gradient clipping and, on a GPU, compiled layers; with `--paths static` the batch padded to
the phase's static shapes (`training.batching.StaticShapes`) and, on a GPU, the whole model compiled
as one graph (`model.compiling.compile_model`; `--compile-mode reduce-overhead` adds CUDA graphs). It
checks, and stops with a clear line if one fails:

- no SDPA math-kernel fallback: the steps run under `sdpa_kernel` restricted to the flash,
  memory-efficient and cuDNN kernels (a math fallback is then an error), on CUDA;
- no host-device sync in forward, backward and update: `torch.cuda.set_sync_debug_mode("error")`
  on CUDA, `training.sync_check.SyncCounter` on CPU;
- a finite loss that falls over the steps on one repeated batch (it learns).

It prints rows/s and instances/s per GPU at 128 and 512, the model FLOPs utilisation (MFU:
`model_flops_per_row` x rows/s over the chip's dense bf16 peak, `PEAK_TFLOPS`), BERT-large's ratio to NVIDIA's per-GPU
figures (8x A100, DeepLearningExamples: 4,591 seq/s at 128 and 1,657 at 512, i.e. ~574 and ~207
per GPU), the peak memory against `training.memory.estimate`, and one fine-tuning step
(sequence classification) in bf16.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import shard_format
from model.bert import BertConfig
from model.compiling import compile_layers, compile_model
from model.encoders import PRESETS  # every arch's presets (bert_base, modernbert_base)
from model.heads import BertForPreTraining, BertForSequenceClassification
from training import memory
from training.batching import StaticShapes, collate, static_shapes_for
from training.config import ModelConfig
from training.forecast import PEAK_TFLOPS, model_flops_per_row  # with the forecast's profiles
from training.pretrain import to_device
from training.sync_check import SyncCounter

NVIDIA_PER_GPU = {128: 4591 / 8, 512: 1657 / 8}
"""BERT-large pre-training seq/s per A100 (NVIDIA DeepLearningExamples, 8x A100 80GB, bf16)."""
VOCAB = 30522


def peak_tflops(chip: str) -> float | None:
    """The dense bf16 peak of `chip` (torch.cuda.get_device_name), or None if not in the table."""
    return next((tflops for name, tflops in PEAK_TFLOPS if name in chip), None)


class CheckFailed(RuntimeError):
    """A check of this script failed (the message says which and where)."""


@dataclass(frozen=True)
class Shape:
    model: str
    seq_len: int
    micro_batch_size: int


def synthetic_rows(count: int, seq_len: int, seed: int,
                   vocab_size: int = VOCAB) -> list[shard_format.Row]:
    """Rows as make_shards writes them: at 128 one instance per row (90% long, 10% short, as
    `short_seq_prob`), at 512 packed (a second instance where >= 64 tokens are left)."""
    g = np.random.default_rng(seed)
    rows = []
    for _ in range(count):
        first = int(g.integers(seq_len // 2, seq_len + 1)) if g.random() < 0.9 else \
            int(g.integers(8, seq_len // 2))
        lengths = [first]
        if seq_len >= 512 and seq_len - first >= 64:
            lengths.append(int(g.integers(32, seq_len - first + 1)))
        n = sum(lengths)
        predictions = [max(1, memory.max_predictions(seq_len) * k // seq_len) for k in lengths]
        starts = np.cumsum([0, *lengths[:-1]])
        positions = np.concatenate([s + np.sort(g.choice(np.arange(1, k), p, replace=False))
                                    for s, k, p in zip(starts, lengths, predictions)])
        rows.append(shard_format.Row(
            input_ids=g.integers(1000, vocab_size, n), segment_ids=np.zeros(n, np.uint8),
            sequence_ids=np.repeat(np.arange(len(lengths)), lengths).astype(np.uint8),
            masked_lm_positions=positions, masked_lm_ids=g.integers(1000, vocab_size, len(positions)),
            next_sentence_labels=g.integers(0, 2, len(lengths)).astype(np.int8)))
    return rows


@contextlib.contextmanager
def strict_step(device: torch.device, counter: SyncCounter | None):
    """No math SDPA and no host sync inside (CUDA: the driver's check; CPU: `counter`)."""
    if device.type != "cuda":
        with counter if counter is not None else contextlib.nullcontext():
            yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
             SDPBackend.CUDNN_ATTENTION]
    torch.cuda.set_sync_debug_mode("error")
    try:
        with sdpa_kernel(fused):
            yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def autocast(device: torch.device):
    return torch.autocast(device.type, dtype=torch.bfloat16)


def print_profile(label: str, device: torch.device, step, steps: int = 3, rows: int = 15) -> None:
    """torch.profiler's busiest operators over `steps` more steps: by host (self CPU) time, and
    on a GPU by device time, with the step's wall time beside the device's busy time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    print(f"--- profile {label}: {steps} steps", flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows))
    if device.type == "cuda":
        print(events.table(sort_by="self_device_time_total", row_limit=rows))
        busy = sum(e.self_device_time_total for e in events) / steps / 1e3
        print(f"device busy {busy:.1f} ms per step", flush=True)


def static_shapes(seq_len: int) -> StaticShapes:
    """The static shapes pre-training takes for `synthetic_rows` (packed at 512) as for shards
    of theirs (`training.batching.static_shapes_for`)."""
    return static_shapes_for({"max_predictions_per_seq": memory.max_predictions(seq_len),
                              "packed": seq_len >= 512}, seq_len)


def pretraining_check(shape: Shape, device: torch.device, steps: int, compile_: bool,
                      profile: bool = False, static: bool = False,
                      compile_mode: str | None = None) -> dict:
    """Train `steps` steps on one batch; the timed ones after the warm-up steps. `static`: the
    batch padded to the phase's static shapes and, if `compile_`, the whole model compiled
    (`compile_model`, with torch.compile's `compile_mode`) instead of each layer."""
    config: BertConfig = ModelConfig(preset=shape.model).build(VOCAB, vocab_multiple=64)
    torch.manual_seed(0)
    model = BertForPreTraining(config).to(device).train()
    if compile_:
        # a fresh cache per shape: the models share BertLayer.forward's code object, and their
        # entries together pass dynamo's recompile limit, which fullgraph=True makes an error
        torch._dynamo.reset()
        if static:
            compile_model(model, mode=compile_mode)
        else:
            compile_layers(model.bert)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4 if shape.model != "bert_tiny"
                                  else 1e-3, fused=device.type == "cuda")
    rows = synthetic_rows(shape.micro_batch_size, shape.seq_len, seed=shape.seq_len)
    batch = to_device(collate(rows, max_seq_length=shape.seq_len,
                              attention_plan=device.type == "cpu",
                              static=static_shapes(shape.seq_len) if static else None,
                              batch_size=shape.micro_batch_size), device)
    instances = sum(len(r.next_sentence_labels) for r in rows)
    losses, counter = [], SyncCounter()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def train_step(strict: bool) -> torch.Tensor:
        with strict_step(device, counter) if strict else contextlib.nullcontext():
            with autocast(device):
                out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        # the update: checked on CUDA (fused AdamW keeps its step count there); on CPU AdamW
        # reads its host-side step count, which is no device sync
        with strict_step(device, None) if strict else contextlib.nullcontext():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return out.loss.detach()

    warmup = 2 if device.type == "cuda" else 1  # CUDA: compiling, autotuning, allocator
    for step in range(warmup + steps):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
        losses.append(train_step(strict=step >= 1))  # the first step compiles (and may sync)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if profile:
        print_profile(f"{shape.model} T={shape.seq_len}", device, lambda: train_step(False))
    losses = [x.item() for x in losses]
    if counter.ops:
        raise CheckFailed(f"{shape}: host-device syncs in the step: {sorted(set(counter.ops))}")
    if not all(np.isfinite(losses)) or not losses[-1] < losses[0]:
        raise CheckFailed(f"{shape}: the loss does not fall on a repeated batch: {losses}")
    estimate = memory.estimate(config, shape.seq_len, shape.micro_batch_size, ranks=1)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    predictions = sum(len(r.masked_lm_positions) for r in rows) / len(rows)
    return {"rows_per_s": shape.micro_batch_size * steps / seconds,
            "flops_per_row": model_flops_per_row(config, shape.seq_len, predictions),
            "instances_per_s": instances * steps / seconds, "losses": losses,
            "peak": peak, "estimate": estimate.total, "tokens": int(batch["input_ids"].numel())}


def finetune_check(model_name: str, device: torch.device) -> float:
    """One bf16 fine-tuning step of sequence classification on padded rows: its loss. The
    classifier takes no host-made layout; on a GPU its forward masks whole rows from the
    attention mask on the device, so the step is checked for syncs as well as SDPA kernels."""
    torch.manual_seed(0)
    model = BertForSequenceClassification(PRESETS[model_name](vocab_size=VOCAB), 2)
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    lengths = torch.tensor([128, 77, 40, 101])
    ids = torch.randint(1000, VOCAB, (4, 128)).to(device)
    mask = (torch.arange(128)[None] < lengths[:, None]).long().to(device)
    labels = torch.tensor([0, 1, 1, 0]).to(device)
    with strict_step(device, None), autocast(device):
        out = model(ids, attention_mask=mask, labels=labels)
    out.loss.backward()
    optimizer.step()
    loss = out.loss.item()
    if not np.isfinite(loss):
        raise CheckFailed(f"fine-tuning {model_name}: loss {loss}")
    return loss


def shapes(device: torch.device, models: list[str], seq_lens: list[int]) -> list[Shape]:
    """tiny (small batches on CPU), then the presets' micro-batch of 32 rows."""
    out = []
    for name in models:
        for seq_len in seq_lens:
            micro = 4 if device.type != "cuda" else 32
            out.append(Shape(name, seq_len, micro))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--models", default=None,
                   help="comma-separated presets (default: bert_tiny on CPU; bert_tiny, "
                        "bert_base, bert_large on CUDA)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default 10, CPU 3)")
    p.add_argument("--no-compile", action="store_true", help="eager layers on the GPU too")
    p.add_argument("--seq_lens", default="128,512", help="sequence lengths to train at")
    p.add_argument("--profile", action="store_true",
                   help="print torch.profiler's busiest operators for each shape")
    p.add_argument("--paths", default="dynamic", help="comma-separated: dynamic (batches as "
                   "small as their rows, compiled layers), static (static shapes, the whole "
                   "model compiled); dynamic,static runs each shape both ways, side by side")
    p.add_argument("--compile-mode", default=None,
                   help="torch.compile mode of the static path's whole model, e.g. "
                        "reduce-overhead (CUDA graphs); default: torch's")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here (torch.cuda.is_available() is False); "
              "run with --device cpu for the tiny shapes")
        return 2
    if device.type == "cuda":
        torch.set_float32_matmul_precision("high")
    models = (args.models.split(",") if args.models else
              ["bert_tiny"] if device.type != "cuda" else ["bert_tiny", "bert_base", "bert_large"])
    steps = args.steps or (10 if device.type == "cuda" else 3)
    compile_ = device.type == "cuda" and not args.no_compile
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"torch {torch.__version__}; compile {compile_}; {steps} timed steps")
    paths = args.paths.split(",")
    if not set(paths) <= {"dynamic", "static"}:
        p.error(f"--paths {args.paths}: expected dynamic, static or dynamic,static")
    try:
        for shape, path in ((s, path) for s in shapes(device, models, [
                int(n) for n in args.seq_lens.split(",")]) for path in paths):
            r = pretraining_check(shape, device, steps, compile_, args.profile,
                                  static=path == "static", compile_mode=args.compile_mode)
            label = " static" if path == "static" else ""
            line = (f"{shape.model:10s} T={shape.seq_len:3d} B={shape.micro_batch_size:2d}"
                    f"{label}: "
                    f"{r['rows_per_s']:8.1f} rows/s/GPU, {r['instances_per_s']:8.1f} "
                    f"instances/s/GPU; loss {r['losses'][0]:.3f} -> {r['losses'][-1]:.3f}; "
                    f"no math SDPA, no sync")
            peak = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" \
                else None
            if peak:
                line += f"; MFU {r['rows_per_s'] * r['flops_per_row'] / (peak * 1e12):.1%}"
            if shape.model == "bert_large":
                nvidia = NVIDIA_PER_GPU[shape.seq_len]
                line += f"; vs NVIDIA {nvidia:.0f} seq/s/GPU: {r['rows_per_s'] / nvidia:.2f}x"
            if r["peak"] is not None:
                line += (f"; peak {r['peak'] / memory.GIB:.1f} GiB vs estimate "
                         f"{r['estimate'] / memory.GIB:.1f} GiB "
                         f"({r['peak'] / r['estimate']:.2f}x)")
            print(line, flush=True)
        for name in models:
            print(f"{name:10s} fine-tuning step, bf16: loss {finetune_check(name, device):.4f}",
                  flush=True)
    except CheckFailed as failure:
        print(f"gpu_check FAILED: {failure}")
        return 1
    print("gpu_check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
