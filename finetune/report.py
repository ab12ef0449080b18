"""Fine-tuning outputs: one results table over every family (Markdown + CSV), JSON, a plot,
each task's prediction files and GLUE's leaderboard zip.

The table is generic over metric names (GLUE's accuracy/F1/MCC/correlations, SQuAD's exact/f1,
multiple choice's accuracy, NER's f1); the GLUE score row averages the GLUE tasks present.
Everything is written atomically (`common.storage`), `results.json` last of the tables.
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

import csv
import dataclasses
import io
import json
import os
import zipfile

from common import storage
from common.errors import DEAD_LETTER_DIR
from finetune.loop import FinetuneResult, TaskResult, TestPredictions

GLUE = "glue"

TABLE_COLUMNS = ("task", "metric", "score", "score_std", "best_lr", "seeds", "train_examples",
                 "dev_examples", "minutes")


def metric_text(result: TaskResult) -> str:
    """"f1 88.1 ± 0.4 / accuracy 84.0 ± 0.5" (points; spread only with several seeds)."""
    def one(name: str) -> str:
        mean, std = 100 * result.metrics[name], 100 * result.metrics_std[name]
        return f"{name} {mean:.1f} ± {std:.1f}" if len(result.seeds) > 1 else f"{name} {mean:.1f}"

    return " / ".join(one(name) for name in result.metrics)


def glue_score(result: FinetuneResult) -> float | None:
    """The mean task score of the GLUE tasks run (None without any)."""
    from finetune.glue.metrics import glue_score as mean_score

    scores = {t.task: t.score for t in result.tasks if t.family == GLUE}
    return mean_score(scores) if scores else None


def table_rows(result: FinetuneResult) -> list[dict[str, str]]:
    """One row per task plus, with GLUE tasks, the GLUE score row; values are display
    strings."""
    rows = [{
        "task": r.task,
        "metric": metric_text(r),
        "score": f"{100 * r.score:.2f}",
        "score_std": f"{100 * r.score_std:.2f}",
        "best_lr": f"{r.best_learning_rate:g}",
        "seeds": ",".join(str(s) for s in r.seeds),
        "train_examples": str(r.num_train_examples),
        "dev_examples": "/".join(str(n) for n in r.num_dev_examples.values()),
        "minutes": f"{r.seconds / 60:.1f}",
    } for r in result.tasks]
    glue = glue_score(result)
    if glue is not None:
        rows.append({c: "" for c in TABLE_COLUMNS} | {
            "task": "GLUE score", "score": f"{100 * glue:.2f}",
            "minutes": f"{result.seconds / 60:.1f}"})
    return rows


def markdown_table(result: FinetuneResult) -> str:
    rows = table_rows(result)
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |",
             "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|"]
    lines += ["| " + " | ".join(row[c] for c in TABLE_COLUMNS) + " |" for row in rows]
    return "\n".join(lines) + "\n"


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
                     "final_loss", "train_seconds", "eval_seconds", "chosen_lr"])
    for task in result.tasks:
        for run in task.runs:
            writer.writerow([run.task, f"{run.learning_rate:g}", run.seed, f"{run.score:.6f}",
                             *(f"{run.metrics[m]:.6f}" if m in run.metrics else ""
                               for m in metric_names),
                             run.steps, f"{run.final_loss:.6f}", f"{run.train_seconds:.2f}",
                             f"{run.eval_seconds:.2f}",
                             int(run.learning_rate == task.best_learning_rate)])
    return buffer.getvalue()


def plot_results(result: FinetuneResult, path: str) -> None:
    """Left: each task's dev score at its chosen rate (mean, bar = spread over seeds).
    Right: dev score per learning rate (mean over seeds), one line per task."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (bars, lines) = plt.subplots(1, 2, figsize=(11, 4))
    names = [t.task for t in result.tasks]
    bars.bar(names, [100 * t.score for t in result.tasks],
             yerr=[100 * t.score_std for t in result.tasks], capsize=4, color="tab:blue")
    bars.set_ylabel("dev score (points)")
    glue = glue_score(result)
    bars.set_title("chosen rate per task" if glue is None else
                   f"chosen rate per task (GLUE score {100 * glue:.1f})")
    rates = sorted({r.learning_rate for t in result.tasks for r in t.runs}, reverse=True)
    for task in result.tasks:
        means = [100 * sum(s) / len(s) if s else float("nan") for s in
                 ([r.score for r in task.runs if r.learning_rate == lr] for lr in rates)]
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
    storage.atomic_write_bytes(path, buffer.getvalue())


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


