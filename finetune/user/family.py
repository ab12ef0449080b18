"""The family of a task file's tasks: each task served by the built-in family of its type.

sequence_classification and regression: the GLUE family (a GLUE `TaskSpec` made from the
entry; packing, the pooled-[CLS] head, cross-entropy or MSE, GLUE's metric functions, test
predictions as `<name>.tsv`). token_classification: the NER family (first sub-token labels,
entity F1 as conlleval decodes IOB1, IOB2 and BIOES tags; the tag set ordered as the NER
family orders a data set's: `O` first, then by type and prefix). extractive_qa: the SQuAD
family (windows, official EM/F1; `version_2` scores unanswerable questions as v2.0).
Only reading differs: the entry names the files and their columns.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from torch import Tensor, nn

from finetune.family import Encoded, EvalTexts, Family, Prepared, Recipe, Scored
from finetune.glue import tasks as glue_tasks
from finetune.glue.family import GlueFamily, prepare_task
from finetune.ner.data import NerFormat, label_list
from finetune.ner.family import PAPER_RECIPE, NerFamily, conll_texts
from finetune.squad.data import read_squad
from finetune.squad.family import RECIPES as SQUAD_RECIPES
from finetune.squad.family import SquadFamily
from finetune.user import readers
from finetune.user.spec import SCHEMES, UserTask
from model.bert import BertModel
from model.encoders import tells_pairs_apart
from model.heads import (
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

CLASSIFICATION = ("sequence_classification", "regression")

_BY_NAME = glue_tasks.TsvColumns(num_columns=1, text_a=0)
"""A user file's columns are found by name (`readers`); GLUE's index layout goes unused."""


def glue_spec(task: UserTask) -> glue_tasks.TaskSpec:
    """The GLUE form of a classification or regression task: its labels, metrics and files."""
    pair = task.column("text_b") is not None
    metrics = tuple(glue_tasks.F1 if m == "f1" else m for m in task.metrics)
    test = () if task.test is None else (glue_tasks.SplitSpec(
        "test", task.test, _BY_NAME, "test", submission_file=f"{task.name}.tsv"),)
    return glue_tasks.TaskSpec(
        name=task.name, hf_config=task.name, hf_text_fields=("text_a", "text_b")[:1 + pair],
        labels=task.labels, metrics=metrics,
        train=glue_tasks.SplitSpec("train", task.train, _BY_NAME, "train"),
        dev=(glue_tasks.SplitSpec("dev", task.dev, _BY_NAME, "dev"),), test=test, small=True)


SMALL_TASK_ROWS = 1000
"""Training rows below which a classification or regression task gets `small_task_recipe`."""
SMALL_TASK_STEPS = 300
"""Optimizer steps a small task trains for at least (`SMALL_TASK_MAX_EPOCHS` allowing)."""
SMALL_TASK_MAX_EPOCHS = 20.0
SMALL_TASK_RATES = (1e-4, 5e-5, 3e-5)
"""A small task's grid: 1e-4 for the small checkpoints a newcomer tries (the demo's), which
learn nothing in a few dozen steps at the paper's 2e-5..5e-5."""


def small_task_recipe(base: Recipe, rows: int) -> Recipe:
    """`base` for a task of `rows` training rows: unchanged from SMALL_TASK_ROWS rows up;
    below, epochs raised so that training takes SMALL_TASK_STEPS optimizer steps (at most
    SMALL_TASK_MAX_EPOCHS epochs, at least the base's) and the grid `SMALL_TASK_RATES`.

    The paper's 3 epochs at batch 32 are 21 steps on 200 rows, with 2 of them warmup: every run
    of such a task predicts the majority class. Few-sample fine-tuning learns when it runs for
    more steps (Mosbach et al. 2021, "On the stability of fine-tuning BERT", section 6: 20
    epochs on RTE, MRPC, CoLA; Zhang et al. 2021, "Revisiting few-sample BERT fine-tuning").
    A 200-row task: 7 steps per epoch, 20 epochs, 140 steps."""
    if rows >= SMALL_TASK_ROWS:
        return base
    steps_per_epoch = max(1, math.ceil(rows / base.batch_size))
    epochs = min(SMALL_TASK_MAX_EPOCHS, math.ceil(SMALL_TASK_STEPS / steps_per_epoch))
    return dataclasses.replace(base, epochs=max(base.epochs, float(epochs)),
                               learning_rates=SMALL_TASK_RATES)


