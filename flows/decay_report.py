"""The report's decay section: each decay (WSD's anneal of a kept checkpoint of the stable
run) as a row, and as its own curve beside the stable run's (`decay_curves.png`): MLM loss
against the global step, a decay's steps counted on from the checkpoint it started at; where
the flow probes (`pretrain.cadence.probe_every`, flows/probes.py), each probe task's score
too, the stable run's at its probe exports and each decay's at its two ends (its stable
checkpoint, its last step), in a panel of its own and a column per task."""
from __future__ import annotations

import os

from common import storage
from flows.config import DagConfig
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


def probe_exports(start: StageResult, run: StageResult) -> list:
    """The decay's two ends to probe (flows/probes.py `decay_exports`), by global step."""
    from flows.probes import decay_exports

    steps = run.manifest["config"]["decay"]["phases"][0]["steps"]
    return decay_exports(start.path, _offset(start.manifest["run"], start.manifest["tag"]),
                         run.path, steps)


def _losses(run_dir: str, split: str, offset: int = 0) -> list[tuple[int, float]]:
    if not os.path.exists(os.path.join(run_dir, "metrics.jsonl")):
        return []
    return [(offset + r["global_step"], r[METRIC]) for r in read_metrics(run_dir)
            if r.get("split") == split and METRIC in r]


def _scores(results: list[dict]) -> dict[str, list[tuple[int, float]]]:
    """Probe scores by task: (global step, score), by step."""
    by_task: dict[str, list[tuple[int, float]]] = {}
    for r in sorted(results, key=lambda r: r["global_step"]):
        by_task.setdefault(r["task"], []).append((r["global_step"], r["score"]))
    return by_task


def decay_section(stages: list[StageResult], folder: str, cfg: DagConfig | None = None
                  ) -> list[str]:
    """Markdown lines (none without decays) and `decay_curves.png` in `folder`; with `cfg`,
    the probe scores of the stable run and of each decay's ends."""
    from flows import probes

    pairs = decay_runs(stages)
    if not pairs:
        return []
    stable = pairs[0][0].manifest["run"]
    probed = cfg is not None and probes.enabled(cfg)
    decays = [(start, run, probes.decay_results(cfg, probe_exports(start, run)) if probed
               else []) for start, run in pairs]
    tasks = list(dict.fromkeys(r["task"] for _, _, results in decays for r in results))
    lines = ["", "## Decays (WSD)", "",
             ("| decay | from | steps | data | last train MLM loss | last validation MLM loss | "
              "stable run's validation MLM loss there |"
              + "".join(f" {t} (dev), start -> end |" for t in tasks)),
             "|---|---|---:|---|---:|---:|---:|" + "---:|" * len(tasks)]
    curves = {"stable run": _losses(stable, "train")}
    scores = {"stable run": _scores(probes.results(cfg, stable) if tasks else [])}
    stable_valid = dict(_losses(stable, "validation"))
    for start, run, results in decays:
        config = run.manifest["config"]["decay"]
        phase = config["phases"][0]
        offset = _offset(stable, start.manifest["tag"])
        final = run.manifest.get("final_metrics", {})
        cells = [final.get(split, {}).get(METRIC) for split in ("train", "validation")]
        there = stable_valid.get(offset)
        shown = ["-" if v is None else f"{v:.4f}" for v in (*cells, there)]
        scores[phase["name"]] = _scores(results)
        ends = [dict(scores[phase["name"]].get(t, [])) for t in tasks]
        shown += [" -> ".join("-" if at.get(s) is None else f"{at[s]:.4f}"
                              for s in (offset, offset + phase["steps"])) for at in ends]
        data = os.path.basename(os.path.dirname(phase["train_shards"].rstrip("/") + "/"))
        lines.append(f"| {phase['name']} | {start.manifest['tag']} (step {offset}) | "
                     f"{phase['steps']} | `{data}` | {' | '.join(shown)} |")
        curves[phase["name"]] = _losses(run.path, "train", offset)
    path = storage.join(folder, "decay_curves.png")
    if not storage.is_remote(path):
        _plot(curves, scores if tasks else {}, path)
        lines.append(f"\n![decay curves]({os.path.abspath(path)})")
    return lines


def _plot(curves: dict[str, list[tuple[int, float]]],
          scores: dict[str, dict[str, list[tuple[int, float]]]], path: str) -> None:
    """The MLM loss curves; with probe `scores` (run -> task -> points), a second panel of
    them, each run's tasks in its loss curve's colour."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2 if scores else 1, figsize=(13 if scores else 7, 4),
                               squeeze=False)
    ax = panels[0][0]
    for index, (name, points) in enumerate(curves.items()):
        if points:
            steps, losses = zip(*points)
            ax.plot(steps, losses, color=f"C{index}", label=name,
                    linewidth=2 if name == "stable run" else 1.5)
    ax.set_xlabel("global step (a decay counts on from its checkpoint)")
    ax.set_ylabel("train MLM loss")
    ax.legend()
    if scores:
        ax = panels[0][1]
        markers = "os^vDP"
        for index, (name, by_task) in enumerate(scores.items()):
            for number, (task, points) in enumerate(by_task.items()):
                ax.plot(*zip(*points), f"{markers[number % len(markers)]}-", color=f"C{index}",
                        label=f"{name}: {task}")
        ax.set_xlabel("global step (a decay's two ends: its checkpoint, its last step)")
        ax.set_ylabel("probe score (dev)")
        ax.legend(fontsize="small")
    fig.tight_layout()
    with storage.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
