"""Fine-tuning outputs: one results table over every family (Markdown + CSV), JSON, a plot,
each task's prediction files and GLUE's leaderboard zip.

The table is generic over metric names (GLUE's accuracy/F1/MCC/correlations, SQuAD's exact/f1,
multiple choice's accuracy, NER's f1); a family that sums its tasks up (`Summaries`,
finetune/capabilities.py: GLUE's score over the GLUE tasks present) adds a row, a score in
`results.json` and its leaderboard's zip.
Everything is written as one set (`write_together`): every file to a temporary name first,
then all renamed, `results.json` last, so a failure part-way (a full disk) leaves the folder as
it was. A diverged run is a row of `runs.csv` with status `diverged` (and in `results.json`, its
score and loss null), and a line under the table. A task scored on a sliced split
(`max_eval_examples`; its family's `PARTIAL_FILE`) has "(partial)" in its row's dev_examples,
a line under the table (printed with it on the console) and its note as `partial` in
`results.json`.
The best run's prediction files (`Scored.files`, e.g. SQuAD's predictions.json) go to
`<output>/<task>/`. Test-set predictions go to `<output>/submission/`, each in its leaderboard's
format: GLUE's server wants one `<TASK>.tsv` per task with the header `index\tprediction`,
label strings where the task's files use strings (`entailment`), `0`/`1` for the binary tasks
and the score for STS-B, all zipped flat into `submission.zip`; SWAG's wants `swag.csv`, the
test file's row index and the chosen ending (`,pred`). Records set aside with `--skip_bad_rows` go to
`dead_letter/<family>_bad_rows.jsonl` (one JSON object per record: task, file, line or record,
reason, raw text), named in `results.json`.
"""
from __future__ import annotations

import contextlib
import csv
import dataclasses
import io
import json
import math
import os
import zipfile

from common import storage
from common.errors import DEAD_LETTER_DIR, DiskFullError
from finetune import baselines
from finetune.capabilities import FamilySummary, Summaries
from finetune.family import PARTIAL_FILE
from finetune.results import FinetuneResult, TaskResult, TestPredictions

SUMMARY_KEYS = ("glue_score",)
"""The family summaries `results.json` holds whichever tasks ran (null without the family's
tasks), as readers of many runs' results expect them (flows/sweep.py)."""

TABLE_COLUMNS = ("task", "metric", "score", "score_std", "baseline", "best_lr", "seeds",
                 "train_examples", "dev_examples", "minutes")


def metric_text(result: TaskResult) -> str:
    """"f1 88.1 ± 0.4 / accuracy 84.0 ± 0.5" (points; spread only with several seeds)."""
    def one(name: str) -> str:
        mean, std = 100 * result.metrics[name], 100 * result.metrics_std[name]
        return f"{name} {mean:.1f} ± {std:.1f}" if len(result.seeds) > 1 else f"{name} {mean:.1f}"

    return " / ".join(one(name) for name in result.metrics)


def family_summaries(result: FinetuneResult) -> list[FamilySummary]:
    """The summary of each family of the run's tasks that gives one (`Summaries`), in the
    order the families' tasks first appear."""
    from finetune.tasks import FAMILIES, family_module

    summaries = []
    # a family outside the registry (one a caller drives the loop with) has none to ask for
    for name in dict.fromkeys(t.family for t in result.tasks if t.family in FAMILIES):
        family = family_module(name).FAMILY
        if isinstance(family, Summaries):
            summaries.append(family.summary([t for t in result.tasks if t.family == name]))
    return summaries


def summary_scores(result: FinetuneResult) -> dict[str, float | None]:
    """{key: score} of every family summary, each of `SUMMARY_KEYS` (None where its family's
    tasks did not run) first ({"glue_score": 0.81})."""
    return dict.fromkeys(SUMMARY_KEYS) | {s.key: s.score for s in family_summaries(result)}


def table_rows(result: FinetuneResult) -> list[dict[str, str]]:
    """One row per task plus one per family summary (the GLUE score); values are display
    strings."""
    rows = [{
        "task": r.task,
        "metric": metric_text(r),
        "score": f"{100 * r.score:.2f}",
        "score_std": f"{100 * r.score_std:.2f}",
        "baseline": baseline_text(r),
        "best_lr": f"{r.best_learning_rate:g}",
        "seeds": ",".join(str(s) for s in r.seeds),
        "train_examples": str(r.num_train_examples),
        "dev_examples": "/".join(str(n) for n in r.num_dev_examples.values())
        + (" (partial)" if partial_note(r) else ""),
        "minutes": f"{r.seconds / 60:.1f}",
    } for r in result.tasks]
    rows += [{c: "" for c in TABLE_COLUMNS} | {
        "task": summary.label, "score": f"{100 * summary.score:.2f}",
        "minutes": f"{result.seconds / 60:.1f}"} for summary in family_summaries(result)]
    return rows


