"""The forecast before a launch: data sizes, steps, epochs, hours, GPU-hours, cost, memory and
disk of a pre-training run, without training (`bert-pretrain --plan`, `bert-dag --plan`).

    bert-pretrain --preset large --plan --hardware h200 --gpus 8 [--price_per_gpu_hour 3.5]
    bert-pretrain --preset tiny --plan --calibrate 3     # + 3 real steps here, saved
    bert-dag --preset large --plan --json                # the same, for machines

Throughput: `PROFILES`, rows/s per GPU by GPU model, model preset and sequence length.
- H200: measured (benchmarks/RESULTS.md 16e for bert_large, 16a for bert_base and bert_tiny;
  `benchmarks/gpu_check.py`, compiled layers, bf16, micro-batch 32, one GPU).
- The other GPUs: MFU-based. rows/s = MFU x the chip's dense bf16 peak / `model_flops_per_row`,
  the MFU that of the H200 row of the same preset and sequence length, the peaks from NVIDIA's
  datasheets (`PEAK_TFLOPS`: A100 312 TF/s, H100 SXM 989, H200 989). A sequence length not
  measured takes the MFU of the nearest measured one. An assumption, stated as such in the
  output: a chip of the same peak runs at the same rows/s.
- `cpu-this-machine`: no figure until `--calibrate N` measures one.
- `--calibrate N`: N real optimizer steps of the run's model on the first phase's shape, on
  this machine, in this process (random tokens of the phase's shape: the shards need not exist),
  rows/s after one warm-up step; the forecast is printed again with it and saved to
  `<output_dir>/forecast.json`.
Ranks scale linearly (an assumption): hours = steps x global batch / (rows/s per GPU x GPUs).

Data per phase: from the shards' manifest where they are built (train split: instances, rows,
tokens, bytes), else estimated from the corpus's text bytes: tokens = text / `BYTES_PER_TOKEN`,
instances = dupe_factor x tokens / (max_seq_length x fill), `FILL` measured on make_shards'
output. Memory per rank: training/memory.py `estimate`. Disk: the shards, and `keep_checkpoints`
checkpoints of `CHECKPOINT_BYTES_PER_PARAMETER` (DeepSpeed's module weights plus the fp32
master weights and Adam's two moments), plus the fp32 Hugging Face export.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from common import storage

# ---------------------------------------------------------------- measured ratios
# (benchmarks/forecast_data_prep.py forecasts the data stages' hours from the same ratios)
BYTES_PER_WORD = 5.61  # shared Wikipedia minidump + Gutenberg books, whitespace words
BYTES_PER_TOKEN = 4.19  # the same text through bert-base-uncased's WordPiece
TEXT_PER_BZ2_BYTE = 1.31  # extract_wikipedia's passages per byte of .xml.bz2 (minidump)
FILL = {128: 0.914, 256: 0.924, 512: 0.771}
"""Tokens per row slot of unpacked shards (train split), by max_seq_length: 128 and 512 from
bench_local_memory.py's shards of replicated Wikipedia (dupe_factor 10: 3.12M rows at 128,
262k at 512), 256 from the tiny flow's shards of the bundled sample. Short instances
(`short_seq_prob`) and segment ends leave the rest as padding."""
PACKED_FILL = 0.99
"""Tokens per row slot of packed shards (the books' 512-token shards: 0.990; RESULTS.md 4.0a)."""
SHARD_BYTES_PER_TOKEN = 4.7
"""Shard bytes per token (rows, masks, tar headers): 4.55 at 128 (568 B a row, 125 tokens),
4.57 at 512 unpacked, 4.6 packed, 4.85 at 128 on the tiny sample's small shards."""

# ---------------------------------------------------------------- hardware
PEAK_TFLOPS = (("H200 NVL", 835.0), ("H200", 989.0), ("H100 NVL", 835.0), ("H100 PCIe", 756.0),
               ("H100", 989.0), ("A100", 312.0))
"""Dense bf16 peak (TF/s) by the name the driver gives (first match; SXM parts unless named;
NVIDIA's datasheets)."""
GIB = 2**30


@dataclass(frozen=True)
class Profile:
    """One kind of machine the forecast knows: its chip, memory and measured rates."""
    name: str
    """The `--hardware` name."""
    chip: str
    """The name torch gives the device (matched against `PEAK_TFLOPS`), or "cpu"."""
    memory_gib: float
    """Memory per GPU (datasheet); 0: not a GPU."""
    peak_tflops: float = 0.0
    """Dense bf16 peak (datasheet); 0: unknown."""


PROFILES = {p.name: p for p in (
    Profile("h200", "NVIDIA H200", 141, 989.0),
    Profile("h100", "NVIDIA H100 80GB HBM3", 80, 989.0),
    Profile("a100-80gb", "NVIDIA A100-SXM4-80GB", 80, 312.0),
    Profile("a100-40gb", "NVIDIA A100-SXM4-40GB", 40, 312.0),
    Profile("cpu-this-machine", "cpu", 0),
)}
MEASURED = {  # (profile, model preset, max_seq_length): (rows/s per GPU, source)
    ("h200", "bert_large", 128): (898.0, "RESULTS.md 16e"),
    ("h200", "bert_large", 512): (360.0, "RESULTS.md 16e"),
    ("h200", "bert_base", 128): (855.0, "RESULTS.md 16a"),
    ("h200", "bert_base", 512): (926.0, "RESULTS.md 16a"),
    ("h200", "bert_tiny", 128): (2605.0, "RESULTS.md 16a"),
    ("h200", "bert_tiny", 512): (2394.0, "RESULTS.md 16a"),
}
"""Rows/s per GPU measured here (benchmarks/gpu_check.py: micro-batch 32, bf16, compiled
layers, vocabulary 30522, 20 predictions a row at 128 and 80 at 512, rows packed at 512)."""
MFU_PROFILE = "h200"
"""The measured profile whose MFU the other GPUs' rates take."""


def model_flops_per_row(config, seq_len: int, predictions: float) -> float:
    """Training FLOPs of one row (forward and backward, 3x the forward's multiply-adds x 2):
    the encoder's projections and feed-forward, attention's two T x T products, and the MLM
    head (transform and decoder) at the `predictions` masked positions:
    6 L (4 H^2 + 2 H FF) T + 12 L T^2 H + 6 (H^2 + V H) P."""
    from model.encoders import flops_per_token
    hidden = config.hidden_size
    return (flops_per_token(config, seq_len) * seq_len
            + 6 * (hidden ** 2 + config.vocab_size * hidden) * predictions)


@dataclass(frozen=True)
class Rate:
    """Rows/s per GPU and where the figure comes from."""
    rows_per_s: float | None
    basis: str


def measured_rate(profile: str, model_name: str, seq_len: int, bert_config) -> Rate:
    """`profile`'s rows/s for the preset `model_name` at `seq_len`: measured, or the
    `MFU_PROFILE`'s MFU at the nearest measured length times the chip's peak."""
    if (profile, model_name, seq_len) in MEASURED:
        rows, source = MEASURED[profile, model_name, seq_len]
        return Rate(rows, f"measured ({source})")
    peak = PROFILES[profile].peak_tflops
    lengths = [t for (p, m, t) in MEASURED if p == MFU_PROFILE and m == model_name]
    if not lengths:  # another encoder's MFU says nothing of this one's (ModernBERT's)
        measured = ", ".join(sorted({m for (_, m, _) in MEASURED}))
        return Rate(None, f"no measured rate for {model_name} (measured: {measured}); "
                          "--calibrate N measures it here")
    if not peak:
        return Rate(None, f"no measured rate on {profile}; --calibrate N measures it here")
    t0 = min(lengths, key=lambda t: (abs(t - seq_len), t))
    from model.encoders import PRESETS
    reference = PRESETS[model_name](vocab_size=30522)
    rows0, source = MEASURED[MFU_PROFILE, model_name, t0]
    mfu = rows0 * model_flops_per_row(reference, t0, max_predictions(t0, reference.masked_share)) \
        / (PEAK_TFLOPS_OF[MFU_PROFILE] * 1e12)
    rows = mfu * peak * 1e12 / model_flops_per_row(
        bert_config, seq_len, max_predictions(seq_len, bert_config.masked_share))
    return Rate(rows, f"MFU {mfu:.3f} ({MFU_PROFILE} {model_name} @{t0}, {source}) x "
                      f"{peak:.0f} TF/s (datasheet)")


PEAK_TFLOPS_OF = {name: p.peak_tflops for name, p in PROFILES.items()}


def max_predictions(seq_len: int, share: float = 0.15625) -> int:
    """Masked positions per row at `share` of its tokens (training/memory.py's)."""
    from training.memory import max_predictions as predictions
    return predictions(seq_len, share)


def this_machine() -> str:
    """The profile of the GPU torch sees here (by the name the driver gives), else
    `cpu-this-machine`."""
    import torch
    if not torch.cuda.is_available():
        return "cpu-this-machine"
    return profile_of_chip(torch.cuda.get_device_name(0))


def profile_of_chip(chip: str) -> str:
    """The profile of a GPU by its driver name ("NVIDIA H200" -> h200); unknown chips take
    `cpu-this-machine` (no figure until calibrated)."""
    for key, profile in (("H200", "h200"), ("H100", "h100"), ("A100-SXM4-80GB", "a100-80gb"),
                         ("A100 80GB", "a100-80gb"), ("A100", "a100-40gb")):
        if key in chip:
            return profile
    return "cpu-this-machine"


# ---------------------------------------------------------------- the run, read once

@dataclass(frozen=True)
class PhasePlan:
    """What the forecast reads of one phase."""
    name: str
    max_seq_length: int
    micro_batch_size: int
    global_batch_size: int
    steps: int
    train_shards: str


@dataclass(frozen=True)
class RunShape:
    """What the forecast reads of a `PretrainConfig` (`run_shape`: the one place that reads
    its fields)."""
    model_name: str
    model: Any  # model.bert.BertConfig
    zero_stage: int
    precision: str
    keep_checkpoints: int
    output_dir: str
    phases: tuple[PhasePlan, ...]


def run_shape(config, vocab_size: int | None = None) -> RunShape:
    """The model shape, ZeRO stage, precision, checkpoints kept and phases of `config`
    (a `training.config.PretrainConfig`); the vocabulary: `vocab_size`, else `vocab_dir`'s,
    else the preset's."""
    from model.encoders import PRESETS
    if not config.model.preset:
        raise ValueError("--plan: init_from's checkpoint decides the model's shape; name the "
                         "matching preset too (--set model.preset=bert_base, "
                         "pretrain.model.preset in the flow)")
    name = config.model.preset
    vocab_dir = config.data.vocab_dir
    if vocab_size is None and vocab_dir and os.path.exists(vocab_dir):
        from common.tokenization import read_vocab
        vocab_size = len(read_vocab(vocab_dir))
    vocab_size = vocab_size or PRESETS[name]().vocab_size
    phases = tuple(PhasePlan(p.name, p.max_seq_length, p.micro_batch_size, p.global_batch_size,
                             p.steps, p.train_shards) for p in config.phases)
    # the embedding padded to a multiple of 64 rows, as the run builds it (training/preflight.py)
    return RunShape(name, config.model.build(vocab_size, vocab_multiple=64),
                    config.engine.zero_stage,
                    config.engine.precision, config.cadence.keep_checkpoints, config.output_dir,
                    phases)


# ---------------------------------------------------------------- data per phase

@dataclass(frozen=True)
class PhaseData:
    """A phase's training data: the shards' train split."""
    instances: int
    rows: int
    tokens: int
    bytes: int
    source: str
    """"manifest <path>" or "estimate: ..." (the ratios used)."""


def shards_data(path: str) -> PhaseData | None:
    """The train split of the shards at `path` from their manifest, None when not built."""
    manifest = storage.read_manifest(path) if path else None
    if manifest is None:
        return None
    train = [s for s in manifest.get("shards", []) if s.get("split", "train") == "train"]
    return PhaseData(sum(s["num_instances"] for s in train), sum(s["num_rows"] for s in train),
                     sum(s["num_tokens"] for s in train), sum(s["bytes"] for s in train),
                     f"manifest {path}")


def fill(seq_len: int, packed: bool) -> float:
    """Tokens per row slot (`FILL` at the nearest measured length; `PACKED_FILL` packed)."""
    return PACKED_FILL if packed else FILL[min(FILL, key=lambda t: (abs(t - seq_len), t))]


def estimate_data(text_bytes: float, seq_len: int, dupe_factor: int, packed: bool = False,
                  validation_fraction: float = 0.0) -> PhaseData:
    """A phase's train split from the corpus's text bytes (see the module docstring)."""
    share = 1.0 - validation_fraction
    tokens = dupe_factor * text_bytes / BYTES_PER_TOKEN * share
    used = fill(seq_len, packed)
    unpacked_fill = fill(seq_len, False)
    instances = tokens / (seq_len * unpacked_fill)
    rows = tokens / (seq_len * used)
    return PhaseData(round(instances), round(rows), round(tokens),
                     round(tokens * SHARD_BYTES_PER_TOKEN),
                     f"estimate: {dupe_factor} x {text_bytes / 1e6:,.2f} MB text / "
                     f"{BYTES_PER_TOKEN} B per token / ({seq_len} x fill {unpacked_fill})"
                     + (f", packed rows at fill {used}" if packed else ""))


# ---------------------------------------------------------------- the forecast

@dataclass(frozen=True)
class Hardware:
    """The machine the forecast is for."""
    profile: str
    gpus: int
    price_per_gpu_hour: float = 0.0
    calibrated_rows_per_s: float | None = None
    """Rows/s per device measured here (`calibrate`), for every phase's first-phase shape."""


def concrete_precision(shape: RunShape, hardware: Hardware) -> RunShape:
    """precision=auto as a run on `hardware` takes it (training/config.py `concrete_precision`):
    bf16 with ZeRO >= 1 on a GPU profile (every one has bf16 units), or on this machine's CPU
    where it multiplies bf16 natively (`preflight.bf16_hardware`), else fp32."""
    if shape.precision != "auto":
        return shape
    if PROFILES[hardware.profile].memory_gib > 0:
        bf16 = True
    else:
        from training.preflight import bf16_hardware
        bf16 = bf16_hardware(on_gpu=False)
    return dataclasses.replace(shape, precision="bf16" if bf16 and shape.zero_stage >= 1
                               else "fp32")


def checkpoint_bytes_per_parameter(shape: RunShape) -> int:
    """DeepSpeed's module weights (2 bytes in bf16/fp16, 4 in fp32) plus, with ZeRO, the fp32
    master weights and Adam's two moments (12), without ZeRO Adam's two fp32 moments (8)."""
    weights = 4 if shape.precision == "fp32" else 2
    return weights + (12 if shape.zero_stage >= 1 else 8)


def phase_forecast(shape: RunShape, phase: PhasePlan, data: PhaseData | None,
                   hardware: Hardware, first: bool) -> dict:
    """One phase's row of the forecast."""
    from training.memory import estimate
    if hardware.calibrated_rows_per_s and first:
        rate = Rate(hardware.calibrated_rows_per_s, "calibrated (measured here)")
    else:
        rate = measured_rate(hardware.profile, shape.model_name, phase.max_seq_length,
                             shape.model)
    rows = phase.steps * phase.global_batch_size
    seconds = rows / (rate.rows_per_s * hardware.gpus) if rate.rows_per_s else None
    memory = estimate(shape.model, phase.max_seq_length, phase.micro_batch_size,
                      ranks=hardware.gpus, precision=shape.precision,
                      zero_stage=shape.zero_stage)
    return {"phase": phase.name, "max_seq_length": phase.max_seq_length, "steps": phase.steps,
            "global_batch_size": phase.global_batch_size, "rows_trained": rows,
            "data": dataclasses.asdict(data) if data else None,
            "epochs": rows / data.rows if data and data.rows else None,
            "rows_per_s_per_gpu": rate.rows_per_s, "rate_basis": rate.basis,
            "hours": seconds / 3600 if seconds is not None else None,
            "peak_memory_per_rank_bytes": memory.total}


def forecast(shape: RunShape, data: list[PhaseData | None], hardware: Hardware,
             stages: list[dict] | None = None) -> dict:
    """The whole forecast as a JSON-able dict (`render` prints it)."""
    shape = concrete_precision(shape, hardware)
    phases = [phase_forecast(shape, p, d, hardware, i == 0)
              for i, (p, d) in enumerate(zip(shape.phases, data))]
    hours = [p["hours"] for p in phases]
    total = sum(hours) if all(h is not None for h in hours) else None
    from training.memory import parameter_count
    params = parameter_count(shape.model)
    per_checkpoint = params * checkpoint_bytes_per_parameter(shape)
    profile = PROFILES[hardware.profile]
    return {
        "model": shape.model_name, "parameters": params, "precision": shape.precision,
        "zero_stage": shape.zero_stage, "hardware": hardware.profile, "gpus": hardware.gpus,
        "gpu_memory_bytes": int(profile.memory_gib * 1e9),
        "calibrated_rows_per_s": hardware.calibrated_rows_per_s,
        "stages": stages or [], "phases": phases, "hours": total,
        "gpu_hours": total * hardware.gpus if total is not None else None,
        "price_per_gpu_hour": hardware.price_per_gpu_hour,
        "cost": total * hardware.gpus * hardware.price_per_gpu_hour
        if total is not None and hardware.price_per_gpu_hour else None,
        "disk": {"shards_bytes": sum(d.bytes for d in data) if all(data) else None,
                 "checkpoint_bytes": per_checkpoint,
                 "checkpoints_kept": shape.keep_checkpoints,
                 "export_bytes": params * 4,
                 "checkpoints_total_bytes": per_checkpoint * shape.keep_checkpoints + params * 4},
        "assumptions": assumptions(hardware),
    }


def assumptions(hardware: Hardware) -> list[str]:
    notes = [f"{hardware.gpus} GPU(s), rows/s scaling linearly with them",
             ("rows/s per GPU from training/forecast.py PROFILES (measured, or MFU-based: "
             "datasheet bf16 peaks)"),
             (f"data estimates: {BYTES_PER_TOKEN} text bytes per WordPiece token, fill "
             f"{FILL} unpacked, {PACKED_FILL} packed")]
    if not hardware.price_per_gpu_hour:
        notes.append("no price given (--price_per_gpu_hour): cost not shown")
    return notes


# ---------------------------------------------------------------- output

def human_bytes(n: float | None) -> str:
    """A byte count as text ("4.7 GB"; None: "unknown")."""
    if n is None:
        return "unknown"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"


def _num(x: float | None, digits: int = 2) -> str:
    return "unknown" if x is None else f"{x:,.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
    return [fmt(header), fmt(["-" * w for w in widths]), *map(fmt, rows)]


def render(fc: dict) -> str:
    """The forecast as readable aligned text."""
    lines = [(f"Forecast: {fc['model']} ({fc['parameters'] / 1e6:,.1f}M parameters, "
             f"{fc['precision']}, ZeRO-{fc['zero_stage']}) on {fc['gpus']} x {fc['hardware']}")]
    if fc["stages"]:
        lines += ["", "Data", *_table(["stage", "size", "from"], [
            [s["stage"], s["size"], s["source"]] for s in fc["stages"]])]
    lines += ["", "Phases", *_table(
        ["phase", "T", "steps", "batch", "instances", "rows", "tokens", "epochs",
         "rows/s/GPU", "hours", "memory/rank"],
        [[p["phase"], str(p["max_seq_length"]), f"{p['steps']:,}", str(p["global_batch_size"]),
          f"{p['data']['instances']:,}" if p["data"] else "unknown",
          f"{p['data']['rows']:,}" if p["data"] else "unknown",
          f"{p['data']['tokens']:,}" if p["data"] else "unknown",
          _num(p["epochs"]), _num(p["rows_per_s_per_gpu"], 1), _num(p["hours"], 3),
          f"{p['peak_memory_per_rank_bytes'] / GIB:.1f} GiB"] for p in fc["phases"]])]
    lines += [""] + [f"{p['phase']} data: {p['data']['source'] if p['data'] else 'unknown'}; "
                     f"rate: {p['rate_basis']}" for p in fc["phases"]]
    disk = fc["disk"]
    cost = f", cost {fc['cost']:,.2f} at {fc['price_per_gpu_hour']}/GPU-hour" if fc["cost"] \
        else ""
    memory = f" (GPU: {fc['gpu_memory_bytes'] / GIB:.0f} GiB)" if fc["gpu_memory_bytes"] else ""
    lines += ["", (f"Total: {_num(fc['hours'], 3)} hours, {_num(fc['gpu_hours'], 2)} GPU-hours"
              f"{cost}; peak memory per rank "
              f"{max(p['peak_memory_per_rank_bytes'] for p in fc['phases']) / GIB:.1f} GiB"
              f"{memory}"),
              (f"Disk: shards {human_bytes(disk['shards_bytes'])}, checkpoints "
              f"{disk['checkpoints_kept']} x {human_bytes(disk['checkpoint_bytes'])} + export "
              f"{human_bytes(disk['export_bytes'])} = "
              f"{human_bytes(disk['checkpoints_total_bytes'])}"),
              "Assumptions: " + "; ".join(fc["assumptions"])]
    return "\n".join(lines)


# ---------------------------------------------------------------- flags

def add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """The forecast's flags, declared once for `bert-pretrain` and `bert-dag`."""
    group = parser.add_argument_group("forecast (no training)")
    group.add_argument("--plan", action="store_true",
                       help="print the forecast (data, steps, epochs, hours, cost, memory, "
                            "disk) and exit; starts nothing")
    group.add_argument("--hardware", default=None, metavar="PROFILE",
                       help=f"hardware profile: {', '.join(PROFILES)} (default: this machine's)")
    group.add_argument("--gpus", type=int, default=None,
                       help="GPUs in all (default: the launch's ranks)")
    group.add_argument("--price_per_gpu_hour", type=float, default=0.0,
                       help="price of one GPU-hour (0: cost not shown)")
    group.add_argument("--calibrate", type=int, default=0, metavar="N",
                       help="with --plan: N real steps here first; writes "
                            "<output_dir>/forecast.json")
    group.add_argument("--input_bytes", type=float, default=None,
                       help="with --plan: the corpus's text bytes, where the inputs are remote")
    group.add_argument("--json", action="store_true", help="with --plan: print JSON")


def hardware_from_args(args: argparse.Namespace, default_gpus: int) -> Hardware:
    """The `Hardware` the flags name; ValueError (one line listing the profiles) for an
    unknown profile."""
    profile = args.hardware or this_machine()
    if profile not in PROFILES:
        raise ValueError(f"--hardware {profile!r}: unknown profile (known: "
                         f"{', '.join(PROFILES)})")
    gpus = args.gpus or default_gpus
    if gpus < 1:
        raise ValueError(f"--gpus {gpus}: must be >= 1")
    if args.price_per_gpu_hour < 0 or args.calibrate < 0:
        raise ValueError("--price_per_gpu_hour and --calibrate must be >= 0")
    return Hardware(profile, gpus, args.price_per_gpu_hour)


# ---------------------------------------------------------------- calibration

def random_batch(shape: RunShape, phase: PhasePlan, seed: int = 0) -> dict:
    """One micro-batch of `phase`'s shape of random tokens: every slot a token, the encoder's
    recipe's share of masked positions per row, one instance per row with an NSP label."""
    import torch
    g = torch.Generator().manual_seed(seed)
    b, t = phase.micro_batch_size, phase.max_seq_length
    m = max_predictions(t, shape.model.masked_share)
    vocab = shape.model.vocab_size
    positions = torch.stack([torch.randperm(t - 1, generator=g)[:m].sort().values + 1
                             for _ in range(b)])  # (B, M), never [CLS]
    return {"input_ids": torch.randint(5, vocab, (b, t), generator=g),
            "token_type_ids": torch.zeros(b, t, dtype=torch.long),
            "attention_mask": torch.ones(b, t, dtype=torch.long),
            "masked_lm_positions": positions,
            "masked_lm_ids": torch.randint(5, vocab, (b, m), generator=g),
            "next_sentence_label": torch.randint(0, 2, (b,), generator=g)}


def calibrate(shape: RunShape, steps: int) -> float:
    """Rows/s per device of `steps` optimizer steps (AdamW, clipping) of the run's model on its
    first phase's micro-batch shape, here, after one warm-up step (not timed)."""
    import torch

    from model.heads import BertForPreTraining
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = BertForPreTraining(shape.model).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phase = shape.phases[0]
    batch = {k: v.to(device) for k, v in random_batch(shape, phase).items()}
    low = device.type == "cuda" and shape.precision != "fp32"

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=low):
            loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up: allocations, kernels' first use
    if device.type == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return phase.micro_batch_size * steps / (time.perf_counter() - started)


