"""The run's Markdown report: stage timings, data statistics, the mixture ledger (per source:
what was read, dropped, repeated and kept, and its share of the corpus), the loss curve and
the fine-tuning table, and last where the report is saved and what to run next (so the end of
`bert-dag`'s output, which prints it, says both)."""
from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from common import storage
from flows import decay_report, probe_report
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
    corpus = next((s for s in stages if s.stage == "corpus"), None)
    ledger = corpus.manifest.get("ledger", {}) if corpus else {}
    if ledger:
        lines += ["", "## Mixture (per source)", "", *ledger_table(ledger)]
    audit = _audit_report(stages)
    if audit:
        lines += ["", f"## Contamination audit ({audit['ngram']}-grams)", "",
                  *audit_table(audit)]
    if pretrain:
        lines += ["", "## Pre-training", ""]
        for split, record in pretrain.manifest.get("final_metrics", {}).items():
            shown = {k: v for k, v in record.items() if isinstance(v, (int, float))}
            lines.append(f"- last {split}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
        if os.path.exists(loss_curve):
            lines.append(f"\n![loss curve]({loss_curve})")
        lines += forecast_section(pretrain.path)
        lines += probe_report.probe_section(cfg, pretrain.path, folder or cfg.output)
    lines += decay_report.decay_section(stages, folder or cfg.output)
    if finetune:
        lines += ["", "## Fine-tuning (dev)", "", finetune["table"]]
        lines += [f"- FAILED {f['job']}: {f['error']}" for f in finetune["failed"]]
    path = storage.join(folder or cfg.output, filename)
    path = path if storage.is_remote(path) else os.path.abspath(path)
    lines += ["", *next_steps(cfg, stages, path)]
    text = "\n".join(lines) + "\n"
    storage.atomic_write_text(path, text)
    probe_curves = storage.join(folder or cfg.output, "probe_curves.png")
    log_to_trackers(cfg, [path, loss_curve, *_finetune_files(finetune), probe_curves],
                    _probe_results(cfg, pretrain), folder or cfg.output)
    return {"markdown": text, "path": path, "stages": rows, "loss_curve": loss_curve,
            "finetune_table": finetune["table"] if finetune else "", "statistics": stats,
            "ledger": ledger, "audit": audit}


def _probe_results(cfg: DagConfig, pretrain: StageResult | None) -> list[dict]:
    from flows import probes

    return probes.results(cfg, pretrain.path) if pretrain is not None else []


REPORT_TRACKERS = "report-trackers.json"
"""The report folder's tracker run ids: a report made again continues its run."""


def log_to_trackers(cfg: DagConfig, paths: list[str], probe_results: list[dict] = (),
                    folder: str = "") -> None:
    """The report and its plots (local files that exist) as artifacts of a tracker run of its
    own, named after the DAG run's folder, in the trackers pre-training reports to
    (`pretrain.cadence.report_to`) but TensorBoard, which keeps no files; each probe's score
    as the metric `probe/<task>` at its export's global step. A report made again (a re-run of
    the flow) continues the run whose ids `<folder>/report-trackers.json` keeps: its artifacts
    are replaced, and a probe's score, logged with the time its probe finished, stays one point."""
    from training.trackers import local_dir, log_artifacts, open_trackers

    names = [n for n in cfg.pretrain.cadence.report_to if n not in ("tensorboard", "none")]
    local = [p for p in paths if p and not storage.is_remote(p)]
    if not names or not local:
        return
    run_name = f"bert-dag-{cfg.output.rstrip('/').rsplit('/', 1)[-1]}"
    ids_file = os.path.join(local_dir(folder or cfg.output), REPORT_TRACKERS)
    with open_trackers(names, local_dir(cfg.output), run_name,
                       {"preset": cfg.name, "output": cfg.output}, resume=True,
                       ids_file=ids_file) as trackers:
        for result in probe_results:
            trackers.log_metrics({f"probe/{result['task']}": result["score"]},
                                 result["global_step"], result.get("finished_ms"))
        log_artifacts(trackers, local)


def _finetune_files(finetune: dict | None) -> list[str]:
    """The fine-tuning report's Markdown table and plot, when the run fine-tuned."""
    files = (finetune or {}).get("files", {})
    return [files[k] for k in ("markdown", "plot") if k in files]


def forecast_section(run_dir: str) -> list[str]:
    """"Forecast vs actual" where the pre-training stage wrote forecast.json (flows/plan.py)."""
    from flows.plan import forecast_vs_actual

    table = forecast_vs_actual(run_dir)
    return ["", "## Forecast vs actual", "", *table] if table else []


def _audit_report(stages: list[StageResult]) -> dict:
    """The contamination audit's report.json, when the run has the stage."""
    import json

    audit = next((s for s in stages if s.stage == "audit"), None)
    if audit is None:
        return {}
    with storage.open_read(storage.join(audit.path, "report.json")) as f:
        return json.load(f)


def audit_table(audit: dict) -> list[str]:
    """Per task and split: examples, those sharing an n-gram with the corpus, and the share of
    the task's n-grams found there (pipelines/audit_contamination.py's report.json)."""
    lines = ["| task | split | examples | overlapping | share | n-grams overlapping |",
             "|---|---|---:|---:|---:|---:|"]
    for task, entry in audit.get("tasks", {}).items():
        for split, row in entry.get("splits", {}).items():
            lines.append(f"| {task} | {split} | {row['examples']} | "
                         f"{row['examples_overlapping']} | "
                         f"{row['examples_overlapping_share']:.2%} | "
                         f"{row['ngrams_overlapping_share']:.2%} |")
    corpus = audit.get("corpus", {})
    lines.append(f"\nCorpus passages with an evaluation n-gram: "
                 f"{corpus.get('passages_contaminated', 0)} of {corpus.get('passages', 0)}.")
    return lines


def next_steps(cfg: DagConfig, stages: list[StageResult], path: str) -> list[str]:
    """The report's last lines: where it is saved, and the commands a reader runs next (a
    data-only run: the full run that reuses its shards; a full run: fine-tuning the exported
    model on other tasks, or a longer run that reuses the data stages)."""
    root = cfg.output if storage.is_remote(cfg.output) else os.path.abspath(cfg.output)
    lines = ["## Next", ""]
    export = next((s for s in stages if s.stage == "export"), None)
    if export is None:
        lines.append(f"- the full run reuses these stages: `{command('bert-dag')} --preset "
                     f"{cfg.name} --output {root}` with the same settings, without `--data_only`")
    else:
        tasks = ",".join(cfg.finetune.tasks) or "rte,mrpc"
        data = cfg.finetune.data or "DATA_FOLDER"
        lines.append(f"- fine-tune the model on your tasks: `{command('bert-finetune')} --model "
                     f"{export.path} --data {data} --tasks {tasks} --output {root}/finetune-more`")
        lines.append(f"- train longer (the data stages are reused): `{command('bert-dag')} "
                     f"--preset {cfg.name} --output {root} --set pretrain.phase1.steps=N` with "
                     "this run's other settings")
    return [*lines, "", f"Report saved to {path} (run folder {root})"]


def command(name: str) -> str:
    """This installation's console script `name` as a reader types it here: bare where the shell
    finds it on PATH, else its path (relative to the working folder when under it: a virtualenv
    that was never activated gives `.venv/bin/<name>`)."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    found = shutil.which(name)
    if not os.path.exists(script) or (found and os.path.abspath(found) == os.path.abspath(script)):
        return name
    relative = os.path.relpath(script)
    return script if relative.startswith("..") else relative


QUALITY_PREFIX = "dropped_"
"""The ledger's quality counters: `dropped_<rule>` (pipelines/corpus/filter_quality.py)."""
QUALITY_DROPS = "quality drops"
"""The place in `LEDGER_COLUMNS` of the quality rules' columns."""
LEDGER_COLUMNS = (
    ("weight", "weight"), ("licence", "licence"), ("records_read", "records read"),
    ("input_bytes", "input bytes"), ("bad_records", "bad"), ("documents_in", "documents in"),
    ("duplicates_removed", "duplicates"), ("doc_id_conflicts", "id conflicts"),
    ("near_duplicates_removed", "near duplicates"), (QUALITY_DROPS, ""),
    ("without_sentences", "no sentence"), ("sampled_out", "sampled out"),
    ("repeats_added", "repeats"), ("documents_out", "documents out"),
    ("bytes_in", "bytes in"), ("bytes_out", "bytes out"), ("sentences_in", "sentences in"),
    ("sentences_out", "sentences out"), ("words_in", "words in"), ("words_out", "words out"),
    ("share_documents", "share (documents)"), ("share_bytes", "share (bytes)"))
"""The ledger's columns (build_corpus's manifest `ledger`), with their headings; at
`QUALITY_DROPS`, a column per quality rule that dropped a document of some source. Every drop
has a column, so on each row documents in + repeats = documents out + the drops."""


def ledger_table(ledger: dict[str, dict]) -> list[str]:
    """The mixture ledger as Markdown table lines, one row per source (unknown: -)."""
    rules = sorted({key for row in ledger.values() for key in row
                    if key.startswith(QUALITY_PREFIX)})
    columns = []
    for key, heading in LEDGER_COLUMNS:
        columns += ([(rule, f"quality: {rule.removeprefix(QUALITY_PREFIX)}") for rule in rules]
                    if key == QUALITY_DROPS else [(key, heading)])
    lines = ["| source | " + " | ".join(h for _, h in columns) + " |",
             "|---|" + "---:|" * len(columns)]
    for name, row in ledger.items():
        # A source's rule counter is absent where that rule dropped none of its documents.
        cells = [str(row.get(key, 0)) if key.startswith(QUALITY_PREFIX)
                 else "-" if row.get(key) in (None, "") else str(row[key])
                 for key, _ in columns]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


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
