"""NER as a fine-tuning family (`finetune.family.Family`): CoNLL-2003 and WNUT-17.

The paper's recipe (section 5.3 / appendix A.3): max_seq_length 128, batch 32 sentences, 3
epochs, peak learning rate picked on dev among 5e-5, 4e-5, 3e-5, 2e-5 (the GLUE grid; A.3's
grid is 5e-5/3e-5/2e-5 with batch 16 or 32 and 2-4 epochs, and 4e-5 costs one run more).
A token classifier (dropout + linear) on every first sub-token; the loss is the mean
cross-entropy over those, as transformers' `BertForTokenClassification` computes it. Dev is
scored as the CoNLL scorer does (entity F1; `finetune.ner.metrics`), and the predictions are
written as `predictions_<split>.txt` in conlleval's input layout (word gold predicted).
The labelled test file, where present (CoNLL-2003's `test.txt`: the paper reports test F1), is
scored the same way as the "test" split, reported as `test_f1`/`test_precision`/`test_recall`
beside dev's metrics and never used to pick the learning rate (`Scored.selects`).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from finetune.baselines import Baseline, constant_text
from finetune.family import EvalTexts, Prepared, Recipe, Scored
from finetune.ner import data
from finetune.ner.encode import EncodedNer, NerBatch, encode_sentences
from finetune.ner.encode import make_batch as pack_units
from finetune.ner.metrics import conll_predictions, entity_scores
from finetune.ner.tasks import NER_TASKS, NerTask
from model.bert import BertModel
from model.heads import BertForTokenClassification

log = logging.getLogger(__name__)

TEST_METRICS = ("f1", "precision", "recall")
"""Test-split metrics reported (as `test_<name>`) beside dev's."""

PAPER_RECIPE = Recipe()
"""The paper gives NER no recipe of its own: appendix A.3's grid, as GLUE's."""


@dataclass(frozen=True)
class NerContext:
    """What scoring needs besides the logits: the label list and each split's sentences."""

    labels: tuple[str, ...]
    """Label ids -> tags (the training file's tags, `data.label_list`)."""
    sentences: dict[str, list[data.Sentence]]
    """Sentences of each evaluation split, in the order its units refer to them."""
    encoded: dict[str, EncodedNer]
    """Each evaluation split's units (which sentence and words each covers)."""


def task_spec(task: str) -> NerTask:
    if task not in NER_TASKS:
        raise ValueError(f"unknown NER task {task!r}; known: {', '.join(NER_TASKS)}")
    return NER_TASKS[task]


def split_paths(task: str, task_dir: str) -> dict[str, str]:
    """train/dev/test file paths of `task` in its folder (`D/conll2003`, what the loop passes
    as `data_dir`: `--data` joined with `DATA_FOLDERS[task]`)."""
    spec = task_spec(task)
    return {name: os.path.join(task_dir, getattr(spec, name)) for name in ("train", "dev", "test")}


def conll_texts(task: str, split: str, path: str, fmt: data.NerFormat,
                skip_bad_records: bool = False) -> EvalTexts:
    """The sentences of one CoNLL file as the audit reads them: words joined by spaces, each
    sentence by its first line."""
    read = data.read_conll(path, fmt, skip_bad_records)
    return EvalTexts.of(task, split, [path], ((f"line {s.line}", (" ".join(s.words),))
                                              for s in read.sentences))


def word_predictions(encoded: EncodedNer, sentences: Sequence[data.Sentence],
                     logits: np.ndarray, labels: Sequence[str]) -> list[list[str]]:
    """Predicted tags of every word of `sentences` from per-unit word logits (N, W, C).

    Every word lies in exactly one unit's window, so each gets exactly one prediction."""
    predicted: list[list[str | None]] = [[None] * len(s.words) for s in sentences]
    for u in range(len(encoded)):
        n = len(encoded.word_labels[u])
        ids = logits[u, :n].argmax(-1)
        s, first = int(encoded.sentence[u]), int(encoded.first_word[u])
        predicted[s][first:first + n] = [labels[i] for i in ids]
    missing = sum(t is None for tags in predicted for t in tags)
    if missing:
        raise AssertionError(f"{missing} words have no prediction")
    return predicted  # type: ignore[return-value]


def _read_split(path: str, fmt: data.NerFormat, labels: tuple[str, ...], source: str,
                skip_bad_records: bool) -> data.NerSplit:
    """One labelled file, its tags checked against `labels` (from `source`: the task table or
    a task file); an empty one is an error."""
    split = data.read_conll(path, fmt, skip_bad_records)
    data.check_labels(split, labels, source)
    if not split.sentences:
        raise data.NerFormatError(f"{split.path}: no sentences")
    return split


