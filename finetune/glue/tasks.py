"""The nine GLUE tasks as data: files, columns, labels, metrics and leaderboard file names.

One `TaskSpec` per task in `TASKS`; everything task-specific that readers, metrics, fine-tuning and
the submission writer need lives here, so no code branches on a task name.

Column indexes are those of the files `download_glue_data.py` writes (the `glue_data/` layout,
as in `data/sample/glue/`); `hf_*` names are those of the Hugging Face `datasets` GLUE configs
(`nyu-mll/glue`), whose integer labels index `labels` in the order given here.
"""
from __future__ import annotations

from dataclasses import dataclass

# Metric names understood by finetune.glue.metrics.compute_metrics.
MCC, ACCURACY, F1, PEARSON, SPEARMAN = "mcc", "accuracy", "f1", "pearson", "spearman"


@dataclass(frozen=True)
class TsvColumns:
    """Where one GLUE TSV file keeps its fields (0-based column indexes)."""

    num_columns: int
    """Exact number of tab-separated fields on every row (header included)."""
    text_a: int
    """Column of the first sentence."""
    text_b: int | None = None
    """Column of the second sentence (None for single-sentence tasks)."""
    label: int | None = None
    """Column of the gold label or score (None in test files)."""
    index: int | None = None
    """Column of the example id (None: ids are the data-row numbers from 0)."""
    has_header: bool = True
    """Whether the first row names the columns (CoLA train/dev have none)."""

    def __post_init__(self) -> None:
        used = [c for c in (self.text_a, self.text_b, self.label, self.index) if c is not None]
        if any(c < 0 or c >= self.num_columns for c in used):
            raise ValueError(f"TsvColumns: column index out of range 0..{self.num_columns - 1}")


@dataclass(frozen=True)
class SplitSpec:
    """One file of a task (train, a dev set or a test set)."""

    name: str
    """Split name used in results: "train", "dev", "dev_matched", "test", "test_ax", ..."""
    path: str
    """File path relative to the GLUE data folder, e.g. "MNLI/dev_matched.tsv"."""
    columns: TsvColumns
    """Layout of the TSV file."""
    hf_split: str
    """Split name in the Hugging Face `datasets` layout, e.g. "validation_matched"."""
    hf_config: str | None = None
    """HF config when it differs from the task's (the diagnostic set is config "ax")."""
    metric_suffix: str = ""
    """Appended to metric names of a dev split ("_m"/"_mm" for MNLI) so both are kept."""
    submission_file: str | None = None
    """Leaderboard file for a test split, e.g. "MNLI-m.tsv"."""


@dataclass(frozen=True)
class TaskSpec:
    """Everything task-specific about one GLUE task."""

    name: str
    """Leaderboard name: "CoLA", "SST-2", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"."""
    hf_config: str
    """Hugging Face `datasets` config name ("cola", "sst2", "stsb", ...)."""
    hf_text_fields: tuple[str, ...]
    """HF column names of the one or two sentences."""
    labels: tuple[str, ...]
    """Label strings as written in the TSVs and the submission (empty for regression)."""
    metrics: tuple[str, ...]
    """Metric names; the task's GLUE score is their mean over all dev splits."""
    train: SplitSpec
    """The training file."""
    dev: tuple[SplitSpec, ...]
    """Dev files scored (two for MNLI: matched and mismatched)."""
    test: tuple[SplitSpec, ...]
    """Unlabelled test files predicted for the leaderboard (MNLI also predicts AX)."""
    small: bool = False
    """Small dev set: the recipe runs several seeds and reports their mean and spread."""

    @property
    def is_regression(self) -> bool:
        return not self.labels

    @property
    def num_labels(self) -> int:
        """Output size of the classifier (1 for regression)."""
        return len(self.labels) or 1

    @property
    def is_pair(self) -> bool:
        return len(self.hf_text_fields) == 2


def _pair(num_columns: int, a: int, b: int, label: int | None, index: int | None = 0) -> TsvColumns:
    return TsvColumns(num_columns=num_columns, text_a=a, text_b=b, label=label, index=index)


def _task(name: str, folder: str, hf_config: str, hf_text_fields: tuple[str, ...],
          labels: tuple[str, ...], metrics: tuple[str, ...], train: TsvColumns, dev: TsvColumns,
          test: TsvColumns, small: bool) -> TaskSpec:
    """A task with one train, one dev and one test file named as download_glue_data.py does."""
    return TaskSpec(
        name=name, hf_config=hf_config, hf_text_fields=hf_text_fields, labels=labels,
        metrics=metrics, small=small,
        train=SplitSpec("train", f"{folder}/train.tsv", train, "train"),
        dev=(SplitSpec("dev", f"{folder}/dev.tsv", dev, "validation"),),
        test=(SplitSpec("test", f"{folder}/test.tsv", test, "test", submission_file=f"{name}.tsv"),),
    )


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
_NLI3 = ("entailment", "neutral", "contradiction")  # HF datasets' MNLI label order

