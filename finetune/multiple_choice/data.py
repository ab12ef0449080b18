"""Multiple-choice readers (SWAG's and Cosmos QA's official CSV files) and their encoding.

Data folder (`--data D`), the official file names:

| task     | files | columns |
|----------|-------|---------|
| swag     | `D/swag/train.csv`, `D/swag/val.csv`, optional `D/swag/test.csv` (no labels) | `,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0..3,label` |
| cosmosqa | `D/cosmosqa/train.csv`, `D/cosmosqa/valid.csv`, optional `D/cosmosqa/test.jsonl` (no labels) | `id,context,question,answer0..3,label`; test.jsonl: one JSON object per line with those keys but `label` |

(The authors' repositories `rowanz/swagaf` `data/` and `wilburOne/cosmosqa` `data/`.) The
test file, where present, is predicted for the task's leaderboard: SWAG's `swag.csv`
(`,pred` by row index), Cosmos QA's `cosmosqa.lst` (one label per line, in the file's order).

Columns are found by their header names, so a file may hold others or another order. SWAG's
first column has no name: it is the row index, used as the example id (as the Hugging Face
loader numbers the rows); Cosmos QA has an `id` column. A split without labels (SWAG's test
file) reads with label None.

Each example becomes four sequences `[CLS] A [SEP] B_i [SEP]`, one per choice, truncated
longest-first to max_seq_length:
- SWAG (the paper, section 4.4; transformers' `run_swag`): A = `sent1`, B_i = `sent2` + " " +
  `ending_i` (`sent2` is the start of the next sentence, each ending completes it).
- Cosmos QA: A = `context` + " " + `question`, B_i = `answer_i` (passage and question are what
  every answer is read against; the answer alone is what differs).

Bad input: a file that is not UTF-8, a CSV quoting error, a header without the task's columns,
a row with another number of fields, a JSON line that is not an object or lacks a key, a label
outside 0..3 or a repeated id raise `MultipleChoiceFormatError` naming the file and line (and
the id where there is one); with `skip_bad_records` the rows are set aside as `BadRecord`s
instead (counted, never lost), and only file-level problems (encoding, CSV quoting, header)
still raise.
"""
from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from common import storage
from common.errors import BadRecord
from finetune.family import ExampleSplit

MAX_SEQ_LENGTH = 128  # the paper's SWAG recipe


class MultipleChoiceFormatError(ValueError):
    """A multiple-choice file that does not have its task's layout."""


@dataclass(frozen=True)
class ChoiceTaskSpec:
    """Where a multiple-choice task's files are and which columns make its two sequences."""

    name: str
    """Task name on the command line."""
    folder: str
    """Folder of the task's files under the data folder."""
    train_file: str
    """Training file (official name)."""
    dev_file: str
    """Labelled evaluation file (official name)."""
    id_column: str | None
    """Column holding the example id; None = the row index from 0."""
    first_columns: tuple[str, ...]
    """Columns joined with a space into sequence A."""
    prefix_columns: tuple[str, ...]
    """Columns put, with a space, before every choice in sequence B."""
    choice_columns: tuple[str, ...]
    """One column per choice."""
    label_column: str = "label"
    """The gold choice's index, 0-based."""
    test_file: str | None = None
    """Unlabelled test file (official name) predicted for the leaderboard; None: none read."""
    submission_file: str | None = None
    """The leaderboard file of the test predictions (`<output>/submission/<file>`)."""

    def __post_init__(self) -> None:
        if len(self.choice_columns) < 2:
            raise ValueError(f"{self.name}: a multiple-choice task needs >= 2 choice columns")

    @property
    def num_choices(self) -> int:
        return len(self.choice_columns)

    @property
    def text_columns(self) -> tuple[str, ...]:
        return self.first_columns + self.prefix_columns + self.choice_columns

    def path(self, task_dir: str, split: str) -> str:
        """The file of `split` ("train", "dev" or "test") in the task's folder `task_dir`
        (D/swag)."""
        name = {"train": self.train_file, "dev": self.dev_file, "test": self.test_file}[split]
        if name is None:
            raise ValueError(f"{self.name} has no {split} file")
        return os.path.join(task_dir, name)


