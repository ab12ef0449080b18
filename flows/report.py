"""The run's Markdown report: stage timings, data statistics, the loss curve and the
fine-tuning table."""
from __future__ import annotations

import os
from typing import Any

from common import storage
from flows.config import DagConfig
from flows.stages import StageResult


def report(cfg: DagConfig, stages: list[StageResult], finetune: dict | None,
           filename: str = "report.md", folder: str | None = None) -> dict:
    """`report.md` in `folder` (default: the run folder): stage timings, data statistics, loss
    curve, the fine-tuning table (every family's tasks, the GLUE score).
    (A data-only run writes `report-data.md`: the full run's report stays.)"""
    rows = [{"stage": s.stage, "cached": s.cached, "seconds": round(s.seconds, 1),
             "output": s.path} for s in stages]
    stats = _data_statistics(stages)
    pretrain = next((s for s in stages if s.stage == "pretrain"), None)
    loss_curve = os.path.join(pretrain.path, "loss_curve.png") if pretrain else ""
    lines = [f"# pretrain-bert report ({cfg.name})", "", "## Stages", "",
             "| stage | cached | seconds | output |", "|---|---|---:|---|"]
    lines += [f"| {r['stage']} | {'yes' if r['cached'] else 'no'} | {r['seconds']} | "
              f"`{r['output']}` |" for r in rows]
    lines += ["", "## Data", ""] + [f"- {k}: {v}" for k, v in stats.items()]
    if pretrain:
        lines += ["", "## Pre-training", ""]
        for split, record in pretrain.manifest.get("final_metrics", {}).items():
            shown = {k: v for k, v in record.items() if isinstance(v, (int, float))}
            lines.append(f"- last {split}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
        if os.path.exists(loss_curve):
            lines.append(f"\n![loss curve]({loss_curve})")
    if finetune:
        lines += ["", "## Fine-tuning (dev)", "", finetune["table"]]
        lines += [f"- FAILED {f['job']}: {f['error']}" for f in finetune["failed"]]
    text = "\n".join(lines) + "\n"
    path = storage.join(folder or cfg.output, filename)
    storage.atomic_write_text(path, text)
    return {"markdown": text, "path": path, "stages": rows, "loss_curve": loss_curve,
            "finetune_table": finetune["table"] if finetune else "", "statistics": stats}


def _data_statistics(stages: list[StageResult]) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for s in stages:
        counts = s.manifest.get("counts") or s.manifest.get("totals") or {}
        for key, value in counts.items():
            if isinstance(value, (int, float)):
                stats[f"{s.stage}.{key}"] = value
    return stats


def image_markdown(png_path: str) -> str:
    """A PNG inlined as a data URI, so the Prefect UI shows it without a file server."""
    import base64

    with open(png_path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f"![{os.path.basename(png_path)}](data:image/png;base64,{data})"