def ner_labels(task: UserTask) -> tuple[str, ...]:
    """The tag set in the NER family's order (`data.label_list`): the same output rows for
    the same tags however the file lists them."""
    from finetune.ner.data import NerSplit, Sentence

    return label_list(NerSplit(task.source, [Sentence(task.labels, task.labels, 0, 1)], 0))


@dataclass(frozen=True)
class UserFamily:
    """The tasks of one task file (`finetune.user.spec`); satisfies `finetune.family.Family`
    with `TestSets` and `ModelChecks` (finetune/capabilities.py), by delegation."""

    name: ClassVar[str] = "user"
    tasks: tuple[UserTask, ...] = ()
    """The task file's tasks, as read (part of every run's key: a changed entry is new runs)."""
    pack_sequences: bool = True
    """Pack each batch's units into shared rows (every type; `--no_packing` turns it off)."""
    predict_test: bool = True
    """Predict a classification task's unlabelled test file, where given."""

    def task(self, name: str) -> UserTask:
        for task in self.tasks:
            if task.name == name:
                return task
        raise ValueError(f"unknown user task {name!r}; the task file defines: "
                         f"{', '.join(t.name for t in self.tasks) or 'none'}")

    def delegate(self, name: str) -> Family:
        """The built-in family serving the task's type, with this family's options."""
        kind = self.task(name).type
        if kind in CLASSIFICATION:
            return GlueFamily(self.pack_sequences, self.predict_test)
        if kind == "token_classification":
            return NerFamily(pack_sequences=self.pack_sequences)
        return SquadFamily(pack_sequences=self.pack_sequences)

    def recipe(self, task: str) -> Recipe:
        """The family's recipe of the task's type, the entry's `recipe` over it; a small
        classification or regression task (`small_task_recipe`) trains longer, and at higher
        rates besides the paper's."""
        spec = self.task(task)
        base = {"token_classification": PAPER_RECIPE,
                "extractive_qa": SQUAD_RECIPES["squad2" if spec.version_2 else "squad1"]
                }.get(spec.type, Recipe())
        if spec.type in CLASSIFICATION:
            base = small_task_recipe(base, readers.count_rows(spec.train, spec.format,
                                                              SMALL_TASK_ROWS))
        return dataclasses.replace(base, **dict(spec.recipe))

    def check_files(self, task: str, data_dir: str) -> None:
        """FileNotFoundError naming a missing file, GlueFormatError a header without a
        named column; `data_dir` is unused (the entry names its files)."""
        spec = self.task(task)
        for split in ("train", "dev", "test"):
            path = getattr(spec, split)
            if path is not None and not os.path.isfile(path):
                raise FileNotFoundError(f"{spec.name}: no {split} file {path} ({spec.source})")
        if spec.type in CLASSIFICATION:
            readers.check_header(spec, spec.train, labelled=True)
            readers.check_header(spec, spec.dev, labelled=True)
            if spec.test is not None and self.predict_test:
                readers.check_header(spec, spec.test, labelled=False)

    def check_model(self, encoder: BertModel, task: str, model_dir: str) -> None:
        if self.task(task).type in CLASSIFICATION:
            spec = glue_spec(self.task(task))
            if spec.is_pair and not tells_pairs_apart(encoder.config):
                raise ValueError(f"{spec.name}: sentence pairs need 2 token types but the model "
                                 f"{model_dir} has type_vocab_size "
                                 f"{encoder.config.type_vocab_size}")

    def eval_texts(self, task: str, data_dir: str,
                   skip_bad_records: bool = False) -> list[EvalTexts]:
        """dev, and test where the entry gives one (extractive_qa: dev); `data_dir` is unused
        (the entry names its files). A classification file's labels are not read."""
        spec = self.task(task)
        files = {"dev": spec.dev, **({"test": spec.test} if spec.test is not None else {})}
        if spec.type == "extractive_qa":
            dev = read_squad(spec.dev, training=False, version_2=spec.version_2)
            return [EvalTexts.of(task, "dev", [spec.dev], (
                (e.qid, (e.context, e.question)) for e in dev.examples))]
        if spec.type == "token_classification":
            fmt = NerFormat(spec.num_columns, spec.delimiter, SCHEMES[spec.scheme])
            return [conll_texts(task, split, path, fmt, skip_bad_records)
                    for split, path in files.items()]
        table = glue_spec(spec)
        return [EvalTexts.of(task, split, [path], (
            (e.guid, (e.text_a, e.text_b or "")) for e in readers.read_split(
                spec, table, split, path, labelled=False, skip_bad_rows=skip_bad_records
            ).examples)) for split, path in files.items()]

    def prepare(self, task: str, data_dir: str, tokenizer, max_seq_length: int,
                max_train_examples: int | None, max_eval_examples: int | None,
                skip_bad_records: bool) -> Prepared:
        spec = self.task(task)
        limits = (tokenizer, max_seq_length, max_train_examples, max_eval_examples)
        if spec.type in CLASSIFICATION:
            return self._prepare_classification(spec, *limits, skip_bad_records)
        if spec.type == "token_classification":
            fmt = NerFormat(spec.num_columns, spec.delimiter, SCHEMES[spec.scheme])
            paths = {"train": spec.train, "dev": spec.dev, "test": spec.test}
            return NerFamily(pack_sequences=self.pack_sequences).prepare_files(
                spec.name, paths, fmt, ner_labels(spec), f"{spec.source} labels", *limits,
                skip_bad_records)
        return self._prepare_qa(spec, *limits)

    def _prepare_classification(self, spec: UserTask, tokenizer, max_seq_length: int,
                                max_train_examples: int | None, max_eval_examples: int | None,
                                skip_bad_records: bool) -> Prepared:
        glue = glue_spec(spec)

        def read(split: glue_tasks.SplitSpec):
            return readers.read_split(spec, glue, split.name, split.path,
                                      labelled=split.name != "test",
                                      skip_bad_rows=skip_bad_records)

        return prepare_task(glue, "", tokenizer, max_seq_length, max_train_examples,
                            max_eval_examples, skip_bad_records, self.predict_test, read=read)

    def _prepare_qa(self, spec: UserTask, tokenizer, max_seq_length: int,
                    max_train_examples: int | None, max_eval_examples: int | None) -> Prepared:
        from finetune.squad import data as squad_data

        train = squad_data.read_squad(spec.train, training=True, version_2=spec.version_2)
        dev = squad_data.read_squad(spec.dev, training=False, version_2=spec.version_2)
        prepared = SquadFamily(pack_sequences=self.pack_sequences).prepare_splits(
            spec.name, train, dev, tokenizer, max_seq_length, max_train_examples,
            max_eval_examples)
        # prepare_splits takes v2.0 scoring from the built-in task's name; the entry says it
        context = dataclasses.replace(prepared.context, version_2=spec.version_2)
        return dataclasses.replace(prepared, context=context)

    def build_head(self, encoder: BertModel, task: str) -> nn.Module:
        spec = self.task(task)
        if spec.type in CLASSIFICATION:
            return BertForSequenceClassification.from_encoder(encoder, glue_spec(spec).num_labels)
        if spec.type == "token_classification":
            return BertForTokenClassification.from_encoder(encoder, len(spec.labels))
        return BertForQuestionAnswering.from_encoder(encoder)

    def make_batch(self, encoded: Encoded, indices: Sequence[int], max_seq_length: int,
                   train: bool, row_length: int | None = None) -> Any:
        return self._by_units(encoded).make_batch(encoded, indices, max_seq_length, train,
                                                  row_length)

    def loss(self, model: nn.Module, batch: Any) -> Tensor:
        return self._by_batch(batch).loss(model, batch)

    def outputs(self, model: nn.Module, batch: Any) -> dict[str, Tensor]:
        return self._by_batch(batch).outputs(model, batch)

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        return self.delegate(prepared.task).score(prepared, split, outputs)

    def test_splits(self, prepared: Prepared) -> Mapping[str, Encoded]:
        if self.task(prepared.task).type in CLASSIFICATION:
            return prepared.context.test
        return {}

    def test_predictions(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]):
        return GlueFamily().test_predictions(prepared, split, outputs)

    # make_batch, loss and outputs are not told the task: the class of the units or of the
    # batch says which family made them.
    def _by_units(self, encoded: Encoded) -> Family:
        from finetune.glue.data import EncodedSplit
        from finetune.ner.encode import EncodedNer

        return self._family_of(encoded, EncodedSplit, EncodedNer)

    def _by_batch(self, batch: Any) -> Family:
        from finetune.glue.family import PackedBatch
        from finetune.ner.encode import NerBatch

        return self._family_of(batch, PackedBatch, NerBatch)

    def _family_of(self, value: Any, glue_class: type, ner_class: type) -> Family:
        """GLUE's family for a `glue_class`, NER's for a `ner_class`, else SQuAD's."""
        if isinstance(value, glue_class):
            return GlueFamily(self.pack_sequences, self.predict_test)
        if isinstance(value, ner_class):
            return NerFamily(pack_sequences=self.pack_sequences)
        return SquadFamily(pack_sequences=self.pack_sequences)
