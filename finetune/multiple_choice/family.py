"""Multiple choice as a task family of the one fine-tuning loop (SWAG, paper section 4.4).

A unit is one example with all its choices: `batch_size` 16 is 16 questions, 64 sequences.
Each choice's sequence gets a score from the pooled `[CLS]` (`BertForMultipleChoice`); the
loss is the cross-entropy of the softmax over an example's choices; the metric is accuracy,
and `predictions.json` maps each example id to the chosen index.

Batches are packed: the B x C sequences of a batch are laid out in rows of max_seq_length
tokens (`finetune.packing`), and the encoder's per-instance attention (`sequence_ids`) keeps each
sequence on its own, so scores are those of the padded layout, without the pad tokens' work.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from finetune.baselines import Baseline, constant_text
from finetune.family import EvalTexts, Prepared, Recipe, Scored
from finetune.multiple_choice import data as mc_data
from finetune.packing import SlotBatch, lay_out, one_per_row, pack_rows
from finetune.results import TestPredictions
from model.bert import BertModel
from model.encoders import tells_pairs_apart
from model.heads import BertForMultipleChoice

TASKS = ("swag", "cosmosqa")

# The paper's SWAG recipe (section 4.4): 3 epochs, learning rate 2e-5, batch size 16. Cosmos QA
# has the same shape (a passage, four candidates) and takes the same recipe.
RECIPE = Recipe(max_seq_length=mc_data.MAX_SEQ_LENGTH, batch_size=16, epochs=3.0,
                learning_rates=(2e-5,))


class ChoiceBatch(SlotBatch):
    """The sequences of B examples x C choices in R rows of T tokens, K slots per row;
    `rows` and `slots` (B, C) place choice c of example b (examples in the order the batch was
    given), `labels` (B,) are the gold choices, -1 where unlabelled."""


def _sequences(encoded: mc_data.EncodedChoices, indices: Sequence[int]
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Input and token type ids of every choice of the examples at `indices`, example-major."""
    ids = [seq for i in indices for seq in encoded.input_ids[i]]
    types = [seq for i in indices for seq in encoded.token_type_ids[i]]
    return ids, types


def _choice_batch(encoded: mc_data.EncodedChoices, indices: Sequence[int],
                  row_length: int | None) -> ChoiceBatch:
    ids, types = _sequences(encoded, indices)
    layout = (one_per_row(len(ids)) if row_length is None
              else pack_rows([len(x) for x in ids], row_length))
    out = lay_out(ids, types, layout)
    return ChoiceBatch.of(out, encoded.labels[list(indices)],
                          (len(indices), encoded.num_choices))


def pack_choices(encoded: mc_data.EncodedChoices, indices: Sequence[int],
                 row_length: int) -> ChoiceBatch:
    """The choices of the examples at `indices` packed into rows of <= row_length tokens."""
    return _choice_batch(encoded, indices, row_length)


def pad_choices(encoded: mc_data.EncodedChoices, indices: Sequence[int]) -> ChoiceBatch:
    """One sequence per row, padded to the batch's longest (transformers' layout, flattened)."""
    return _choice_batch(encoded, indices, None)


def choice_scores(model: BertForMultipleChoice, batch: ChoiceBatch) -> Tensor:
    """(B, C) choice scores of the batch's examples in their given order.

    `BertForMultipleChoice.forward` on packed rows: every slot's [CLS] is pooled, then
    rows/slots put each choice in its (example, choice) place.
    """
    hidden = model.bert(batch.input_ids, batch.token_type_ids,
                        sequence_ids=batch.sequence_ids)  # (R, T, H)
    pooled = model.bert.pool(hidden, batch.cls_positions, batch.sequence_ids)  # (R, K, H)
    return model.score(pooled[batch.rows, batch.slots])  # (B, C, H) -> (B, C)


def accuracy(labels: np.ndarray, scores: np.ndarray) -> float:
    """Fraction of examples whose best-scored choice is the gold one; (N,), (N, C)."""
    return float(np.mean(scores.argmax(-1) == labels))