def write_submission(result: FinetuneResult, output_dir: str) -> dict[str, str]:
    """`<output>/submission/<file>` for every test set predicted, and `<output>/submission.zip`
    of the GLUE tasks' files; {"submission_dir": ..., "submission": the zip} as written.

    The zip holds the files of the GLUE tasks run; the GLUE server scores a submission only
    when it has all of SUBMISSION_FILES (the missing ones are listed in results.json).
    """
    predictions = [p for task in result.tasks for p in task.test_predictions]
    if not predictions:
        return {}
    from finetune.glue.tasks import SUBMISSION_FILES

    folder = os.path.join(output_dir, "submission")
    contents = {p.submission_file: submission_text(p) for p in predictions}
    for name, text in contents.items():
        storage.atomic_write_text(os.path.join(folder, name), text)
    paths = {"submission_dir": folder}
    glue_files = sorted((name for name in contents if name in SUBMISSION_FILES),
                        key=SUBMISSION_FILES.index)
    if glue_files:
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            for name in glue_files:
                archive.writestr(name, contents[name])
        paths["submission"] = os.path.join(output_dir, "submission.zip")
        storage.atomic_write_bytes(paths["submission"], buffer.getvalue())
    return paths


def dead_letter_lines(tasks: list[TaskResult]) -> str:
    """One JSON line per record set aside, in task and file order."""
    return "".join(json.dumps({"task": task.task, **dataclasses.asdict(bad)},
                              ensure_ascii=False) + "\n"
                   for task in tasks for bad in task.bad_records)


def write_dead_letters(result: FinetuneResult, output_dir: str) -> dict[str, str]:
    """`<output>/dead_letter/<family>_bad_rows.jsonl` per family that set records aside."""
    paths = {}
    for family in dict.fromkeys(t.family for t in result.tasks):
        text = dead_letter_lines([t for t in result.tasks if t.family == family])
        if text:
            paths[family] = os.path.join(output_dir, DEAD_LETTER_DIR, f"{family}_bad_rows.jsonl")
            storage.atomic_write_text(paths[family], text)
    return paths


def write_task_files(result: FinetuneResult, output_dir: str) -> dict[str, list[str]]:
    """Each task's best-run prediction files under `<output>/<task>/`; task -> paths."""
    written = {}
    for task in result.tasks:
        written[task.task] = [os.path.join(output_dir, task.task, name) for name in task.files]
        for path, text in zip(written[task.task], task.files.values()):
            storage.atomic_write_text(path, text)
    return {task: paths for task, paths in written.items() if paths}


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
        for run in entry["runs"]:
            del run["files"]  # the best run's are the task's; the others are not kept
        tasks.append(entry)
    summary = {
        "glue_score": glue_score(result), "model_dir": result.model_dir,
        "config": dataclasses.asdict(result.config),
        "config_hash": storage.config_hash(result.config),
        "task_configs": {t: dataclasses.asdict(c) for t, c in result.configs.items()},
        "seconds": result.seconds, "tasks": tasks, "pending_tasks": list(result.pending_tasks),
        "bad_rows": sum(t.bad_rows for t in result.tasks),
        # one family's file (the common case) by itself, several by family
        "dead_letter": (next(iter(dead_letters.values())) if len(dead_letters) == 1
                        else dead_letters or None),
    }
    if any(t.family == GLUE for t in result.tasks):
        from finetune.glue.tasks import SUBMISSION_FILES

        written = {p.submission_file for t in result.tasks for p in t.test_predictions}
        summary["submission_missing"] = [f for f in SUBMISSION_FILES if f not in written]
    return summary


def write_report(result: FinetuneResult, output_dir: str,
                 markdown_name: str = "results.md") -> dict[str, str]:
    """Write every output of a run into `output_dir`; returns {kind: path} (a dead-letter
    file's kind is "dead_letter" for one family, "dead_letter_<family>" for several)."""
    storage.makedirs(output_dir)
    paths = {
        "markdown": os.path.join(output_dir, markdown_name),
        "csv": os.path.join(output_dir, "results.csv"),
        "runs_csv": os.path.join(output_dir, "runs.csv"),
        "plot": os.path.join(output_dir, "dev_scores.png"),
        "json": os.path.join(output_dir, "results.json"),
    }
    storage.atomic_write_text(paths["markdown"], markdown_table(result))
    storage.atomic_write_text(paths["csv"], summary_csv(result))
    storage.atomic_write_text(paths["runs_csv"], runs_csv(result))
    plot_results(result, paths["plot"])
    paths |= write_submission(result, output_dir)
    for task, files in write_task_files(result, output_dir).items():
        paths[f"files_{task}"] = os.path.dirname(files[0])
    dead_letters = write_dead_letters(result, output_dir)
    if len(dead_letters) == 1:
        paths["dead_letter"] = next(iter(dead_letters.values()))
    else:
        paths |= {f"dead_letter_{family}": path for family, path in dead_letters.items()}
    storage.atomic_write_json(paths["json"], results_dict(result, dead_letters))
    return paths