def markdown_table(result: FinetuneResult) -> str:
    """The table, then a line per task with diverged runs or partial predictions."""
    rows = table_rows(result)
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
    lines += ["| " + " | ".join(row[c] for c in TABLE_COLUMNS) + " |" for row in rows]
    notes = [note for task in result.tasks
             for note in (learned_note(task), diverged_note(task), partial_note(task))]
    if any(notes):
        lines += ["", *(note for note in notes if note)]
    return "\n".join(lines) + "\n"


def baseline_text(result: TaskResult) -> str:
    """"68.38 (majority class 1)", "constant: 68.38 (...)" when the best run's dev predictions
    are one constant; "" without a baseline (runs kept before baselines were recorded)."""
    if result.baseline is None:
        return ""
    text = f"{100 * result.baseline.score:.2f} ({result.baseline.kind})"
    return f"constant: {text}" if result.constant else text


def learned_note(result: TaskResult) -> str:
    """A line for a task whose predictions are constant or whose score does not beat its
    baseline (`finetune.baselines.note`), else ""."""
    return baselines.note(result.task, result.score, result.baseline, result.constant,
                          result.constant_runs, len(result.seeds))


def partial_note(result: TaskResult) -> str:
    """"squad1: predictions are partial (5 of 10570 questions): not for submission" where the
    best run's predictions are of a sliced split (its `PARTIAL_FILE`), else ""."""
    text = result.files.get(PARTIAL_FILE, "").strip()
    return f"{result.task}: predictions are {text}" if text else ""


def diverged_note(result: TaskResult) -> str:
    """"RTE: 1 of 2 runs diverged (lr 10000 seed 1: loss nan at step 5); best_lr is chosen
    among the finished runs", or "" when none did."""
    diverged = [run for run in result.runs if not run.finished]
    if not diverged:
        return ""
    listed = "; ".join(f"lr {run.learning_rate:g} seed {run.seed}: loss {run.final_loss} at "
                       f"step {run.steps}" for run in diverged)
    return (f"{result.task}: {len(diverged)} of {len(result.runs)} runs diverged ({listed}); "
            "best_lr is chosen among the finished runs")


def summary_csv(result: FinetuneResult) -> str:
    """The Markdown table's rows as CSV."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(table_rows(result))
    return buffer.getvalue()


def runs_csv(result: FinetuneResult) -> str:
    """Machine-readable: one row per (task, rate, seed) run, raw fractions."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    metric_names = sorted({m for r in result.tasks for m in r.metrics})
    writer.writerow(["task", "learning_rate", "seed", "score", *metric_names, "steps",
                     "final_loss", "train_seconds", "eval_seconds", "chosen_lr", "status"])
    for task in result.tasks:
        for run in task.runs:
            writer.writerow([run.task, f"{run.learning_rate:g}", run.seed,
                             f"{run.score:.6f}" if run.finished else "",
                             *(f"{run.metrics[m]:.6f}" if m in run.metrics else ""
                               for m in metric_names),
                             run.steps, f"{run.final_loss:.6f}", f"{run.train_seconds:.2f}",
                             f"{run.eval_seconds:.2f}",
                             int(run.finished and run.learning_rate == task.best_learning_rate),
                             run.status])
    return buffer.getvalue()


