"""The NER tasks as data: folder, files and column format of each.

Files are those the data sets are distributed as (SOURCES.md of the shared data): CoNLL-2003 as
`conll2003/{train,valid,test}.txt` (IOB2, the layout of most public copies), WNUT-17 under the
names its organisers' repository uses.
"""
from __future__ import annotations

from dataclasses import dataclass

from finetune.ner.data import NerFormat


@dataclass(frozen=True)
class NerTask:
    """One NER data set: where its splits are and how its lines are laid out."""

    name: str
    """Task name on the command line ("conll2003", "wnut17")."""
    folder: str
    """Folder under the data folder `D` holding the files."""
    train: str
    """Training file name."""
    dev: str
    """Development file name (the learning rate is chosen on it)."""
    test: str
    """Test file name: scored beside dev when the file is present (`test_f1` in the report
    row and results.json; `max_eval_examples` slices it as it slices dev), never used to pick
    the learning rate."""
    format: NerFormat
    """Columns and delimiter of the files."""
    entity_types: tuple[str, ...]
    """The data set's entity types; its labels are `O` and `B-`/`I-` of each (`labels`). Fixed
    per task, so a model's output layer is known before any file is read; the training file's
    tags must be among them (`finetune.ner.data.check_labels`)."""

    @property
    def labels(self) -> tuple[str, ...]:
        """`O`, then `B-`/`I-` of each type in name order (`data.label_list`'s order)."""
        return ("O", *(f"{p}-{t}" for t in sorted(self.entity_types) for p in "BI"))


NER_TASKS = {
    "conll2003": NerTask("conll2003", "conll2003", "train.txt", "valid.txt", "test.txt",
                         NerFormat(num_columns=4, delimiter=" "), ("PER", "LOC", "ORG", "MISC")),
    "wnut17": NerTask("wnut17", "wnut17", "wnut17train.conll", "emerging.dev.conll",
                      "emerging.test.annotated", NerFormat(num_columns=2, delimiter="\t"),
                      ("person", "location", "group", "corporation", "product", "creative-work")),
}
