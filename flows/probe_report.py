"""The report's probe section: each probe score and the MLM and NSP training losses against
steps and tokens seen, as a chart (`probe_curves.png`) and a Markdown table.

Tokens seen are metrics.jsonl's `tokens_seen` where its records carry it; otherwise estimated
as steps x global batch x max_seq_length, phase by phase (padding counted), and the column and
the chart's axis say so.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from common import storage
from flows.config import DagConfig
from training.config import PretrainConfig

LOSSES = (("mlm_loss", "MLM loss"), ("nsp_loss", "NSP loss"))
ESTIMATED = "tokens seen (est.: steps x batch x length)"
ESTIMATED_NOTE = ("Tokens seen are estimated (steps x global batch x max_seq_length per phase): "
                  "metrics.jsonl records no token counts.")


@dataclass(frozen=True)
class ProbeRow:
    """One probed step: where the run was, its training losses there, each task's score."""
    step: int
    tokens: int
    losses: dict[str, float | None]
    scores: dict[str, float]


def run_config(cfg: DagConfig, run_dir: str) -> PretrainConfig:
    """The run's own config (its config.json), else the flow's `pretrain` settings."""
    from training.config import load_saved

    path = os.path.join(run_dir, "config.json")
    return load_saved(path) if os.path.exists(path) else cfg.pretrain


def estimated_tokens(config: PretrainConfig, global_step: int) -> int:
    """Tokens in the rows of the first `global_step` steps: steps x global batch x
    max_seq_length, phase by phase."""
    tokens, left = 0, global_step
    for phase in config.phases:
        steps = min(left, phase.steps)
        tokens += steps * phase.global_batch_size * phase.max_seq_length
        left -= steps
    return tokens


def tokens_at(config: PretrainConfig, train: list[dict], step: int) -> tuple[int, bool]:
    """(tokens seen at `step`, whether estimated)."""
    record = last_record(train, step)
    if record is not None and "tokens_seen" in record:
        return int(record["tokens_seen"]), False
    return estimated_tokens(config, step), True


def last_record(train: list[dict], step: int) -> dict | None:
    """The last training record at or before global step `step`."""
    earlier = [r for r in train if r["global_step"] <= step]
    return earlier[-1] if earlier else None


def probe_rows(cfg: DagConfig, run_dir: str, results: list[dict],
               train: list[dict]) -> tuple[list[ProbeRow], bool]:
    """One row per probed step (ascending) and whether its tokens are estimated."""
    config = run_config(cfg, run_dir)
    rows, estimated = [], False
    for step in sorted({r["global_step"] for r in results}):
        tokens, guessed = tokens_at(config, train, step)
        estimated |= guessed
        record = last_record(train, step) or {}
        rows.append(ProbeRow(step, tokens, {k: record.get(k) for k, _ in LOSSES},
                             {r["task"]: r["score"] for r in results if r["global_step"] == step}))
    return rows, estimated


def probe_table(rows: list[ProbeRow], tasks: list[str], estimated: bool) -> list[str]:
    """Markdown lines: step, tokens seen, MLM loss, NSP loss, a column per probe task."""
    head = ["step", ESTIMATED if estimated else "tokens seen", *(h for _, h in LOSSES), *tasks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in rows:
        cells = [str(row.step), str(row.tokens), *(_number(row.losses[k]) for k, _ in LOSSES),
                 *(_number(row.scores.get(t)) for t in tasks)]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def plot_probes(rows: list[ProbeRow], tasks: list[str], train: list[dict], config: PretrainConfig,
                estimated: bool, path: str) -> str:
    """probe_curves.png: losses (left axis) and probe scores (right axis), against steps (left
    panel) and tokens seen (right panel); written atomically."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, 2, figsize=(12, 4))
    for ax, by_tokens in zip(panels, (False, True)):
        def x_of(step: int, by_tokens=by_tokens) -> int:
            return tokens_at(config, train, step)[0] if by_tokens else step
        for key, label in LOSSES:
            points = [(x_of(r["global_step"]), r[key]) for r in train if r.get(key) is not None]
            if points:
                ax.plot(*zip(*points), "-", label=label)
        ax.set_ylabel("training loss")
        ax.set_xlabel((ESTIMATED if estimated else "tokens seen") if by_tokens
                      else "optimizer step (all phases)")
        scores = ax.twinx()
        for index, task in enumerate(tasks):  # colours after the losses' two
            points = [(x_of(r.step), r.scores[task]) for r in rows if task in r.scores]
            scores.plot(*zip(*points), "o--", color=f"C{index + len(LOSSES)}",
                        label=f"{task} (dev)")
        scores.set_ylabel("probe score (dev)")
        handles = ax.get_legend_handles_labels()
        more = scores.get_legend_handles_labels()
        ax.legend(handles[0] + more[0], handles[1] + more[1], fontsize="small")
    fig.tight_layout()  # the right axis labels of the left panel clear the right panel
    with storage.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return path


def probe_section(cfg: DagConfig, run_dir: str, folder: str) -> list[str]:
    """The report's lines for the run's probes (none without results), the chart written to
    `<folder>/probe_curves.png`."""
    from flows import probes
    from training.metrics import read_metrics

    results = probes.results(cfg, run_dir)
    if not results:
        return []
    train = [r for r in read_metrics(run_dir) if r["split"] == "train"]
    tasks = list(dict.fromkeys(r["task"] for r in results))
    rows, estimated = probe_rows(cfg, run_dir, results, train)
    png = plot_probes(rows, tasks, train, run_config(cfg, run_dir), estimated,
                      storage.join(folder, "probe_curves.png"))
    note = ["", ESTIMATED_NOTE] if estimated else []
    return ["", "## Probes (quality while it trains)", "",
            *probe_table(rows, tasks, estimated), *note, f"\n![probe curves]({png})"]