def plot_png(result: FinetuneResult) -> bytes:
    """Left: each task's dev score at its chosen rate (mean, bar = spread over seeds).
    Right: dev score per learning rate (mean over its finished seeds), one line per task."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (bars, lines) = plt.subplots(1, 2, figsize=(11, 4))
    names = [t.task for t in result.tasks]
    bars.bar(names, [100 * t.score for t in result.tasks],
             yerr=[100 * t.score_std for t in result.tasks], capsize=4, color="tab:blue")
    bars.set_ylabel("dev score (points)")
    summaries = "; ".join(f"{s.label} {100 * s.score:.1f}" for s in family_summaries(result))
    bars.set_title(f"chosen rate per task ({summaries})" if summaries else
                   "chosen rate per task")
    rates = sorted({r.learning_rate for t in result.tasks for r in t.runs}, reverse=True)
    for task in result.tasks:
        means = [100 * sum(s) / len(s) if s else float("nan") for s in
                 ([r.score for r in task.runs if r.learning_rate == lr and r.finished]
                  for lr in rates)]
        lines.plot([f"{lr:g}" for lr in rates], means, marker="o", label=task.task)
    lines.set_xlabel("peak learning rate")
    lines.set_title("dev score per learning rate (mean over seeds)")
    lines.legend(fontsize="small")
    for ax in (bars, lines):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    return buffer.getvalue()


def submission_text(predictions: TestPredictions) -> str:
    """The leaderboard file: its header, then one (id, prediction) line per test example; a
    `.lst` file (Cosmos QA's) holds only the predictions, one per line, in the test file's
    order."""
    if predictions.submission_file.endswith(".lst"):
        return "".join(f"{p}\n" for p in predictions.predictions)
    delimiter = "\t" if predictions.submission_file.endswith(".tsv") else ","
    out = io.StringIO()
    writer = csv.writer(out, delimiter=delimiter, lineterminator="\n")
    writer.writerow(predictions.columns)
    writer.writerows(zip(predictions.guids, predictions.predictions))
    return out.getvalue()


def submission_files(result: FinetuneResult, output_dir: str,
                     files: dict[str, bytes]) -> dict[str, str]:
    """`<output>/submission/<file>` for every test set predicted, and `<output>/submission.zip`
    of the files a family's leaderboard wants (`FamilySummary.leaderboard_files`: GLUE's),
    added to `files` (path -> contents); returns {"submission_dir": ..., "submission": the zip}.

    The GLUE server scores a submission only when it has all of its files (the missing ones
    are listed in results.json).
    """
    predictions = [p for task in result.tasks for p in task.test_predictions]
    if not predictions:
        return {}
    leaderboard = leaderboard_files(result)
    folder = os.path.join(output_dir, "submission")
    contents = {p.submission_file: submission_text(p) for p in predictions}
    files |= {os.path.join(folder, name): text.encode() for name, text in contents.items()}
    paths = {"submission_dir": folder}
    zipped = sorted((name for name in contents if name in leaderboard), key=leaderboard.index)
    if zipped:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in zipped:
                archive.writestr(name, contents[name])
        paths["submission"] = os.path.join(output_dir, "submission.zip")
        files[paths["submission"]] = buffer.getvalue()
    return paths


def leaderboard_files(result: FinetuneResult) -> list[str]:
    """Every file the leaderboards of the run's families want, in their order."""
    return [name for s in family_summaries(result) for name in s.leaderboard_files]


def dead_letter_lines(tasks: list[TaskResult]) -> str:
    """One JSON line per record set aside, in task and file order."""
    return "".join(json.dumps({"task": task.task, **dataclasses.asdict(bad)},
                              ensure_ascii=False) + "\n"
                   for task in tasks for bad in task.bad_records)


def dead_letter_files(result: FinetuneResult, output_dir: str,
                      files: dict[str, bytes]) -> dict[str, str]:
    """`<output>/dead_letter/<family>_bad_rows.jsonl` per family that set records aside, added
    to `files`; returns family -> path."""
    paths = {}
    for family in dict.fromkeys(t.family for t in result.tasks):
        text = dead_letter_lines([t for t in result.tasks if t.family == family])
        if text:
            paths[family] = os.path.join(output_dir, DEAD_LETTER_DIR, f"{family}_bad_rows.jsonl")
            files[paths[family]] = text.encode()
    return paths


def task_files(result: FinetuneResult, output_dir: str,
               files: dict[str, bytes]) -> dict[str, str]:
    """Each task's best-run prediction files under `<output>/<task>/`, added to `files`;
    returns task -> its folder, for the tasks with files."""
    folders = {}
    for task in result.tasks:
        for name, text in task.files.items():
            folders[task.task] = os.path.join(output_dir, task.task)
            files[os.path.join(folders[task.task], name)] = text.encode()
    return folders


