"""The run's Markdown report: stage timings, data statistics, the mixture ledger (per source:
what was read, dropped, repeated and kept, and its share of the corpus), the loss curve and
the fine-tuning table, and last where the report is saved and what to run next (so the end of
`bert-dag`'s output, which prints it, says both)."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common import settings, storage
from flows import decay_report, probe_report
from flows.config import DagConfig
from flows.stages import StageResult


@dataclass(frozen=True)
class Invocation:
    """How a run was started, for the report's next commands to repeat it: the preset, the
    settings file (bert-dag's `--config`, absolute; "" for none) and the overrides the run
    resolved (the file's, then the `--set`s; `output` is the run folder)."""
    preset: str
    overrides: Mapping[str, Any] = field(default_factory=dict)
    settings_file: str = ""


def report(cfg: DagConfig, stages: list[StageResult], finetune: dict | None,
           filename: str = "report.md", folder: str | None = None,
           invocation: Invocation | None = None) -> dict:
    """`report.md` in `folder` (default: the run folder): stage timings, data statistics, loss
    curve, the fine-tuning table (every family's tasks, the GLUE score), and the next commands,
    which repeat `invocation` (default: the preset alone).
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
    table = data_table(stages)
    lines += ["", "## Data", "", *table] if table else []
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
    lines += decay_report.decay_section(stages, folder or cfg.output, cfg)
    if finetune:
        lines += ["", "## Fine-tuning (dev)", "", finetune["table"]]
        lines += [f"- FAILED {f['job']}: {f['error']}" for f in finetune["failed"]]
    path = storage.join(folder or cfg.output, filename)
    path = path if storage.is_remote(path) else os.path.abspath(path)
    lines += ["", *next_steps(cfg, stages, path, invocation or Invocation(cfg.name))]
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
    """"Forecast vs actual" where the pre-training stage wrote forecast.json
    (flows/stage_forecast.py)."""
    from flows.stage_forecast import forecast_vs_actual

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


LONGER = "pretrain.phase1.steps"
"""The setting the "train longer" command changes (to N, for the reader to choose)."""


def next_steps(cfg: DagConfig, stages: list[StageResult], path: str,
               invocation: Invocation) -> list[str]:
    """The report's last lines: where it is saved, and the commands a reader runs next (a
    data-only run: the full run that reuses its shards; a full run: fine-tuning the exported
    model on other tasks, or a longer run that reuses the data stages). Each repeats the run's
    preset, settings file and overrides: without them the data stages would be the preset's
    (the bundled sample), not this run's."""
    root = cfg.output if storage.is_remote(cfg.output) else os.path.abspath(cfg.output)
    lines = ["## Next", ""]
    export = next((s for s in stages if s.stage == "export"), None)
    if export is None:
        lines.append(f"- the full run reuses these stages: `"
                     f"{shlex.join([command('bert-dag'), *dag_arguments(invocation, root)])}` "
                     "(this run's command without `--data_only`)")
    else:
        tasks = ",".join(cfg.finetune.tasks) or "rte,mrpc"
        data = cfg.finetune.data or "DATA_FOLDER"
        finetune = ["--model", export.path, "--data", data, "--tasks", tasks,
                    *finetune_arguments(cfg), "--output", f"{root}/finetune-more"]
        lines.append(f"- fine-tune the model on your tasks: "
                     f"`{shlex.join([command('bert-finetune'), *finetune])}`")
        longer = dag_arguments(invocation, root, leave_out=LONGER)
        lines.append(f"- train longer (the data stages are reused): `"
                     f"{shlex.join([command('bert-dag'), *longer])} --set {LONGER}=N`")
    return [*lines, "", f"Report saved to {path} (run folder {root})"]


def dag_arguments(invocation: Invocation, root: str, leave_out: str = "") -> list[str]:
    """`bert-dag`'s arguments that start the run again: `--preset`, `--config` (where the file
    still gives what the run took from it), a `--set` per other override (`leave_out` aside),
    `--output`. `--set`s given as `a.b=c` come back as they were typed."""
    sets = {key: value for key, value in _leaves(invocation.overrides)
            if key not in ("output", leave_out)}
    arguments = ["--preset", invocation.preset]
    from_file = _file_leaves(invocation.settings_file)
    # The file is named only where each of its settings is still the run's: one edited
    # since would start another run, so then every setting is spelt out instead.
    if from_file is not None and all(sets.get(k, _ABSENT) == v or k == leave_out
                                     for k, v in from_file.items()):
        arguments += ["--config", invocation.settings_file]
        sets = {k: v for k, v in sets.items() if k not in from_file}
    for key, value in sets.items():
        arguments += ["--set", f"{key}={_set_value(value)}"]
    return [*arguments, "--output", root]


_ABSENT = object()

FINETUNE_FLAGS = ("data", "tasks", "device", "progress")
"""Fine-tuning settings the command gives as flags, or that the flow sets for its own runs."""


def finetune_arguments(cfg: DagConfig) -> list[str]:
    """`bert-finetune`'s `--set`s for the run's fine-tuning recipe (its preset's, file's and
    `--set`s' alike): each setting that is not bert-finetune's default."""
    from finetune.config import TasksConfig

    default = TasksConfig()
    arguments = []
    for f in dataclasses.fields(TasksConfig):
        value = getattr(cfg.finetune, f.name)
        # None (unset) cannot be typed on a command line
        if f.name in FINETUNE_FLAGS or value == getattr(default, f.name) or value is None:
            continue
        text = (",".join(map(str, value)) if isinstance(value, tuple)
                else json.dumps(value) if isinstance(value, bool) else str(value))
        arguments += ["--set", f"{f.name}={text}"]
    return arguments


def _leaves(overrides: Mapping[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) of each setting in a nested overrides mapping."""
    found = []
    for key, value in overrides.items():
        if isinstance(value, Mapping):  # an empty section sets nothing
            found += _leaves(value, f"{prefix}{key}.")
        else:
            found.append((f"{prefix}{key}", value))
    return found


def _file_leaves(path: str) -> dict[str, Any] | None:
    """The settings of the file `path` by dotted key; None for no file or one unreadable now."""
    if not path:
        return None
    try:
        return dict(_leaves(settings.load_file(path)))
    except (OSError, ValueError):
        return None


def _set_value(value: Any) -> str:
    """A setting's value as `--set` reads it back: text as it is, the rest as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


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


@dataclass(frozen=True)
class DataRow:
    """What a data stage did, as the report's Data table shows it (None: not this stage's)."""
    read: str
    """What it read, with its unit ("10 pages", "8 records")."""
    documents: int
    """Documents it wrote."""
    dropped: int
    """Documents (or pages, files, records) it left out."""
    reasons: dict[str, int] = field(default_factory=dict)
    """The drops by reason (those counted; 0s left out)."""
    sentences: int | None = None
    tokens: int | None = None
    """WordPiece tokens of its documents' text."""
    instances: int | None = None
    """Pre-training instances it wrote."""
    repeats: int = 0
    """Copies its sources' weights added."""


def _reasons(counts: Mapping[str, Any], names: Mapping[str, str]) -> dict[str, int]:
    return {label: counts[key] for key, label in names.items() if counts.get(key)}


def _wikipedia_row(manifest: dict) -> DataRow:
    counts = manifest["counts"]
    return DataRow(f"{counts['pages_read']:,} pages", counts["articles_kept"],
                   counts["pages_read"] - counts["articles_kept"], _reasons(counts, {
                       "skipped_redirect": "redirect", "skipped_disambiguation": "disambiguation",
                       "skipped_namespace": "other namespace", "skipped_empty": "empty",
                       "bad_records": "bad"}))


def _books_row(manifest: dict) -> DataRow:
    counts = manifest["counts"]
    # a set-aside paragraph is a bad record too, but its book is kept
    bad_files = counts.get("bad_records", 0) - counts.get("passages_set_aside", 0)
    return DataRow(f"{counts['files_read']:,} files", counts["documents"],
                   counts["files_read"] - counts["documents"],
                   {"bad file": bad_files} if bad_files else {})


def _documents_row(manifest: dict) -> DataRow:
    counts = manifest["counts"]
    reasons: dict[str, int] = {}
    for source in manifest.get("sources", {}).values():
        for code, n in source.get("bad", {}).items():
            reasons[code] = reasons.get(code, 0) + n
    return DataRow(f"{counts['records_read']:,} records", counts["documents"],
                   counts["records_read"] - counts["documents"], reasons)


def _corpus_row(manifest: dict) -> DataRow:
    counts, ledger = manifest["counts"], manifest.get("ledger", {})
    sampled = sum(row.get("sampled_out", 0) for row in ledger.values())
    repeats = sum(row.get("repeats_added", 0) for row in ledger.values())
    reasons = _reasons(counts, {
        "duplicates_removed": "duplicates", "doc_id_conflicts": "id conflicts",
        "near_duplicates_removed": "near duplicates", "quality_dropped": "quality filter",
        "documents_without_sentences": "no sentence"})
    return DataRow(f"{counts['documents_read']:,} documents", counts["documents"],
                   counts["documents_read"] + repeats - counts["documents"],
                   {**reasons, **({"sampled out": sampled} if sampled else {})},
                   sentences=counts["sentences"], repeats=repeats)


def _decontaminated_row(manifest: dict) -> DataRow:
    counts = manifest["counts"]
    return DataRow(f"{counts['documents_read']:,} documents", counts["documents"],
                   counts["documents_dropped"],
                   _reasons(counts, {"documents_dropped": "contaminated"}),
                   sentences=counts["sentences"])


def _shards_row(manifest: dict) -> DataRow:
    counters = manifest["counters"]
    # Beam reports a counter only once it moved: no empty or bad document, no key
    dropped = counters.get("empty_documents", 0) + counters.get("bad_records", 0)
    return DataRow(f"{counters['documents'] + dropped:,} documents", counters["documents"],
                   dropped, _reasons(counters, {"empty_documents": "empty", "bad_records": "bad"}),
                   tokens=counters["tokens"], instances=manifest["totals"]["num_instances"])


DATA_ROWS = (("wikipedia", _wikipedia_row), ("books", _books_row),
             ("documents-", _documents_row), ("corpus-clean", _decontaminated_row),
             ("corpus", _corpus_row), ("shards", _shards_row))
"""The Data table's row of a stage, by the start of its name (the first that matches)."""


DATA_NOTE = ("Tokens: WordPiece tokens of the documents' text. Every counter of a stage is in "
             "its folder's manifest.json.")


def data_row(stage: StageResult) -> DataRow | None:
    """The stage's row of the Data table; None for a stage that is not a data stage."""
    for start, row in DATA_ROWS:
        if stage.stage.startswith(start):
            try:
                return row(stage.manifest)
            except KeyError:  # a manifest without the counters (hand-made, older) has no row
                return None
    return None


def data_table(stages: list[StageResult]) -> list[str]:
    """The Data section: per data stage what it read, the documents, sentences, tokens and
    instances it made, and what it dropped and why (the raw counters stay in each stage's
    manifest.json)."""
    def number(value: int | None) -> str:
        return "-" if value is None else f"{value:,}"

    rows = [(s, row) for s in stages if (row := data_row(s)) is not None]
    if not rows:
        return []
    names = [s.stage for s, _ in rows]
    lines = ["| stage | read | documents | sentences | tokens | instances | dropped |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for stage, row in rows:
        # a decay's data stages share the run's stage names: their folders tell them apart
        name = stage.stage if names.count(stage.stage) == 1 else os.path.basename(stage.path)
        documents = number(row.documents) + (f" ({row.repeats:,} repeats)" if row.repeats else "")
        why = ", ".join(f"{reason} {n:,}" for reason, n in row.reasons.items())
        dropped = number(row.dropped) + (f": {why}" if why else "")
        lines.append(f"| {name} | {row.read} | {documents} | {number(row.sentences)} | "
                     f"{number(row.tokens)} | {number(row.instances)} | {dropped} |")
    return [*lines, "", DATA_NOTE]


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