@dataclass(frozen=True)
class MultipleChoiceFamily:
    """SWAG and Cosmos QA: the readers and encoding of `data`, the head and the metric."""

    name: ClassVar[str] = "multiple_choice"
    pack_sequences: bool = True
    """Pack a batch's sequences into shared rows instead of padding each (same scores)."""
    predict_test: bool = True
    """Read the task's test file (SWAG's test.csv, Cosmos QA's test.jsonl), where present, for
    the best run to predict for the leaderboard."""

    def spec(self, task: str) -> mc_data.ChoiceTaskSpec:
        if task not in mc_data.SPECS:
            raise ValueError(f"unknown multiple-choice task {task!r}; known: {TASKS}")
        return mc_data.SPECS[task]

    def recipe(self, task: str) -> Recipe:
        self.spec(task)
        return RECIPE

    def is_small(self, task: str) -> bool:
        """Neither is: SWAG has 73,546 training and 20,006 dev questions, Cosmos QA 25,262 and
        2,985; the paper reports one run of SWAG. The first seed only."""
        self.spec(task)
        return False

    def check_files(self, task: str, data_dir: str) -> None:
        mc_data.check_files(data_dir, self.spec(task))

    def check_model(self, encoder: BertModel, task: str, model_dir: str) -> None:
        """Every choice is a sequence pair: two token types."""
        if not tells_pairs_apart(encoder.config):
            raise ValueError(f"{task}: (A, choice) pairs need 2 token types but the model "
                             f"{model_dir} has type_vocab_size {encoder.config.type_vocab_size}")

    def eval_texts(self, task: str, data_dir: str,
                   skip_bad_records: bool = False) -> list[EvalTexts]:
        """dev, and test where present: each question's sequence A (SWAG: sent1; Cosmos QA:
        context + question) and its choices (SWAG: sent2 + ending), by its id."""
        spec = self.spec(task)
        splits = {"dev": mc_data.read_split(data_dir, spec, "dev", skip_bad_records)}
        if spec.test_file is not None and os.path.isfile(spec.path(data_dir, "test")):
            splits["test"] = mc_data.read_choice_file(spec.path(data_dir, "test"), spec,
                                                      labelled=False,
                                                      skip_bad_records=skip_bad_records)
        return [EvalTexts.of(task, name, [s.path], ((e.example_id, (e.first, *e.choices))
                                                    for e in s.examples))
                for name, s in splits.items()]

    def prepare(self, task: str, data_dir: str, tokenizer, max_seq_length: int,
                max_train_examples: int | None, max_eval_examples: int | None,
                skip_bad_records: bool) -> Prepared:
        spec = self.spec(task)
        train = mc_data.read_split(data_dir, spec, "train", skip_bad_records)
        dev = mc_data.read_split(data_dir, spec, "dev", skip_bad_records)
        splits = [train, dev]
        test = {}
        if self.predict_test and spec.test_file is not None \
                and os.path.isfile(spec.path(data_dir, "test")):
            splits.append(mc_data.read_choice_file(spec.path(data_dir, "test"), spec,
                                                   labelled=False,
                                                   skip_bad_records=skip_bad_records))
            test = {"test": mc_data.encode_split(tokenizer, splits[-1], max_seq_length)}
        # Subsets keep every bad row of the file: they were read, so they are reported.
        bad = tuple(b for split in splits for b in split.bad_records)
        train = mc_data.subset(train, max_train_examples)
        dev = mc_data.subset(dev, max_eval_examples)
        return Prepared(
            task=task,
            train=mc_data.encode_split(tokenizer, train, max_seq_length),
            dev={"dev": mc_data.encode_split(tokenizer, dev, max_seq_length)},
            num_train_examples=len(train), num_dev_examples={"dev": len(dev)},
            bad_records=bad, context=test)

    def build_head(self, encoder: BertModel, task: str) -> BertForMultipleChoice:
        return BertForMultipleChoice.from_encoder(encoder)

    def make_batch(self, encoded: mc_data.EncodedChoices, indices: Sequence[int],
                   max_seq_length: int, train: bool,
                   row_length: int | None = None) -> ChoiceBatch:
        # Unpacked (row_length None): one sequence per row, as `pad_choices`.
        return _choice_batch(encoded, indices,
                             (row_length or max_seq_length) if self.pack_sequences else None)

    def loss(self, model: BertForMultipleChoice, batch: ChoiceBatch) -> Tensor:
        return F.cross_entropy(choice_scores(model, batch).float(), batch.labels)

    def outputs(self, model: BertForMultipleChoice, batch: ChoiceBatch) -> dict[str, Tensor]:
        return {"scores": choice_scores(model, batch).float()}

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        encoded: mc_data.EncodedChoices = prepared.dev[split]
        scores = outputs["scores"]  # (N, C)
        if scores.shape != (len(encoded), encoded.num_choices):
            raise ValueError(f"{prepared.task} {split}: scores of shape {scores.shape} for "
                             f"{len(encoded)} examples of {encoded.num_choices} choices")
        value = accuracy(encoded.labels, scores)
        chosen = scores.argmax(-1).tolist()
        predictions = dict(zip(encoded.example_ids, chosen))
        chance = 1 / encoded.num_choices
        return Scored({"accuracy": value}, value,
                      {"predictions.json": json.dumps(predictions, indent=1) + "\n"},
                      baseline=Baseline(f"chance (1 of {encoded.num_choices})",
                                        {"accuracy": chance}, chance),
                      constant=constant_text(chosen, lambda c: f"always choice {c}"))


    def test_splits(self, prepared: Prepared) -> dict[str, mc_data.EncodedChoices]:
        """The test file read by `prepare` ({} without one, or with predict_test false)."""
        return prepared.context or {}

    def test_predictions(self, prepared: Prepared, split: str,
                         outputs: dict[str, np.ndarray]) -> TestPredictions:
        """The chosen choice of every test question, in the file's order: SWAG's leaderboard
        file `,pred` by row index, Cosmos QA's one label per line (`.lst`)."""
        encoded: mc_data.EncodedChoices = prepared.context[split]
        chosen = [str(c) for c in outputs["scores"].argmax(-1)]
        return TestPredictions(split, self.spec(prepared.task).submission_file,
                               list(encoded.example_ids), chosen, columns=("", "pred"))


FAMILY = MultipleChoiceFamily()