def write_together(files: dict[str, bytes]) -> None:
    """Every file of `files` to a temporary sibling (`storage.atomic_open`), all renamed into
    place only once every one is written and synced: a failure on any of them leaves every file
    as it was. The renames run last file first, so the first one in `files` lands last. A full
    disk is a DiskFullError naming the file it failed on and the space the whole set needs.
    On an object store (gs://) each file is an object that appears when its upload completes,
    one after the other: the set is not written as one there, but `results.json`, written
    last, still appears only after the others."""
    try:
        with contextlib.ExitStack() as stack:
            for path, data in files.items():
                f = stack.enter_context(storage.atomic_open(path, "wb"))
                f.write(data)
                f.flush()  # a full disk shows here, before any file is renamed
                if not storage.is_remote(path):
                    os.fsync(f.fileno())
    except DiskFullError as error:  # every temporary file is gone: the space left is all free
        raise DiskFullError(error.path, needed=sum(map(len, files.values()))) from None


def results_dict(result: FinetuneResult, dead_letters: dict[str, str] | None = None) -> dict:
    """JSON-able summary (test predictions are in the submission files, the records set aside
    in the dead-letter files, prediction files in the task folders: here only their names)."""
    dead_letters = dead_letters or {}
    tasks = []
    for task in result.tasks:
        entry = dataclasses.asdict(task)
        entry["test_predictions"] = {p.submission_file: len(p.guids)
                                     for p in task.test_predictions}
        del entry["bad_records"]  # counted in bad_rows, listed in the dead-letter file
        entry["files"] = sorted(task.files)
        entry["partial"] = task.files.get(PARTIAL_FILE, "").strip() or None
        entry["constant_predictions"] = bool(task.constant)
        entry["beats_baseline"] = baselines.learned(task.score, task.baseline)
        entry["warning"] = learned_note(task) or None
        for run in entry["runs"]:
            del run["files"]  # the best run's are the task's; the others are not kept
            del run["baseline"]  # the task's: every run is scored on the same dev split
            # a diverged run's score and loss are NaN or infinite: null in standard JSON
            run.update({k: None for k, v in run.items()
                        if isinstance(v, float) and not math.isfinite(v)})
        tasks.append(entry)
    summary = {
        **summary_scores(result), "model_dir": result.model_dir,
        "config": dataclasses.asdict(result.config),
        "config_hash": storage.config_hash(result.config),
        "task_configs": {t: dataclasses.asdict(c) for t, c in result.configs.items()},
        "seconds": result.seconds, "tasks": tasks, "pending_tasks": list(result.pending_tasks),
        "bad_rows": sum(t.bad_rows for t in result.tasks),
        # one family's file (the common case) by itself, several by family
        "dead_letter": (next(iter(dead_letters.values())) if len(dead_letters) == 1
                        else dead_letters or None),
    }
    leaderboard = leaderboard_files(result)
    if leaderboard:
        written = {p.submission_file for t in result.tasks for p in t.test_predictions}
        summary["submission_missing"] = [f for f in leaderboard if f not in written]
    return summary


def write_report(result: FinetuneResult, output_dir: str, markdown_name: str = "results.md",
                 config: dict | None = None) -> dict[str, str]:
    """Write every output of a run into `output_dir`, with `config` as `config.json` when
    given; returns {kind: path} (a dead-letter file's kind is "dead_letter" for one family,
    "dead_letter_<family>" for several).

    The files are written as one set (`write_together`), `results.json` renamed last: a
    failure part-way, a full disk, leaves the folder's files as they were, never a new table
    beside an old or absent `results.json`.
    """
    paths = {
        "json": os.path.join(output_dir, "results.json"),
        "markdown": os.path.join(output_dir, markdown_name),
        "csv": os.path.join(output_dir, "results.csv"),
        "runs_csv": os.path.join(output_dir, "runs.csv"),
        "plot": os.path.join(output_dir, "dev_scores.png"),
    }
    files = {paths["json"]: b"",  # first in the set: renamed last (its contents come below)
             paths["markdown"]: markdown_table(result).encode(),
             paths["csv"]: summary_csv(result).encode(),
             paths["runs_csv"]: runs_csv(result).encode(),
             paths["plot"]: plot_png(result)}
    if config is not None:
        paths["config"] = os.path.join(output_dir, "config.json")
        files[paths["config"]] = storage.json_text(config).encode()
    paths |= submission_files(result, output_dir, files)
    paths |= {f"files_{task}": folder
              for task, folder in task_files(result, output_dir, files).items()}
    dead_letters = dead_letter_files(result, output_dir, files)
    if len(dead_letters) == 1:
        paths["dead_letter"] = next(iter(dead_letters.values()))
    else:
        paths |= {f"dead_letter_{family}": path for family, path in dead_letters.items()}
    files[paths["json"]] = storage.json_text(results_dict(result, dead_letters)).encode()
    write_together(files)
    return paths


