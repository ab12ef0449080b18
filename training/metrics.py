"""Training metrics: per-step sums on the device, their summary, and the run's records.

A micro-batch's metrics are the objective's `metric_keys` (training/objectives.py: the loss
and each head's loss, correct and count) and `COUNTER_KEYS` (tokens, rows, micro-batches),
summed as one float64 vector on the device and read once per logging step (`all_reduce`).
`summarize` turns the sums into means and accuracies; `MetricsLog` writes each record to
`metrics.jsonl` and the trackers of `cadence.report_to` on rank 0; `plot_loss_curve` draws
`loss_curve.png`.
"""
from __future__ import annotations

import json
import os

import torch
from torch import Tensor

from common import storage
from training.config import PhaseConfig, PretrainConfig, to_dict
from training.objectives import COUNTER_KEYS, MLM_NSP
from training.ranks import Dist
from training.trackers import Trackers, log_artifacts, open_trackers

METRIC_KEYS = (*MLM_NSP.metric_keys, *COUNTER_KEYS)
"""The keys of a masked-LM + next-sentence run (`metric_keys` of any other objective)."""
HEADS = MLM_NSP.heads


def metric_keys(objective_keys: tuple[str, ...]) -> tuple[str, ...]:
    """Every key summed per micro-batch: the objective's, then the counters."""
    return (*objective_keys, *COUNTER_KEYS)


def metric_sums(out, batch: dict[str, Tensor], keys: tuple[str, ...] = METRIC_KEYS) -> Tensor:
    """One micro-batch's `keys` (the objective's, then `COUNTER_KEYS`) as a float64 vector on
    the device; a value the output lacks or leaves None counts 0. Summed there and read
    (`.tolist()`) once per logging step: an `.item()` per value would stall a GPU's queue
    once per key and micro-batch."""
    zero = out.loss.new_zeros((), dtype=torch.float64)  # not the loss's dtype: bf16 counts stop at 256
    counters = {"tokens": batch["attention_mask"].sum(),
                "samples": zero + batch["input_ids"].shape[0], "micro_batches": zero + 1}
    values = [counters[k] if k in counters else getattr(out, k, None) for k in keys]
    return torch.stack([zero if v is None else v.detach().to(torch.float64) for v in values])


def all_reduce(sums: Tensor, keys: tuple[str, ...] = METRIC_KEYS) -> dict[str, float]:
    """Metric sums (of `keys`) over all ranks, read on the host. `sums` stays on the model's
    device: NCCL, the backend on GPUs, reduces only device tensors."""
    sums = sums.clone()
    torch.distributed.all_reduce(sums)
    return dict(zip(keys, sums.tolist()))


def summarize(sums: dict[str, float], elapsed: float | None,
              heads: tuple[str, ...] = HEADS) -> dict[str, float]:
    """Means per micro-batch of the losses and each head's accuracy over its labelled items:
    the first head's always, another's where the window had labels for it (NSP on MLM-only
    rows has none); with `elapsed` seconds, tokens and rows per second."""
    n = max(sums["micro_batches"], 1)
    out = {"loss": sums["loss"] / n}
    for index, head in enumerate(heads):
        count = sums.get(f"{head}_count", 0.0)
        if index == 0 or count:
            out[f"{head}_loss"] = sums[f"{head}_loss"] / n
            out[f"{head}_accuracy"] = sums[f"{head}_correct"] / max(count, 1)
    if elapsed:
        out.update(tokens_per_s=sums["tokens"] / elapsed, samples_per_s=sums["samples"] / elapsed)
    return out


class MetricsLog:
    """metrics.jsonl and the trackers of `cadence.report_to` (training/trackers.py; TensorBoard by
    default) on rank 0: each record's numbers as `<split>/<name>` at its global step, the
    resolved config at the start, metrics.jsonl and loss_curve.png as artifacts at the end."""

    def __init__(self, output_dir: str, dist: Dist, resume_from: tuple[int, int] | None,
                 config: PretrainConfig | None = None):
        self.output_dir = output_dir
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.trackers: Trackers | None = None
        if not dist.is_main:
            return
        if resume_from is not None and os.path.exists(self.path):
            # Drop lines written after the checkpoint we resume from: they will be redone.
            kept = [r for r in read_metrics(output_dir)
                    if (r["phase_index"], r["step"]) <= resume_from]
            storage.atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        elif resume_from is None and os.path.exists(self.path):
            os.unlink(self.path)
        names = config.cadence.report_to if config is not None else ("tensorboard",)
        self.trackers = open_trackers(
            names, output_dir, os.path.basename(os.path.abspath(output_dir)),
            to_dict(config) if config is not None else None, resume=resume_from is not None)

    def write(self, record: dict) -> None:
        if self.trackers is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        prefix = record["split"]
        self.trackers.log_metrics({f"{prefix}/{key}": value for key, value in record.items()
                                   if isinstance(value, (int, float)) and key not in _RECORD_KEYS},
                                  record["global_step"])

    def close(self, loss_curve: bool = False, failed: bool = False) -> None:
        """With `loss_curve` (a complete run), draw loss_curve.png first; then hand the
        trackers metrics.jsonl and loss_curve.png, and end their runs (`failed`: a run that
        stopped on an error, whose tracker runs end FAILED)."""
        if self.trackers is None:
            return
        if failed:
            self.trackers.close(failed=True)
            return
        if loss_curve:
            plot_loss_curve(self.output_dir)
        log_artifacts(self.trackers, (self.path, os.path.join(self.output_dir, "loss_curve.png")))
        self.trackers.close()


_RECORD_KEYS = ("phase_index", "step", "global_step")


def read_metrics(output_dir: str) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def plot_loss_curve(output_dir: str) -> str:
    """loss_curve.png: training and validation loss and the first head's accuracy (MLM's for
    BERT's objectives) over global steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(output_dir)
    accuracy = next((k for r in records for k in r if k.endswith("_accuracy")), "mlm_accuracy")
    head = accuracy.removesuffix("_accuracy")
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for split, style in (("train", "-"), ("validation", "o--")):
        rows = [r for r in records if r["split"] == split]
        steps = [r["global_step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], style, label=f"{split} loss")
        ax_acc.plot(steps, [r.get(accuracy) for r in rows], style,
                    label=f"{split} {head.upper()} acc")
    for ax, title in ((ax_loss, "loss (all heads)"), (ax_acc, f"{head} accuracy")):
        ax.set_xlabel("optimizer step (all phases)")
        ax.set_title(title)
        ax.legend()
    path = os.path.join(output_dir, "loss_curve.png")
    with storage.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return path


def record(split: str, phase_index: int, phase: PhaseConfig, step: int, offset: int,
            summary: dict) -> dict:
    """A metrics.jsonl line: where in the run (phase, step, global step) and the summary."""
    return {"split": split, "phase_index": phase_index, "phase": phase.name, "step": step,
            "global_step": offset + step, **summary}