SPECS: dict[str, ChoiceTaskSpec] = {
    "swag": ChoiceTaskSpec(
        name="swag", folder="swag", train_file="train.csv", dev_file="val.csv", id_column="",
        first_columns=("sent1",), prefix_columns=("sent2",),
        choice_columns=("ending0", "ending1", "ending2", "ending3"),
        test_file="test.csv", submission_file="swag.csv"),
    "cosmosqa": ChoiceTaskSpec(
        name="cosmosqa", folder="cosmosqa", train_file="train.csv", dev_file="valid.csv",
        id_column="id", first_columns=("context", "question"), prefix_columns=(),
        choice_columns=("answer0", "answer1", "answer2", "answer3"),
        test_file="test.jsonl", submission_file="cosmosqa.lst"),
}


@dataclass(frozen=True)
class ChoiceExample:
    """One question: its id, sequence A, the B sequence of each choice, the gold choice."""

    example_id: str
    first: str
    """Sequence A (shared by every choice)."""
    choices: tuple[str, ...]
    """Sequence B of each choice (SWAG: `sent2` + " " + ending)."""
    label: int | None
    """Index of the right choice; None in an unlabelled (test) file."""
    line: int
    """Line of the file where the record starts (from 1)."""


@dataclass(frozen=True)
class ChoiceSplit(ExampleSplit[ChoiceExample]):
    """The examples of one file and the rows set aside from it."""

    task: str
    path: str


# ---------------------------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------------------------

def csv_records(path: str, text: str | None = None) -> Iterator[tuple[int, list[str]]]:
    """(line where the record starts, fields) of a CSV file; a quoting error names the line."""
    text = storage.read_utf8(path, MultipleChoiceFormatError) if text is None else text
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            raise MultipleChoiceFormatError(f"{path}:{start}: {e}") from None
        if fields:  # a blank line is no record
            yield start, fields


def _header_index(path: str, spec: ChoiceTaskSpec, header: list[str],
                  labelled: bool) -> dict[str, int]:
    """Column name -> field index; missing columns are an error naming the file."""
    index = {name: i for i, name in reversed(list(enumerate(header)))}  # first of a repeat
    wanted = list(spec.text_columns) + ([spec.label_column] if labelled else [])
    if spec.id_column is not None and spec.id_column in index:
        wanted.append(spec.id_column)
    missing = [c for c in wanted if c not in index]
    if missing:
        raise MultipleChoiceFormatError(
            f"{path}:1: header lacks the {spec.name} columns {missing} (header: {header})")
    return index


def parse_label(raw: str, num_choices: int) -> int:
    """The choice index written in a label field ("2", also "2.0"); else ValueError."""
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"label {raw!r} is not a choice index 0..{num_choices - 1}") from None
    if not value.is_integer() or not 0 <= value < num_choices:
        raise ValueError(f"label {raw!r} is not a choice index 0..{num_choices - 1}")
    return int(value)


def _example(spec: ChoiceTaskSpec, index: dict[str, int], fields: list[str], width: int,
             line: int, row: int, labelled: bool) -> ChoiceExample:
    if len(fields) != width:
        raise ValueError(f"expected {width} comma-separated fields, found {len(fields)}")
    example_id = (fields[index[spec.id_column]] if spec.id_column in index
                  else str(row))
    label = None
    if spec.label_column in index and fields[index[spec.label_column]].strip():
        label = parse_label(fields[index[spec.label_column]], spec.num_choices)
    elif labelled:
        raise ValueError("label is empty")
    first = " ".join(fields[index[c]] for c in spec.first_columns)
    prefix = [fields[index[c]] for c in spec.prefix_columns]
    choices = tuple(" ".join(prefix + [fields[index[c]]]) for c in spec.choice_columns)
    return ChoiceExample(example_id, first, choices, label, line)


def read_choice_csv(path: str, spec: ChoiceTaskSpec, labelled: bool = True,
                    skip_bad_records: bool = False) -> ChoiceSplit:
    """The examples of one CSV file of `spec`'s task, in file order.

    `labelled=False` (a test file) reads the label when the column is there, else None.
    """
    records = csv_records(path)
    first = next(records, None)
    if first is None:
        raise MultipleChoiceFormatError(f"{path}: empty file, expected a header row")
    header = first[1]
    index = _header_index(path, spec, header, labelled)
    return _read_records(path, spec, index, len(header),
                         ((line, fields, None) for line, fields in records), labelled,
                         skip_bad_records)


Record = tuple[int, list[str], str | None]
"""(line where it starts, its fields, why it is no record of the task or None)."""