@dataclass(frozen=True)
class NerFamily:
    """Named-entity recognition: one label per word at its first sub-token."""

    name: str = "ner"
    """Family name."""
    document_context: bool = False
    """Widen each sentence with its document's surrounding words as unlabelled context (the
    paper's "maximal document context"; CoNLL-2003 only has documents). Default: sentence by
    sentence."""
    pack_sequences: bool = True
    """Pack a batch's sentences into shared rows (each attends only to itself) rather than one
    per padded row: the same outputs, less padding work (`--no_packing` turns it off)."""

    def recipe(self, task: str) -> Recipe:
        task_spec(task)
        return PAPER_RECIPE

    def check_files(self, task: str, data_dir: str) -> None:
        for name, path in split_paths(task, data_dir).items():
            if name != "test" and not os.path.isfile(path):
                raise FileNotFoundError(f"{task}: no {name} file {path}")

    def eval_texts(self, task: str, data_dir: str,
                   skip_bad_records: bool = False) -> list[EvalTexts]:
        """dev, and test where present: each sentence's words joined by spaces, by its
        first line."""
        paths = split_paths(task, data_dir)
        return [conll_texts(task, split, paths[split], task_spec(task).format, skip_bad_records)
                for split in ("dev", "test") if split == "dev" or os.path.isfile(paths[split])]

    def prepare(self, task: str, data_dir: str, tokenizer, max_seq_length: int,
                max_train_examples: int | None, max_eval_examples: int | None,
                skip_bad_records: bool) -> Prepared:
        spec = task_spec(task)
        return self.prepare_files(task, split_paths(task, data_dir), spec.format, spec.labels,
                                  f"the {spec.name} task table (finetune/ner/tasks.py)",
                                  tokenizer, max_seq_length, max_train_examples,
                                  max_eval_examples, skip_bad_records)

    def prepare_files(self, task: str, paths: dict[str, str], fmt: data.NerFormat,
                      labels: tuple[str, ...], source: str, tokenizer, max_seq_length: int,
                      max_train_examples: int | None, max_eval_examples: int | None,
                      skip_bad_records: bool) -> Prepared:
        """`prepare` of files named in full: train, dev and (when it exists) test, read as
        `fmt`, their tags `labels` (from `source`, named in errors). A user's task
        (finetune/user) comes in here."""
        read = {name: _read_split(paths[name], fmt, labels, source, skip_bad_records)
                for name in ("train", "dev", "test")
                if name != "test" or (paths.get("test") and os.path.isfile(paths["test"]))}
        parts = {name: data.subset(split, max_train_examples if name == "train"
                                   else max_eval_examples)
                 for name, split in read.items()}
        encoded = {name: encode_sentences(tokenizer, part.sentences, labels, max_seq_length,
                                          self.document_context)
                   for name, part in parts.items()}
        for name, enc in encoded.items():
            log.info("%s %s: %d sentences -> %d units (%d split into windows), %d words as "
                     "[UNK], %d words truncated", task, name, enc.num_sentences, len(enc),
                     enc.split_sentences, enc.unknown_words, enc.truncated_words)
        evals = [name for name in parts if name != "train"]
        context = NerContext(labels, {name: parts[name].sentences for name in evals},
                             {name: encoded[name] for name in evals})
        return Prepared(task=task, train=encoded["train"],
                        dev={name: encoded[name] for name in evals},
                        num_train_examples=len(parts["train"]),
                        num_dev_examples={name: len(parts[name]) for name in evals},
                        bad_records=tuple(r for split in read.values() for r in split.bad_records),
                        context=context)

    def build_head(self, encoder: BertModel, task: str) -> BertForTokenClassification:
        return BertForTokenClassification.from_encoder(encoder, len(task_spec(task).labels))

    def make_batch(self, encoded: EncodedNer, indices: Sequence[int], max_seq_length: int,
                   train: bool, row_length: int | None = None) -> NerBatch:
        return pack_units(encoded, indices, max_seq_length, pack=self.pack_sequences,
                          row_length=row_length)

    def loss(self, model: BertForTokenClassification, batch: NerBatch) -> Tensor:
        # Only first sub-tokens are scored: gather them before the classifier (the same
        # cross-entropy as over all tokens with the rest at -100).
        hidden = model.bert(batch.input_ids, sequence_ids=batch.sequence_ids)  # (R, T, H)
        labelled = hidden.flatten(0, 1).index_select(0, batch.label_index)  # (L, H)
        logits = model.classifier(model.dropout(labelled))  # (L, C)
        return F.cross_entropy(logits.float(), batch.labels)

    def outputs(self, model: BertForTokenClassification, batch: NerBatch) -> dict[str, Tensor]:
        hidden = model.bert(batch.input_ids, sequence_ids=batch.sequence_ids)  # (R, T, H)
        words = hidden.flatten(0, 1)[batch.word_index]  # (B, W, H)
        logits = model.classifier(model.dropout(words)).float()  # (B, W, C)
        return {"logits": logits * batch.word_mask[..., None]}

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        context: NerContext = prepared.context
        sentences = context.sentences[split]
        predicted = word_predictions(context.encoded[split], sentences, outputs["logits"],
                                     context.labels)
        metrics = entity_scores([list(s.tags) for s in sentences], predicted)
        files = {f"predictions_{split}.txt": conll_predictions(sentences, predicted)}
        gold = [list(s.tags) for s in sentences]
        nothing = entity_scores(gold, [["O"] * len(tags) for tags in gold])
        constant = constant_text(tag for tags in predicted for tag in tags)
        if split == "test":  # reported beside dev, never tuned on
            names = {f"test_{name}": name for name in TEST_METRICS}
            return Scored(metrics={key: metrics[name] for key, name in names.items()},
                          score=metrics["f1"], files=files, selects=False,
                          baseline=Baseline("no entities", {k: nothing.get(n, 0.0)
                                                            for k, n in names.items()},
                                            nothing["f1"]),
                          constant=constant and f"all {constant}")
        return Scored(metrics=metrics, score=metrics["f1"], files=files,
                      baseline=Baseline("no entities", {k: nothing.get(k, 0.0) for k in metrics},
                                        nothing["f1"]),
                      constant=constant and f"all {constant}")


FAMILY = NerFamily()
