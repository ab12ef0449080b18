"""SQuAD v1.1 and v2.0 as a task family of the one fine-tuning loop (`finetune.family`).

Units are windows (one question x one passage span, `features.Windows`); a recipe's batch size
counts windows, as BERT's `train_batch_size` does. A batch's windows are packed into shared
max_seq_length rows (`features.pack_windows`); each window's start/end softmax runs over its own
tokens, so logits and loss are those of one window per padded row. Subsets (`max_train_examples`,
`max_eval_examples`) are drawn by question before windows are cut, so a question's windows
stay together. Training answers that are not where their `answer_start` says are set aside
(dead letter) whatever `skip_bad_records` says, as BERT's reader skips them: a few such
answers are expected in real SQuAD files. Scoring writes the official `predictions.json`
(and for v2.0 `null_odds.json` and `squad2_threshold.json`, the tau chosen on this split).
A dev set sliced by `max_eval_examples` gives a partial `predictions.json`: a warning says so
and `PARTIAL.txt` beside it ("partial (N of M questions): not for submission"); the file
itself stays the official scorer's input, a mapping of question id to answer.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from finetune.baselines import Baseline, constant_text
from finetune.family import PARTIAL_FILE, EvalTexts, Prepared, Recipe, Scored
from finetune.squad import data as squad_data
from finetune.squad import metrics, postprocess
from finetune.squad.features import (
    PackedSpanBatch,
    SpanBatch,
    WindowConfig,
    Windows,
    collate_windows,
    cut_windows,
    pack_windows,
)
from model.bert import BertModel
from model.heads import BertForQuestionAnswering, span_loss

log = logging.getLogger(__name__)

TASKS = ("squad1", "squad2")
# Paper appendix A.3 / section 4.3: v1.1 3 epochs, batch 32; v2.0 2 epochs, batch 48; 5e-5.
RECIPES = {
    "squad1": Recipe(max_seq_length=384, batch_size=32, epochs=3.0, learning_rates=(5e-5,)),
    "squad2": Recipe(max_seq_length=384, batch_size=48, epochs=2.0, learning_rates=(5e-5,)),
}
THRESHOLD_FILE = "squad2_threshold.json"


@dataclass(frozen=True)
class SquadContext:
    """What scoring needs besides the logits: the questions of each evaluation split."""

    version_2: bool
    examples: dict[str, list[squad_data.SquadExample]]
    """Evaluation split -> its questions in unit order (`Windows.example_index` indexes it)."""
    postprocess: postprocess.PostprocessConfig
    totals: dict[str, int] = dataclasses.field(default_factory=dict)
    """Evaluation split -> its questions in the file, before `max_eval_examples` slices it."""


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown SQuAD task {task!r}; expected one of {list(TASKS)}")


@dataclass(frozen=True)
class SquadFamily:
    """Span prediction over windows; `name` "squad"."""

    name: ClassVar[str] = "squad"
    doc_stride: int = 128
    """Passage tokens between the starts of consecutive windows."""
    max_query_length: int = 64
    """Question tokens kept."""
    post: postprocess.PostprocessConfig = postprocess.DEFAULT
    """How spans are chosen (n-best, longest answer)."""
    pack_sequences: bool = True
    """Pack a batch's windows into shared max_seq_length rows (each window attends to and is
    scored over its own tokens only) rather than one per padded row: the same logits and loss,
    less padding work (`--no_packing` turns it off)."""

    def recipe(self, task: str) -> Recipe:
        _check_task(task)
        return RECIPES[task]

    def check_files(self, task: str, data_dir: str) -> None:
        _check_task(task)
        squad_data.check_files(data_dir, task)

    def eval_texts(self, task: str, data_dir: str,
                   skip_bad_records: bool = False) -> list[EvalTexts]:
        """The dev file (the test set is hidden): each question's context and question, by
        its id."""
        _check_task(task)
        dev = squad_data.read_squad(squad_data.split_path(data_dir, task, "dev"),
                                    training=False, version_2=task == "squad2")
        return [EvalTexts.of(task, "dev", [dev.path],
                             ((e.qid, (e.context, e.question)) for e in dev.examples))]

    def prepare(self, task: str, data_dir: str, tokenizer, max_seq_length: int,
                max_train_examples: int | None, max_eval_examples: int | None,
                skip_bad_records: bool) -> Prepared:
        """Read both files, draw the subsets by question, cut windows."""
        self.check_files(task, data_dir)
        version_2 = task == "squad2"
        train = squad_data.read_squad(squad_data.split_path(data_dir, task, "train"),
                                      training=True, version_2=version_2)
        dev = squad_data.read_squad(squad_data.split_path(data_dir, task, "dev"),
                                    training=False, version_2=version_2)
        return self.prepare_splits(task, train, dev, tokenizer, max_seq_length,
                                   max_train_examples, max_eval_examples)

    def prepare_splits(self, task: str, train: squad_data.SquadSplit,
                       dev: squad_data.SquadSplit, tokenizer, max_seq_length: int,
                       max_train_examples: int | None = None,
                       max_eval_examples: int | None = None) -> Prepared:
        """`prepare` on splits already read (a split by article of one file, in tests)."""
        train = squad_data.subset(train, max_train_examples)
        total = len(dev.examples)
        dev = squad_data.subset(dev, max_eval_examples)
        for split, name in ((train, "training"), (dev, "evaluation")):
            if not split.examples:
                raise squad_data.SquadFormatError(
                    f"{split.path}: no {name} questions ({len(split.bad_records)} set aside)")
        cfg = WindowConfig(max_seq_length, self.doc_stride, self.max_query_length)
        train_windows, uncovered = cut_windows(train.examples, tokenizer, cfg, training=True,
                                               path=train.path)
        dev_windows, _ = cut_windows(dev.examples, tokenizer, cfg, training=False)
        bad = (*train.bad_records, *uncovered)
        if bad:
            log.warning("%s: set aside %d training answers not found where the file says "
                        "(written to the dead-letter file)", task, len(bad))
        context = SquadContext(task == "squad2", {"dev": dev.examples}, self.post,
                               {"dev": total})
        return Prepared(task, train_windows, {"dev": dev_windows},
                        num_train_examples=len(train.examples) - len(uncovered),
                        num_dev_examples={"dev": len(dev.examples)}, bad_records=bad,
                        context=context)

    def build_head(self, encoder: BertModel, task: str) -> nn.Module:
        return BertForQuestionAnswering.from_encoder(encoder)

    def make_batch(self, encoded: Windows, indices: Sequence[int], max_seq_length: int,
                   train: bool, row_length: int | None = None) -> SpanBatch | PackedSpanBatch:
        if self.pack_sequences:
            return pack_windows(encoded, indices, max_seq_length, row_length)
        return collate_windows(encoded, indices, max_seq_length)

    def _logits(self, model: nn.Module, batch: PackedSpanBatch) -> tuple[Tensor, Tensor]:
        """(B, W) start and end logits of packed windows, each over its own tokens."""
        hidden = model.bert(batch.input_ids, batch.token_type_ids,
                            sequence_ids=batch.sequence_ids)  # (R, T, H)
        flat = hidden.flatten(0, 1)[batch.token_index]  # (B, W, H)
        start, end = model.qa_outputs(flat).unbind(dim=-1)  # 2 x (B, W)
        return start, end

    def loss(self, model: nn.Module, batch: SpanBatch | PackedSpanBatch) -> Tensor:
        if isinstance(batch, PackedSpanBatch):
            start, end = self._logits(model, batch)
            return span_loss(start, end, batch.start_positions, batch.end_positions,
                             batch.token_mask)
        return model(batch.input_ids, batch.token_type_ids, batch.attention_mask,
                     batch.start_positions, batch.end_positions).loss

    def outputs(self, model: nn.Module, batch: SpanBatch | PackedSpanBatch
                ) -> dict[str, Tensor]:
        """(B, seq_length) float32 start and end logits, padding set to the lowest float."""
        lowest = torch.finfo(torch.float32).min
        if isinstance(batch, PackedSpanBatch):
            start, end = self._logits(model, batch)
            return {name: logits.float().masked_fill(~batch.token_mask, lowest)
                    for name, logits in (("start_logits", start), ("end_logits", end))}
        out = model(batch.input_ids, batch.token_type_ids, batch.attention_mask)
        pad = batch.seq_length - out.start_logits.shape[1]
        return {name: nn.functional.pad(logits.float(), (0, pad), value=lowest)
                for name, logits in (("start_logits", out.start_logits),
                                     ("end_logits", out.end_logits))}

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        context: SquadContext = prepared.context
        scored = score_split(context.examples[split], prepared.dev[split],
                             outputs["start_logits"], outputs["end_logits"], context.version_2,
                             context.postprocess)
        note = partial_note(len(context.examples[split]), context.totals.get(split, 0))
        if not note:
            return scored
        log.warning("%s %s predictions.json: %s", prepared.task, split, note)
        return dataclasses.replace(scored, files={**scored.files, PARTIAL_FILE: note + "\n"})


def partial_note(scored: int, total: int) -> str:
    """"partial (N of M questions): not for submission" where `scored` < `total`, else ""."""
    if scored >= total:
        return ""
    return f"partial ({scored} of {total} questions): not for submission"


def score_split(examples: Sequence[squad_data.SquadExample], windows: Windows,
                start_logits: np.ndarray, end_logits: np.ndarray, version_2: bool,
                post: postprocess.PostprocessConfig = postprocess.DEFAULT) -> Scored:
    """Answers, the official metrics and the prediction files of one evaluation split.

    v2.0: tau is the null-odds threshold that maximises F1 on this split (the scorer's
    best_f1_thresh over the span predictions); answers and metrics are then at tau."""
    spans = postprocess.predict_spans(examples, windows, start_logits, end_logits, post)
    if not version_2:
        answers = postprocess.answers(examples, spans)
        result = metrics.squad_v1_metrics(examples, answers)
        return Scored(result, result["f1"], {"predictions.json": _json(answers)},
                      baseline=no_answer_baseline(examples, version_2),
                      constant=constant_answer(answers))
    odds = postprocess.null_odds(examples, spans)
    search = metrics.squad_v2_metrics(examples, postprocess.answers(examples, spans), odds)
    tau = search["best_f1_thresh"]
    answers = postprocess.answers(examples, spans, tau)
    result = metrics.squad_v2_metrics(examples, answers)
    if result["f1"] < search["best_f1"] - 1e-12:
        # Answering none is best: the scorer then reports threshold 0.0, which still answers
        # every question with negative odds; tau goes below all odds instead.
        tau = min(odds.values()) - 1.0
        answers = postprocess.answers(examples, spans, tau)
        result = metrics.squad_v2_metrics(examples, answers)
    fractions = {k: v for k, v in result.items() if not k.endswith("total")}
    threshold = {"null_score_diff_threshold": tau, "best_f1": search["best_f1"],
                 "best_exact": search["best_exact"],
                 "best_exact_thresh": search["best_exact_thresh"]}
    files = {"predictions.json": _json(answers), "null_odds.json": _json(odds),
             THRESHOLD_FILE: _json(threshold)}
    return Scored(fractions, result["f1"], files,
                  baseline=no_answer_baseline(examples, version_2),
                  constant=constant_answer(answers))


def no_answer_baseline(examples: Sequence[squad_data.SquadExample], version_2: bool) -> Baseline:
    """No answer to any question, scored officially: 0 on v1.1; on v2.0 EM = F1 = the share
    of unanswerable questions."""
    empty = {e.qid: "" for e in examples}
    if not version_2:
        result = metrics.squad_v1_metrics(examples, empty)
    else:
        result = {k: v for k, v in metrics.squad_v2_metrics(examples, empty).items()
                  if not k.endswith("total")}
    return Baseline("no answer", result, result["f1"])


def constant_answer(answers: dict[str, str]) -> str:
    """"no answer" or "the answer '<text>'" when every question got the same, else ""."""
    return constant_text(answers.values(),
                         lambda a: f"the answer {a!r} everywhere" if a else "no answer")


def _json(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


FAMILY = SquadFamily()