def write_forecast(output_dir: str, fc: dict) -> str:
    """`<output_dir>/forecast.json`, atomically."""
    path = storage.join(output_dir, "forecast.json")
    storage.makedirs(output_dir)
    storage.atomic_write_json(path, fc)
    return path


def run_plan(shape: RunShape, data: list[PhaseData | None], args: argparse.Namespace,
             default_gpus: int, stages: list[dict] | None = None, out=None) -> int:
    """Print the forecast (`--json`: as JSON); with `--calibrate N` measure here, print it
    again with the measured rate and save it. Shared by both commands' `--plan`."""
    out = out or sys.stdout
    hardware = hardware_from_args(args, default_gpus)
    fc = forecast(shape, data, hardware, stages)
    if args.calibrate:
        if not args.json:
            print(render(fc), file=out)
            print(f"\nCalibrating: {args.calibrate} steps of {shape.model_name} at "
                  f"{shape.phases[0].micro_batch_size} x {shape.phases[0].max_seq_length} "
                  "(random tokens) on this machine ...", file=out, flush=True)
        rate = calibrate(shape, args.calibrate)
        hardware = dataclasses.replace(hardware, profile=this_machine(),
                                       calibrated_rows_per_s=rate)
        fc = forecast(shape, data, hardware, stages)
        fc["calibrated"] = {"steps": args.calibrate, "rows_per_s": rate,
                            "device": hardware.profile}
        path = write_forecast(shape.output_dir, fc)
        if not args.json:
            print("\n" + render(fc) + f"\nSaved to {path}", file=out)
    if args.json:
        print(json.dumps(fc, indent=2), file=out)
    elif not args.calibrate:
        print(render(fc), file=out)
    return 0


def pretrain_plan(config, args: argparse.Namespace) -> int:
    """`bert-pretrain --plan`: each phase's data from its shards' manifest where built."""
    shape = run_shape(config)
    data = [shards_data(p.train_shards) for p in shape.phases]
    return run_plan(shape, data, args, default_gpus=int(os.environ.get("WORLD_SIZE", "1")))