# CoLA train/dev: source, label, original judgement, sentence; no header.
_COLA = TsvColumns(num_columns=4, text_a=3, label=1, index=None, has_header=False)
# MRPC train/dev: Quality, #1 ID, #2 ID, #1 String, #2 String (the label comes first).
_MRPC = _pair(5, 3, 4, label=0, index=None)
# STS-B: index genre filename year old_index source1 source2 sentence1 sentence2 [score].
_STSB = _pair(10, 7, 8, label=9)
# MNLI: index promptID pairID genre 4 parses sentence1 sentence2 [label1..5] gold_label.
_MNLI_TEST = _pair(10, 8, 9, label=None)
_MNLI_DEV = _pair(16, 8, 9, label=15)
_AX = _pair(3, 1, 2, label=None)

MNLI = TaskSpec(
    name="MNLI", hf_config="mnli", hf_text_fields=("premise", "hypothesis"), labels=_NLI3,
    metrics=(ACCURACY,),
    train=SplitSpec("train", "MNLI/train.tsv", _pair(12, 8, 9, label=11), "train"),
    dev=(SplitSpec("dev_matched", "MNLI/dev_matched.tsv", _MNLI_DEV, "validation_matched",
                   metric_suffix="_m"),
         SplitSpec("dev_mismatched", "MNLI/dev_mismatched.tsv", _MNLI_DEV, "validation_mismatched",
                   metric_suffix="_mm")),
    test=(SplitSpec("test_matched", "MNLI/test_matched.tsv", _MNLI_TEST, "test_matched",
                    submission_file="MNLI-m.tsv"),
          SplitSpec("test_mismatched", "MNLI/test_mismatched.tsv", _MNLI_TEST, "test_mismatched",
                    submission_file="MNLI-mm.tsv"),
          # The diagnostic set is scored on the leaderboard with the MNLI classifier.
          SplitSpec("test_ax", "diagnostic/diagnostic.tsv", _AX, "test", hf_config="ax",
                    submission_file="AX.tsv")),
)

TASKS: dict[str, TaskSpec] = {t.name: t for t in (
    _task("CoLA", "CoLA", "cola", ("sentence",), _BINARY, (MCC,), train=_COLA, dev=_COLA,
          test=TsvColumns(num_columns=2, text_a=1, index=0), small=True),
    _task("SST-2", "SST-2", "sst2", ("sentence",), _BINARY, (ACCURACY,),
          train=TsvColumns(num_columns=2, text_a=0, label=1), dev=TsvColumns(2, 0, label=1),
          test=TsvColumns(num_columns=2, text_a=1, index=0), small=False),
    _task("MRPC", "MRPC", "mrpc", ("sentence1", "sentence2"), _BINARY, (F1, ACCURACY),
          train=_MRPC, dev=_MRPC, test=_pair(5, 3, 4, label=None), small=True),
    _task("STS-B", "STS-B", "stsb", ("sentence1", "sentence2"), (), (PEARSON, SPEARMAN),
          train=_STSB, dev=_STSB, test=_pair(9, 7, 8, label=None), small=True),
    # QQP: id qid1 qid2 question1 question2 is_duplicate; test: id question1 question2.
    _task("QQP", "QQP", "qqp", ("question1", "question2"), _BINARY, (F1, ACCURACY),
          train=_pair(6, 3, 4, label=5), dev=_pair(6, 3, 4, label=5),
          test=_pair(3, 1, 2, label=None), small=False),
    MNLI,
    _task("QNLI", "QNLI", "qnli", ("question", "sentence"), _NLI2, (ACCURACY,),
          train=_pair(4, 1, 2, label=3), dev=_pair(4, 1, 2, label=3),
          test=_pair(3, 1, 2, label=None), small=False),
    _task("RTE", "RTE", "rte", ("sentence1", "sentence2"), _NLI2, (ACCURACY,),
          train=_pair(4, 1, 2, label=3), dev=_pair(4, 1, 2, label=3),
          test=_pair(3, 1, 2, label=None), small=True),
    _task("WNLI", "WNLI", "wnli", ("sentence1", "sentence2"), _BINARY, (ACCURACY,),
          train=_pair(4, 1, 2, label=3), dev=_pair(4, 1, 2, label=3),
          test=_pair(3, 1, 2, label=None), small=True),
)}

# Leaderboard submission files in the order the GLUE server lists them.
SUBMISSION_FILES = ("CoLA.tsv", "SST-2.tsv", "MRPC.tsv", "STS-B.tsv", "QQP.tsv", "MNLI-m.tsv",
                    "MNLI-mm.tsv", "QNLI.tsv", "RTE.tsv", "WNLI.tsv", "AX.tsv")


def get_task(name: str) -> TaskSpec:
    """The spec for a task name, case- and dash-insensitive ("sts-b", "stsb", "STS-B")."""
    key = name.strip().lower().replace("-", "").replace("_", "")
    for task in TASKS.values():
        if key in (task.name.lower().replace("-", ""), task.hf_config):
            return task
    raise ValueError(f"--tasks: unknown GLUE task {name!r}; known: {', '.join(TASKS)}")


def parse_tasks(names: str) -> list[TaskSpec]:
    """Task specs for a comma-separated list ("rte,mrpc"); "all" means the nine tasks."""
    parts = [n for n in names.split(",") if n.strip()]
    if not parts:
        raise ValueError("--tasks: no task given")
    if [p.strip().lower() for p in parts] == ["all"]:
        return list(TASKS.values())
    specs = [get_task(p) for p in parts]
    if len({s.name for s in specs}) != len(specs):
        raise ValueError(f"--tasks: a task is listed twice in {names!r}")
    return specs
