"""What fine-tuning produces: one run's dev result (`RunResult`, kept with its test-set
predictions as a `RunRecord`), a task's summary over its learning-rate grid and seeds
(`TaskResult`, made by `summarise_task` from the runs `select_best` picks) and an invocation's
(`FinetuneResult`)."""
from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from common.errors import BadRecord
from finetune.baselines import Baseline
from finetune.options import FinetuneConfig

RunStatus = Literal["finished", "diverged"]


@dataclass(frozen=True)
class TestPredictions:
    """Predictions for one unlabelled test split, as a leaderboard wants them."""

    split: str
    submission_file: str
    """The file's name: `.tsv` is tab-separated (GLUE's `RTE.tsv`), `.csv` comma-separated,
    `.lst` the predictions alone, one per line (Cosmos QA's)."""
    guids: list[str]
    predictions: list[str]
    """Label strings ("entailment", "1"), scores formatted with 3 decimals (STS-B) or choice
    indices (SWAG)."""
    columns: tuple[str, str] = ("index", "prediction")
    """The header: GLUE's `index`, `prediction`; SWAG's unnamed row index and `pred`."""


@dataclass(frozen=True)
class RunResult:
    """One fine-tuning run (one task, learning rate and seed) scored on dev."""

    task: str
    learning_rate: float
    seed: int
    metrics: dict[str, float]
    """Dev metrics as fractions, e.g. {"f1": 0.88, "accuracy": 0.84}."""
    score: float
    """The number that picks the best rate: the mean of the dev splits' `Scored.score`."""
    steps: int
    final_loss: float
    """Mean training loss over the last 10% of steps."""
    train_seconds: float
    eval_seconds: float
    files: dict[str, str] = field(default_factory=dict)
    """Prediction files of the dev splits (`Scored.files`), name -> text."""
    status: RunStatus = "finished"
    """"diverged": the loss left the finite numbers at step `steps` (`final_loss` is that
    loss); such a run has no metrics, its score is NaN, and `select_best` passes it over."""
    baseline: Baseline | None = None
    """The dev splits' baseline (`finetune.baselines`): what ignoring the input scores."""
    constant: str = ""
    """The one dev prediction every unit got ("all 1"), or "" when they differ."""

    def __post_init__(self) -> None:
        if isinstance(self.baseline, dict):  # read back from JSON (run store, flow manifest)
            object.__setattr__(self, "baseline", Baseline(**self.baseline))

    @property
    def finished(self) -> bool:
        return self.status == "finished"


@dataclass(frozen=True)
class RunRecord:
    """What a run leaves behind: its dev result and its test-set predictions (empty when the
    family predicts none, or the run diverged). `finetune.run_store` keeps one per file."""

    result: RunResult
    predictions: tuple[TestPredictions, ...] = ()


@dataclass(frozen=True)
class TaskResult:
    """A task fine-tuned over the learning-rate grid and seeds; the chosen rate's summary."""

    task: str
    best_learning_rate: float
    seeds: tuple[int, ...]
    metrics: dict[str, float]
    """Mean over seeds at the best rate."""
    metrics_std: dict[str, float]
    """Sample standard deviation over seeds (0 with one seed)."""
    score: float
    score_std: float
    runs: tuple[RunResult, ...]
    num_train_examples: int
    num_dev_examples: dict[str, int]
    bad_rows: int
    """Malformed records set aside while reading (only with skip_bad_rows)."""
    seconds: float
    test_predictions: tuple[TestPredictions, ...] = ()
    bad_records: tuple[BadRecord, ...] = ()
    """The records counted in `bad_rows` (file, line, reason, text) for the dead-letter file."""
    family: str = ""
    """The task's family ("glue", "squad", ...): the report's GLUE score averages GLUE tasks."""
    files: dict[str, str] = field(default_factory=dict)
    """The best run's prediction files, written under `<output>/<task>/`."""
    baseline: Baseline | None = None
    """The dev baseline of the task's runs (`finetune.baselines`), None for runs kept before
    baselines were recorded."""
    constant: str = ""
    """The best run's one dev prediction when its predictions are constant, else ""."""
    constant_runs: int = 0
    """Runs at the chosen rate whose dev predictions are constant."""


