"""GLUE as a task family of the one loop (finetune/loop.py): sentence(-pair) classification and
STS-B regression on the pooled [CLS] (the paper, section 4.1).

Batches are packed, not padded: the examples of a batch (the same 32 examples a padded batch
would hold) are laid out into max_seq_length rows (`finetune.packing`), and the encoder's
per-instance attention (`sequence_ids`) keeps each example on its own. The output of each
example is the same as alone; only the pad tokens' work is saved.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from finetune.baselines import Baseline, constant_text
from finetune.capabilities import FamilySummary
from finetune.family import EvalTexts, Prepared, Recipe, Scored
from finetune.glue import data as glue_data
from finetune.glue.metrics import compute_metrics, glue_score, task_score
from finetune.glue.tasks import SUBMISSION_FILES, SplitSpec, TaskSpec, get_task
from finetune.options import FinetuneConfig, for_recipe
from finetune.packing import SlotBatch, lay_out, pack_rows
from finetune.results import TaskResult, TestPredictions
from model.bert import BertModel
from model.encoders import tells_pairs_apart
from model.heads import BertForSequenceClassification

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GlueContext:
    """What scoring and test predictions need besides the raw outputs."""

    spec: TaskSpec
    test: dict[str, glue_data.EncodedSplit]
    """Unlabelled test splits read (empty without `predict_test` or test files)."""


# ---------------------------------------------------------------------------------------------
# Packed batches
# ---------------------------------------------------------------------------------------------

class PackedBatch(SlotBatch):
    """Examples laid out in shared rows: R rows of T tokens, B examples, K slots per row;
    `rows` and `slots` (B,) place example b (in the order the batch was given), `labels` (B,)
    are class ids or scores."""


def pack_batch(encoded: glue_data.EncodedSplit, indices: Sequence[int],
               row_length: int | None = None) -> PackedBatch:
    """The examples at `indices` packed into rows of at most `row_length` tokens.

    The default row length is the batch's longest example: rows no longer than a padded
    batch's. Longer rows pack tighter; the model attends within each example either way.
    """
    ids = [encoded.input_ids[i] for i in indices]
    types = [encoded.token_type_ids[i] for i in indices]
    out = lay_out(ids, types, pack_rows([len(x) for x in ids],
                                        row_length or max(len(x) for x in ids)))
    return PackedBatch.of(out, encoded.labels[list(indices)])


def padded_batch(encoded: glue_data.EncodedSplit, indices: Sequence[int]) -> PackedBatch:
    """The examples at `indices` one per row, padded to the longest (the unpacked layout)."""
    b = glue_data.collate(encoded, indices)
    n = len(indices)
    sequence_ids = b.attention_mask.long() - 1  # (B, T): 0 for tokens, -1 for padding
    return PackedBatch(b.input_ids, b.token_type_ids, sequence_ids,
                       torch.zeros((n, 1), dtype=torch.long), torch.arange(n),
                       torch.zeros(n, dtype=torch.long), b.labels)


def classifier_logits(model: BertForSequenceClassification, batch: PackedBatch) -> Tensor:
    """(B, num_labels) logits of the batch's examples in their given order.

    The computation of `BertForSequenceClassification.forward` (dropout + linear on the pooled
    [CLS]) on packed rows: each slot's [CLS] is pooled, then rows/slots restore batch order.
    """
    hidden = model.bert(batch.input_ids, batch.token_type_ids,
                        sequence_ids=batch.sequence_ids)  # (R, T, H)
    pooled = model.bert.pool(hidden, batch.cls_positions, batch.sequence_ids)  # (R, K, H)
    pooled = pooled[batch.rows, batch.slots]  # (B, H)
    return model.classifier(model.dropout(pooled))


def loss_fn(logits: Tensor, labels: Tensor) -> Tensor:
    """Cross-entropy for classification, mean squared error for regression (one output)."""
    if logits.shape[-1] == 1:
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels.long())


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

def subset(split: glue_data.GlueSplit, limit: int | None, seed: int = 0) -> glue_data.GlueSplit:
    """A fixed random subset of `limit` examples in file order (all when limit is None)."""
    return split.subset(limit, seed)


def prepare_task(task: TaskSpec, data_dir: str, tokenizer, max_seq_length: int,
                 max_train_examples: int | None, max_eval_examples: int | None,
                 skip_bad_rows: bool, predict_test: bool,
                 read: Callable[[SplitSpec], glue_data.GlueSplit] | None = None) -> Prepared:
    """Read and tokenize the train, dev and (when present and asked for) test files of `task`.

    `read` reads one split in place of the GLUE layouts under `data_dir` (a user's task,
    finetune/user: its CSV, TSV or JSON lines by column name); a test split is read where
    `os.path.isfile(split.path)` then."""
    def load(split_spec, limit=None, required=True):
        split = (read or (lambda s: glue_data.read_split(data_dir, task, s, skip_bad_rows)))(
            split_spec)
        if required and not split.examples:
            # 0 training steps or an empty dev set would still "score" and report a number.
            aside = f" ({len(split.bad_rows)} malformed rows set aside)" if split.bad_rows else ""
            raise glue_data.GlueFormatError(
                f"{split.path}: no {task.name} {split_spec.name} examples{aside}")
        return subset(split, limit)

    train = load(task.train, max_train_examples)
    devs = {s.name: load(s, max_eval_examples) for s in task.dev}
    tests = {}
    if predict_test:
        present = (lambda s: os.path.isfile(s.path)) if read else (
            lambda s: glue_data.has_split(data_dir, task, s))
        tests = {s.name: load(s, required=False) for s in task.test if present(s)}
    # Subsets keep every bad row of the file: they were read, so they are reported.
    bad_records = tuple(b for s in (train, *devs.values(), *tests.values()) for b in s.bad_rows)
    if bad_records:
        log.warning("%s: set aside %d malformed rows (written to the dead-letter file of the "
                    "results)", task.name, len(bad_records))
    tokenizer = glue_data.truncating(tokenizer, max_seq_length)

    def encode(split):
        return glue_data.encode_split(tokenizer, split, task)

    return Prepared(task=task.name, train=encode(train),
                    dev={k: encode(v) for k, v in devs.items()},
                    num_train_examples=len(train.examples),
                    num_dev_examples={k: len(v.examples) for k, v in devs.items()},
                    bad_records=bad_records,
                    context=GlueContext(task, {k: encode(v) for k, v in tests.items()}))


# ---------------------------------------------------------------------------------------------
# The family
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class GlueFamily:
    """The nine GLUE tasks (finetune/glue/tasks.py); satisfies `finetune.family.Family`, with
    the optional `SizedTasks`, `TestSets`, `ModelChecks` and `Summaries`
    (finetune/capabilities.py)."""

    name: ClassVar[str] = "glue"
    pack_sequences: bool = True
    """Pack each batch's examples into shared rows instead of padding them (same results)."""
    predict_test: bool = True
    """Read the test files (when present) for the best run to predict, for the leaderboard."""

    def recipe(self, task: str) -> Recipe:
        get_task(task)  # an unknown name fails here, naming the known ones
        return Recipe()  # the paper's GLUE recipe

    def is_small(self, task: str) -> bool:
        return get_task(task).small

    def check_files(self, task: str, data_dir: str) -> None:
        """FileNotFoundError (every problem a missing file) or GlueFormatError, one line per
        problem."""
        missing, malformed = glue_data.file_problems(data_dir, [get_task(task)],
                                                     self.predict_test)
        if malformed:
            raise glue_data.GlueFormatError("\n".join(missing + malformed))
        if missing:
            raise FileNotFoundError("\n".join(missing))

    def check_model(self, encoder: BertModel, task: str, model_dir: str) -> None:
        """Sentence pairs need two token types."""
        spec = get_task(task)
        if spec.is_pair and not tells_pairs_apart(encoder.config):
            raise ValueError(f"{spec.name}: sentence pairs need 2 token types but the model "
                             f"{model_dir} has type_vocab_size {encoder.config.type_vocab_size}")

    def eval_texts(self, task: str, data_dir: str,
                   skip_bad_records: bool = False) -> list[EvalTexts]:
        """Every dev split and every test split present: each example's one or two sentences,
        by its guid."""
        spec = get_task(task)
        splits = [glue_data.read_split(data_dir, spec, s, skip_bad_records) for s in spec.dev]
        splits += [glue_data.read_split(data_dir, spec, s, skip_bad_records) for s in spec.test
                   if glue_data.has_split(data_dir, spec, s)]
        return [EvalTexts.of(task, s.split, s.path.split(","),
                             ((e.guid, (e.text_a, e.text_b or "")) for e in s.examples))
                for s in splits]

    def prepare(self, task: str, data_dir: str, tokenizer, max_seq_length: int,
                max_train_examples: int | None, max_eval_examples: int | None,
                skip_bad_records: bool) -> Prepared:
        return prepare_task(get_task(task), data_dir, tokenizer, max_seq_length,
                            max_train_examples, max_eval_examples, skip_bad_records,
                            self.predict_test)

    def build_head(self, encoder: BertModel, task: str) -> nn.Module:
        return BertForSequenceClassification.from_encoder(encoder, get_task(task).num_labels)

    def make_batch(self, encoded: glue_data.EncodedSplit, indices: Sequence[int],
                   max_seq_length: int, train: bool,
                   row_length: int | None = None) -> PackedBatch:
        if self.pack_sequences:
            # On the CPU attention runs per example (model.attention.attention_plan), so a row's
            # length costs only its padding: long rows pack tightest (MRPC: 1,813 tokens per
            # batch of 32 in rows of 128 vs 2,110 in rows as long as the longest example).
            return pack_batch(encoded, indices, row_length or max_seq_length)
        return padded_batch(encoded, indices)

    def loss(self, model: nn.Module, batch: PackedBatch) -> Tensor:
        return loss_fn(classifier_logits(model, batch), batch.labels)

    def outputs(self, model: nn.Module, batch: PackedBatch) -> dict[str, Tensor]:
        return {"logits": classifier_logits(model, batch).float()}  # (B, num_labels)

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        spec = prepared.context.spec
        suffix = next(s.metric_suffix for s in spec.dev if s.name == split)
        dev = prepared.dev[split]
        values = predictions(spec, outputs["logits"])
        metrics = compute_metrics(spec, dev.labels, values, suffix=suffix)
        baseline = input_free_baseline(spec, prepared.train.labels, dev.labels, suffix)
        constant = constant_text(label_texts(spec, values))
        return Scored(metrics=metrics, score=task_score(metrics),
                      files={f"predictions_{split}.tsv": dev_predictions_tsv(spec, dev, values)},
                      baseline=baseline, constant=constant and f"all {constant}")

    def test_splits(self, prepared: Prepared) -> Mapping[str, glue_data.EncodedSplit]:
        return prepared.context.test

    def test_predictions(self, prepared: Prepared, split: str,
                         outputs: dict[str, np.ndarray]) -> TestPredictions:
        spec = prepared.context.spec
        values = predictions(spec, outputs["logits"])
        if spec.is_regression:
            # STS-B gold scores lie in [0, 5]; clipping can only bring predictions closer.
            labels = [f"{v:.3f}" for v in np.clip(values, 0.0, 5.0)]
        else:
            labels = [spec.labels[v] for v in values]
        submission = next(s.submission_file for s in spec.test if s.name == split)
        return TestPredictions(split, submission, list(prepared.context.test[split].guids), labels)

    def summary(self, tasks: Sequence[TaskResult]) -> FamilySummary:
        """The GLUE score of the tasks run, and the leaderboard's files."""
        score = glue_score({t.task: t.score for t in tasks})
        return FamilySummary("glue_score", "GLUE score", score, SUBMISSION_FILES)


