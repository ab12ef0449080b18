"""The evaluation sets the fine-tuning flow scores, each read by its own family: what the
contamination audit (pipelines/audit_contamination.py) looks for in the pre-training corpus.

Every family gives the texts of a task's splits (`Family.eval_texts`), so a new family's
evaluation sets reach the audit with no edit here. Per family, the splits and the text fields
of one example:

| family          | splits                                  | example id  | text fields |
|-----------------|-----------------------------------------|-------------|-------------|
| glue            | every dev file, every test file present | guid (row)  | the one or two sentences |
| squad           | dev                                     | question id | context, question |
| multiple_choice | dev, test where present                 | id (row)    | sequence A (SWAG: sent1; Cosmos QA: context + question), each choice (SWAG: sent2 + ending) |
| ner             | dev, test where present                 | first line  | the sentence's words joined by spaces |
| user: sequence_classification, regression | dev, test where given | id column, or row | text_a, text_b |
| user: token_classification | dev, test where given        | first line  | the sentence's words joined by spaces |
| user: extractive_qa | dev                                 | question id | context, question |
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from finetune.family import EvalTexts
from finetune.tasks import TaskEntry


def read_eval_texts(data: str, entries: Sequence[TaskEntry],
                    skip_bad_records: bool = False) -> list[EvalTexts]:
    """The evaluation texts of every task of `entries`, their data under `data` (the flow's
    `finetune.data`; a task file's tasks name their own files)."""
    texts: list[EvalTexts] = []
    for entry in entries:
        folder = os.path.join(data, entry.data_folder)
        if not os.path.isdir(folder):
            raise FileNotFoundError(f"--eval_data {data}: no {entry.data_folder}/ folder "
                                    f"(for {entry.task})")
        texts += entry.family.eval_texts(entry.task, folder, skip_bad_records)
    return texts