@dataclass(frozen=True)
class FinetuneResult:
    """All tasks of one invocation."""

    tasks: tuple[TaskResult, ...]
    model_dir: str
    config: FinetuneConfig
    """The settings every task shares (the recipe fields are each task's `configs` entry)."""
    seconds: float = 0.0
    pending_tasks: tuple[str, ...] = ()
    """Requested tasks not finished yet (in the report written after each finished task)."""
    configs: dict[str, FinetuneConfig] = field(default_factory=dict)
    """Each task's resolved settings (its family's recipe with the user's flags)."""


@dataclass(frozen=True)
class BestRuns:
    """The learning rate a task reports and the run whose weights predict its test sets."""

    learning_rate: float
    """The rate with the best mean dev score over its seeds (the first such rate on ties)."""
    runs: tuple[RunResult, ...]
    """The runs at `learning_rate`, one per seed, in run order."""
    best_run: RunResult
    """The best-scoring seed at `learning_rate` (the first on ties)."""


def select_best(runs: Sequence[RunResult]) -> BestRuns:
    """The best learning rate by mean dev score over seeds, and its best seed, among the
    finished runs.

    The one rule of both paths (`finetune_task` here and the flow's fan-out), so the reported
    rate, its mean, the prediction files and the test-set predictions always come from the
    same runs; the best single run of another rate (a lucky seed) never predicts. A rate that
    lost seeds (diverged) is not judged on the seeds it has left: only the rates with the most
    finished runs compete.
    """
    finished = [r for r in runs if r.finished]
    if not finished:
        raise ValueError("select_best: no runs finished")
    counts = Counter(r.learning_rate for r in finished)
    rates = [lr for lr in counts if counts[lr] == max(counts.values())]  # in run order
    by_rate = {lr: [r for r in finished if r.learning_rate == lr] for lr in rates}
    best_lr = max(rates, key=lambda lr: statistics.fmean(r.score for r in by_rate[lr]))
    chosen = by_rate[best_lr]
    return BestRuns(best_lr, tuple(chosen), max(chosen, key=lambda r: r.score))


def summarise_task(task: str, runs: Sequence[RunResult], num_train_examples: int,
                   num_dev_examples: dict[str, int], bad_rows: int, seconds: float,
                   test_predictions: tuple[TestPredictions, ...] = (),
                   bad_records: tuple[BadRecord, ...] = (), family: str = "") -> TaskResult:
    """A task's result from all its runs: the `select_best` rate's mean and spread over seeds,
    the best run's prediction files.

    `test_predictions` must be those of `select_best(runs).best_run`."""
    best = select_best(runs)
    names = list(best.runs[0].metrics)
    mean = {n: statistics.fmean(r.metrics[n] for r in best.runs) for n in names}
    std = {n: statistics.stdev(r.metrics[n] for r in best.runs) if len(best.runs) > 1 else 0.0
           for n in names}
    scores = [r.score for r in best.runs]
    return TaskResult(
        task=task, best_learning_rate=best.learning_rate,
        seeds=tuple(r.seed for r in best.runs), metrics=mean, metrics_std=std,
        score=statistics.fmean(scores),
        score_std=statistics.stdev(scores) if len(scores) > 1 else 0.0, runs=tuple(runs),
        num_train_examples=num_train_examples, num_dev_examples=num_dev_examples,
        bad_rows=bad_rows, seconds=seconds, test_predictions=test_predictions,
        bad_records=bad_records, family=family, files=dict(best.best_run.files),
        baseline=best.best_run.baseline, constant=best.best_run.constant,
        constant_runs=sum(bool(r.constant) for r in best.runs))
