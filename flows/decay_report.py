"""The report's decay section: each decay (WSD's anneal of a kept checkpoint of the stable
run) as a row, and as its own curve beside the stable run's (`decay_curves.png`): MLM loss
against the global step, a decay's steps counted on from the checkpoint it started at."""
from __future__ import annotations

import os

from common import storage
from flows.stages import StageResult
from training.checkpoint import phase_index_of
from training.metrics import read_metrics

METRIC = "mlm_loss"


def decay_runs(stages: list[StageResult]) -> list[tuple[StageResult, StageResult]]:
    """(stable checkpoint's export, decay run) pairs, in the flow's order (each decay's
    `stable` stage precedes its `decay` stage)."""
    pairs, start = [], None
    for stage in stages:
        if stage.stage == "stable":
            start = stage
        elif stage.stage == "decay" and start is not None:
            pairs.append((start, stage))
    return pairs


def _offset(run_dir: str, tag: str) -> int:
    """Global step of the stable run's checkpoint `tag`."""
    from training.config import load_saved
    phases = load_saved(os.path.join(run_dir, "config.json")).phases
    return sum(p.steps for p in phases[:phase_index_of(tag)]) + int(tag.rpartition("step")[2])


def _losses(run_dir: str, split: str, offset: int = 0) -> list[tuple[int, float]]:
    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return []
    return [(offset + r["global_step"], r[METRIC]) for r in read_metrics(run_dir)
            if r.get("split") == split and METRIC in r]


def decay_section(stages: list[StageResult], folder: str) -> list[str]:
    """Markdown lines (none without decays) and `decay_curves.png` in `folder`."""
    pairs = decay_runs(stages)
    if not pairs:
        return []
    stable = pairs[0][0].manifest["run"]
    lines = ["", "## Decays (WSD)", "",
             ("| decay | from | steps | data | last train MLM loss | last validation MLM loss | "
             "stable run's validation MLM loss there |"), "|---|---|---:|---|---:|---:|---:|"]
    curves = {"stable run": _losses(stable, "train")}
    stable_valid = dict(_losses(stable, "validation"))
    for start, run in pairs:
        config = run.manifest["config"]["decay"]
        phase = config["phases"][0]
        offset = _offset(stable, start.manifest["tag"])
        final = run.manifest.get("final_metrics", {})
        cells = [final.get(split, {}).get(METRIC) for split in ("train", "validation")]
        there = stable_valid.get(offset)
        shown = ["-" if v is None else f"{v:.4f}" for v in (*cells, there)]
        data = os.path.basename(os.path.dirname(phase["train_shards"].rstrip("/") + "/"))
        lines.append(f"| {phase['name']} | {start.manifest['tag']} (step {offset}) | "
                     f"{phase['steps']} | `{data}` | {' | '.join(shown)} |")
        curves[phase["name"]] = _losses(run.path, "train", offset)
    path = storage.join(folder, "decay_curves.png")
    if not storage.is_remote(path):
        _plot(curves, path)
        lines.append(f"\n![decay curves]({os.path.abspath(path)})")
    return lines


def _plot(curves: dict[str, list[tuple[int, float]]], path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, points in curves.items():
        if points:
            steps, losses = zip(*points)
            ax.plot(steps, losses, label=name, linewidth=2 if name == "stable run" else 1.5)
    ax.set_xlabel("global step (a decay counts on from its checkpoint)")
    ax.set_ylabel("train MLM loss")
    ax.legend()
    with storage.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