def jsonl_records(path: str, spec: ChoiceTaskSpec) -> tuple[dict[str, int], Iterator[Record]]:
    """(column index, records) of a JSON-lines file (Cosmos QA's test.jsonl): each non-blank
    line's object as the fields of the task's columns (a missing key as "")."""
    columns = ([spec.id_column] if spec.id_column else []) + [*spec.text_columns,
                                                              spec.label_column]
    # Lines end at \n only: str.splitlines would also split at U+2028 and U+2029, which JSON
    # strings may hold unescaped (web text does).
    text = storage.read_utf8(path, MultipleChoiceFormatError)
    lines = [line.removesuffix("\r") for line in text.split("\n")]

    def records() -> Iterator[Record]:
        for number, text in enumerate(lines, 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                yield number, [], f"not JSON ({e.msg}, column {e.colno})"
                continue
            if not isinstance(record, dict):
                yield number, [], f"a JSON {type(record).__name__}, expected an object"
                continue
            fields = [str(record.get(c, "")) for c in columns]
            missing = [c for c in columns[:-1] if c not in record]  # the label may be absent
            yield number, fields, f"lacks the {spec.name} keys {missing}" if missing else None

    return {c: i for i, c in enumerate(columns)}, records()


def read_choice_jsonl(path: str, spec: ChoiceTaskSpec, labelled: bool = True,
                      skip_bad_records: bool = False) -> ChoiceSplit:
    """The examples of one JSON-lines file of `spec`'s task, in file order (the label as in
    `read_choice_csv`)."""
    index, records = jsonl_records(path, spec)
    return _read_records(path, spec, index, len(index), records, labelled, skip_bad_records)


def read_choice_file(path: str, spec: ChoiceTaskSpec, labelled: bool = True,
                     skip_bad_records: bool = False) -> ChoiceSplit:
    """`read_choice_jsonl` for a `.jsonl` file, else `read_choice_csv`."""
    read = read_choice_jsonl if path.endswith(".jsonl") else read_choice_csv
    return read(path, spec, labelled, skip_bad_records)


def _read_records(path: str, spec: ChoiceTaskSpec, index: dict[str, int], width: int,
                  records: Iterator[Record], labelled: bool,
                  skip_bad_records: bool) -> ChoiceSplit:
    """The examples of `records`, each checked; bad ones raise or are set aside."""
    examples: list[ChoiceExample] = []
    bad: list[BadRecord] = []
    seen: dict[str, int] = {}
    for row, (line, fields, problem) in enumerate(records):
        try:
            if problem is not None:
                raise ValueError(problem)
            example = _example(spec, index, fields, width, line, row, labelled)
            if example.example_id in seen:
                raise ValueError(f"id {example.example_id!r} repeats line "
                                 f"{seen[example.example_id]}")
        except ValueError as e:
            which = _which(spec, index, fields)
            if not skip_bad_records:
                raise MultipleChoiceFormatError(f"{path}:{line}{which}: {e}") from None
            bad.append(BadRecord(path, f"line {line}{which}", str(e)))
            continue
        seen[example.example_id] = line
        examples.append(example)
    return ChoiceSplit(spec.name, path, examples=examples, bad_records=bad)


def _which(spec: ChoiceTaskSpec, index: dict[str, int], fields: list[str]) -> str:
    """" (id abc)" when the row's id can be read, else ""."""
    column = index.get(spec.id_column) if spec.id_column is not None else None
    if column is not None and column < len(fields) and fields[column]:
        return f" (id {fields[column]})"
    return ""


def read_split(task_dir: str, spec: ChoiceTaskSpec, split: str,
               skip_bad_records: bool = False) -> ChoiceSplit:
    """The "train" or "dev" file of `spec` in `task_dir`; no examples is an error."""
    path = spec.path(task_dir, split)
    out = read_choice_csv(path, spec, labelled=True, skip_bad_records=skip_bad_records)
    if not out.examples:
        aside = f" ({len(out.bad_records)} malformed rows set aside)" if out.bad_records else ""
        raise MultipleChoiceFormatError(f"{path}: no {spec.name} examples{aside}")
    return out


def check_files(task_dir: str, spec: ChoiceTaskSpec) -> None:
    """FileNotFoundError naming a missing file; MultipleChoiceFormatError for a bad header.

    Reads the headers only: rows are checked when read.
    """
    for split in ("train", "dev"):
        path = spec.path(task_dir, split)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no {spec.name} {split} file (the folder needs "
                                    f"{spec.train_file} and {spec.dev_file})")
        with open(path, "rb") as f:
            head = f.read(1 << 16)
        text = head.decode("utf-8-sig", errors="replace").splitlines()[:1]
        if not text:
            raise MultipleChoiceFormatError(f"{path}: empty file, expected a header row")
        _header_index(path, spec, next(csv.reader(text)), labelled=True)


def subset(split: ChoiceSplit, limit: int | None, seed: int = 0) -> ChoiceSplit:
    """A fixed random subset of `limit` examples, in file order (all when limit is None)."""
    return split.subset(limit, seed)


# ---------------------------------------------------------------------------------------------
# A train/dev split of one labelled file (Cosmos QA has only its validation file here)
# ---------------------------------------------------------------------------------------------

def split_by_group(path: str, group_column: str, dev_every: int, train_path: str,
                   dev_path: str) -> tuple[int, int]:
    """Write the rows of a CSV file to a train and a dev file, both with its header; returns
    (train rows, dev rows).

    The fixed rule: rows are grouped by `group_column` (Cosmos QA: the passage, which several
    questions share) in order of first appearance, and every `dev_every`-th group (the 5th,
    10th, ... for 5) goes to dev, so no passage is in both. Fields are written back with
    minimal quoting and "\\r\\n" line ends (Cosmos QA's own).
    """
    if dev_every < 2:
        raise ValueError(f"dev_every must be >= 2, got {dev_every}")
    records = csv_records(path)
    _, header = next(records)
    if group_column not in header:
        raise MultipleChoiceFormatError(f"{path}:1: no column {group_column!r} to split by")
    column = header.index(group_column)
    groups: dict[str, int] = {}
    train, dev = io.StringIO(), io.StringIO()
    writers = csv.writer(train), csv.writer(dev)
    for w in writers:
        w.writerow(header)
    counts = [0, 0]
    for _, fields in records:
        group = groups.setdefault(fields[column], len(groups))
        to_dev = int(group % dev_every == dev_every - 1)
        writers[to_dev].writerow(fields)
        counts[to_dev] += 1
    storage.atomic_write_text(train_path, train.getvalue())
    storage.atomic_write_text(dev_path, dev.getvalue())
    return counts[0], counts[1]


# ---------------------------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EncodedChoices:
    """Token ids of a split: per example, one variable-length array per choice (no padding)."""

    example_ids: list[str]
    input_ids: list[tuple[np.ndarray, ...]]
    """Per example, C arrays of int64 ids: `[CLS] A [SEP] B_i [SEP]`."""
    token_type_ids: list[tuple[np.ndarray, ...]]
    """Per example, C arrays: 0 for A and its [CLS]/[SEP], 1 for B_i and the last [SEP]."""
    labels: np.ndarray
    """(N,) int64 gold choice, -1 where unlabelled."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_choices(self) -> int:
        return len(self.input_ids[0]) if self.input_ids else 0

    @property
    def lengths(self) -> np.ndarray:
        """(N,) tokens of each example, all choices together."""
        return np.fromiter((sum(len(c) for c in x) for x in self.input_ids), dtype=np.int64,
                           count=len(self))


def truncating_tokenizer(tokenizer, max_seq_length: int):
    """`tokenizer` if it truncates pairs longest-first to max_seq_length and does not pad,
    else a copy that does (the caller's tokenizer is left as it is)."""
    from tokenizers import Tokenizer

    truncation = tokenizer.truncation or {}
    if (truncation.get("max_length") == max_seq_length
            and truncation.get("strategy") == "longest_first" and tokenizer.padding is None):
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    # longest_first drops one token at a time from the longer sequence, as BERT's
    # `_truncate_seq_pair` does (run_classifier.py).
    copy.enable_truncation(max_length=max_seq_length, strategy="longest_first")
    return copy


def encode_split(tokenizer, split: ChoiceSplit | Sequence[ChoiceExample],
                 max_seq_length: int = MAX_SEQ_LENGTH, batch_size: int = 256) -> EncodedChoices:
    """Tokenize every (A, B_i) pair of every example (batched through the Rust tokenizer)."""
    examples = split.examples if isinstance(split, ChoiceSplit) else list(split)
    tokenizer = truncating_tokenizer(tokenizer, max_seq_length)
    input_ids: list[tuple[np.ndarray, ...]] = []
    token_type_ids: list[tuple[np.ndarray, ...]] = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        pairs = [(e.first, b) for e in chunk for b in e.choices]
        encodings = tokenizer.encode_batch(pairs)
        at = 0
        for e in chunk:
            mine = encodings[at:at + len(e.choices)]
            at += len(e.choices)
            input_ids.append(tuple(np.asarray(x.ids, np.int64) for x in mine))
            token_type_ids.append(tuple(np.asarray(x.type_ids, np.int64) for x in mine))
    labels = np.array([-1 if e.label is None else e.label for e in examples], np.int64)
    return EncodedChoices([e.example_id for e in examples], input_ids, token_type_ids, labels)