def label_texts(spec: TaskSpec, values: np.ndarray) -> list[str]:
    """Class ids as the task's label strings; scores with 3 decimals."""
    if spec.is_regression:
        return [f"{v:.3f}" for v in values]
    return [spec.labels[int(v)] for v in values]


def dev_predictions_tsv(spec: TaskSpec, dev: glue_data.EncodedSplit, values: np.ndarray) -> str:
    """`index\tprediction\tlabel`, one line per dev example in file order."""
    lines = ["index\tprediction\tlabel"]
    lines += [f"{guid}\t{predicted}\t{gold}" for guid, predicted, gold in
              zip(dev.guids, label_texts(spec, values), label_texts(spec, dev.labels))]
    return "\n".join(lines) + "\n"


def input_free_baseline(spec: TaskSpec, train_labels: np.ndarray, dev_labels: np.ndarray,
                        suffix: str = "") -> Baseline:
    """The training set's majority class (regression: its mean) predicted for every dev
    example, scored as the run is."""
    if spec.is_regression:
        value = float(np.mean(train_labels))
        kind = f"training mean {value:.2f}"
    else:
        value = int(np.bincount(train_labels.astype(np.int64)).argmax())
        kind = f"majority class {spec.labels[value]}"
    metrics = compute_metrics(spec, dev_labels, np.full(len(dev_labels), value), suffix=suffix)
    return Baseline(kind, metrics, task_score(metrics))


def predictions(spec: TaskSpec, logits: np.ndarray) -> np.ndarray:
    """(N,) class ids, or scores for STS-B, from (N, num_labels) logits."""
    return logits[:, 0] if spec.is_regression else logits.argmax(-1)


FAMILY = GlueFamily()


def paper_recipe(**changes) -> FinetuneConfig:
    """The loop's settings with the paper's GLUE recipe, with overrides."""
    return for_recipe(FAMILY.recipe("rte"), **changes)


def debug_recipe(**changes) -> FinetuneConfig:
    """A minutes-long run for tests and the demo: one rate, one seed, one epoch."""
    defaults = {"learning_rates": (5e-5,), "seeds": (1,), "epochs": 1.0}
    return paper_recipe(**{**defaults, **changes})
