"""GLUE readers (the standard TSV layout and the Hugging Face `datasets` layout) and batching.

TSV quirks handled (those of the files `download_glue_data.py` writes): fields are split on tabs with
quoting off (`csv.QUOTE_NONE`: sentences hold unbalanced `"`, and default quoting merges rows);
CoLA train/dev have no header; MRPC train/dev start with a UTF-8 BOM (read as `utf-8-sig`); SST-2
sentences end with a space (kept: the tokenizer drops it); STS-B scores are written `5.000`, `3.8`
or `4` (parsed as floats); CoLA dev has no final newline. A row with the wrong number of fields or
an unknown label raises `GlueFormatError` naming the file and line, unless `skip_bad_rows` is set,
in which case the row is set aside in `GlueSplit.bad_rows` with its raw text (`BadRow`: counted,
written to the run's dead-letter file, never silent). A file that is not UTF-8 text raises
`GlueFormatError` naming the file and line in either case. `check_task_files` opens every file a
run needs and checks its header before any training, so a missing or misnamed file fails at once.
"""
from __future__ import annotations

import csv
import dataclasses
import glob
import json
import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from common.errors import BadRecord
from finetune.family import ExampleSplit
from finetune.glue.tasks import SplitSpec, TaskSpec
from finetune.packing import pad

MAX_SEQ_LENGTH = 128  # the paper's fine-tuning length


class GlueFormatError(ValueError):
    """A GLUE file that does not have the layout its task spec describes."""


@dataclass(frozen=True)
class BadRow(BadRecord):
    """A malformed row set aside with `skip_bad_rows`: where, why, and its raw text."""

    text: str = ""
    """The row as read: the TSV line without its line end, or the record as JSON."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False)


@dataclass(frozen=True)
class Example:
    """One GLUE example: its id, one or two sentences and the label (None in test sets)."""

    guid: str
    text_a: str
    text_b: str | None
    label: int | float | None
    """Class index into TaskSpec.labels, the STS-B score, or None for test rows."""


@dataclass(frozen=True)
class GlueSplit(ExampleSplit[Example]):
    """The examples of one split file and the rows set aside from it (`BadRow`s)."""

    task: str
    split: str
    path: str

    @property
    def bad_rows(self) -> list[BadRecord]:
        return self.bad_records


# ---------------------------------------------------------------------------------------------
# Standard GLUE TSV layout
# ---------------------------------------------------------------------------------------------

def parse_label(task: TaskSpec, raw: str) -> int | float:
    """The label id (classification) or score (regression) for a label string from a file."""
    if task.is_regression:
        score = float(raw)  # ValueError names the text; the caller adds file and line
        if not math.isfinite(score):
            raise ValueError(f"score {raw!r} is not a finite number")
        return score
    try:
        return task.labels.index(raw)
    except ValueError:
        raise ValueError(f"label {raw!r} is not one of {list(task.labels)}") from None


def _tsv_rows(path: str) -> Iterator[tuple[int, list[str]]]:
    """(line number from 1, fields) of a TSV, quoting off, BOM dropped.

    Text that is not UTF-8 (a binary or Latin-1 file) raises `GlueFormatError` naming the file
    and the line: no row can be set aside when the text is unreadable.
    """
    # newline="" lets csv see the raw line ends; utf-8-sig drops MRPC's byte-order mark.
    with open(path, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE, strict=True)
        try:
            for fields in reader:
                yield reader.line_num, fields
        except UnicodeDecodeError as e:
            # decoding runs ahead of the csv reader by a buffer: find the line itself
            raise GlueFormatError(f"{path}:{_first_undecodable_line(path)}: not UTF-8 text "
                                  f"({e.reason}, byte 0x{e.object[e.start]:02x})") from None
        except csv.Error as e:
            raise GlueFormatError(f"{path}:{reader.line_num}: {e}") from None


def _first_undecodable_line(path: str) -> int:
    """The number (from 1) of the first line of `path` that is not UTF-8, else 0."""
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                return number
    return 0


def _tsv_example(task: TaskSpec, split: SplitSpec, fields: list[str], row: int) -> Example:
    cols = split.columns
    if len(fields) != cols.num_columns:
        raise ValueError(f"expected {cols.num_columns} tab-separated fields, found {len(fields)}")
    label = None if cols.label is None else parse_label(task, fields[cols.label])
    return Example(
        guid=fields[cols.index] if cols.index is not None else str(row),
        text_a=fields[cols.text_a],
        text_b=fields[cols.text_b] if cols.text_b is not None else None,
        label=label,
    )


def read_glue_tsv(path: str, task: TaskSpec, split: SplitSpec,
                  skip_bad_rows: bool = False) -> GlueSplit:
    """Read one GLUE TSV file of `task` laid out as `split.columns` says."""
    examples: list[Example] = []
    bad_rows: list[BadRecord] = []
    header_pending = split.columns.has_header
    for line, fields in _tsv_rows(path):
        if header_pending:
            header_pending = False
            if len(fields) != split.columns.num_columns:
                raise GlueFormatError(
                    f"{path}:{line}: header has {len(fields)} fields, expected "
                    f"{split.columns.num_columns} for {task.name} {split.name}")
            continue
        try:
            examples.append(_tsv_example(task, split, fields, len(examples) + len(bad_rows)))
        except ValueError as e:
            if not skip_bad_rows:
                raise GlueFormatError(f"{path}:{line}: {e}") from None
            # quoting is off, so the fields joined by tabs are the line as written
            bad_rows.append(BadRow(file=path, record=f"line {line}", reason=str(e),
                                   text="\t".join(fields)))
    return GlueSplit(task.name, split.name, path, examples=examples, bad_records=bad_rows)


# ---------------------------------------------------------------------------------------------
# Hugging Face `datasets` layout
# ---------------------------------------------------------------------------------------------

_HF_EXTENSIONS = ("parquet", "arrow", "jsonl", "json")


def find_hf_files(data_dir: str, task: TaskSpec, split: SplitSpec) -> list[str]:
    """The files of one split in a Hugging Face GLUE folder, or [] when there are none.

    Accepted under `<data_dir>/<config>/` (config = "cola", "mnli", "ax", ...): the Hub layout
    `<split>-00000-of-00001.parquet`, single files `<split>.{parquet,arrow,jsonl,json}`, and
    `save_to_disk` folders `<split>/data-*.arrow`.
    """
    base = os.path.join(data_dir, split.hf_config or task.hf_config)
    if not os.path.isdir(base):
        return []
    name = split.hf_split
    for ext in _HF_EXTENSIONS:
        for pattern in (f"{name}-*.{ext}", f"{name}.{ext}", os.path.join(name, f"*.{ext}")):
            files = sorted(glob.glob(os.path.join(base, pattern)))
            if files:
                return files
    return []


def _read_arrow_table(path: str, schema_only: bool = False):
    """The table of a Parquet or Arrow file (its schema only with `schema_only`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.endswith(".parquet"):
            return pq.read_schema(path) if schema_only else pq.read_table(path)
        try:  # `datasets` writes the Arrow streaming format; plain Arrow files the file format
            with pa.memory_map(path) as source:
                reader = pa.ipc.open_stream(source)
                return reader.schema if schema_only else reader.read_all()
        except pa.ArrowInvalid:
            with pa.memory_map(path) as source:
                reader = pa.ipc.open_file(source)
                return reader.schema if schema_only else reader.read_all()
    except (pa.ArrowException, OSError) as e:
        raise GlueFormatError(f"{path}: not a readable {os.path.splitext(path)[1][1:]} "
                              f"file ({e})") from None


def _json_lines(path: str) -> Iterator[tuple[str, dict]]:
    """(record name, row) of a JSON-lines file; bad JSON or text names the file and line."""
    line_number = 0
    try:
        with open(path, encoding="utf-8") as f:
            for line_number, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise GlueFormatError(f"{path}:{line_number}: not JSON: {e}") from None
                if not isinstance(row, dict):
                    raise GlueFormatError(f"{path}:{line_number}: not a JSON object")
                yield f"line {line_number}", row
    except UnicodeDecodeError as e:
        raise GlueFormatError(f"{path}:{line_number + 1}: not UTF-8 text ({e})") from None


def _hf_records(path: str) -> Iterator[tuple[str, dict]]:
    """(record name for errors, row dict) for every row of one HF data file."""
    if path.endswith((".jsonl", ".json")):
        yield from _json_lines(path)
        return
    for row_number, row in enumerate(_read_arrow_table(path).to_pylist()):
        yield f"row {row_number}", row


def _hf_example(task: TaskSpec, row: dict, has_labels: bool) -> Example:
    missing = [c for c in (*task.hf_text_fields, "idx") if c not in row]
    if missing:
        raise ValueError(f"missing columns {missing}")
    label = None
    if has_labels:
        raw = row.get("label")
        if raw is None:
            raise ValueError("missing label")
        if task.is_regression:
            label = float(raw)
            if not math.isfinite(label):
                raise ValueError(f"score {raw!r} is not a finite number")
        elif isinstance(raw, int) and 0 <= raw < task.num_labels:
            label = raw
        else:
            raise ValueError(f"label {raw!r} is not a class id in 0..{task.num_labels - 1}")
    texts = [row[c] for c in task.hf_text_fields]
    if not all(isinstance(t, str) for t in texts):
        raise ValueError("a text field is not a string")
    return Example(guid=str(row["idx"]), text_a=texts[0],
                   text_b=texts[1] if len(texts) == 2 else None, label=label)


def read_hf_split(files: Sequence[str], task: TaskSpec, split: SplitSpec,
                  skip_bad_rows: bool = False) -> GlueSplit:
    """Read one split stored in the Hugging Face `datasets` GLUE layout (test labels are -1)."""
    has_labels = split.columns.label is not None
    examples: list[Example] = []
    bad_rows: list[BadRecord] = []
    for path in files:
        for record, row in _hf_records(path):
            try:
                examples.append(_hf_example(task, row, has_labels))
            except (ValueError, TypeError) as e:
                if not skip_bad_rows:
                    raise GlueFormatError(f"{path}: {record}: {e}") from None
                bad_rows.append(BadRow(file=path, record=record, reason=str(e),
                                       text=json.dumps(row, ensure_ascii=False, default=str)))
    return GlueSplit(task.name, split.name, ",".join(files), examples=examples,
                     bad_records=bad_rows)


def read_split(data_dir: str, task: TaskSpec, split: SplitSpec,
               skip_bad_rows: bool = False) -> GlueSplit:
    """One split from `data_dir`: the GLUE TSV when present, else the Hugging Face layout."""
    tsv = os.path.join(data_dir, split.path)
    if os.path.isfile(tsv):
        return read_glue_tsv(tsv, task, split, skip_bad_rows)
    hf_files = find_hf_files(data_dir, task, split)
    if hf_files:
        return read_hf_split(hf_files, task, split, skip_bad_rows)
    raise _missing_split(data_dir, task, split)


def _missing_split(data_dir: str, task: TaskSpec, split: SplitSpec) -> FileNotFoundError:
    return FileNotFoundError(
        f"{task.name} {split.name}: neither {os.path.join(data_dir, split.path)} nor a Hugging "
        f"Face {split.hf_config or task.hf_config}/{split.hf_split}.* file under {data_dir}")


def has_split(data_dir: str, task: TaskSpec, split: SplitSpec) -> bool:
    return os.path.isfile(os.path.join(data_dir, split.path)) or bool(
        find_hf_files(data_dir, task, split))


# ---------------------------------------------------------------------------------------------
# Checks before any training
# ---------------------------------------------------------------------------------------------

def _hf_columns(path: str) -> list[str]:
    """Column names of a HF data file (a JSON-lines file: the keys of its first record)."""
    if path.endswith((".jsonl", ".json")):
        return list(next((row for _, row in _json_lines(path)), {}))
    return list(_read_arrow_table(path, schema_only=True).names)


def check_split_file(data_dir: str, task: TaskSpec, split: SplitSpec) -> None:
    """Raise unless `split` of `task` exists under `data_dir` and starts as its spec says.

    Reads only the start of each file: the header's field count (TSV; the first row's when the
    file has no header) or the column names (HF layout). Rows further on are checked when read.
    """
    tsv = os.path.join(data_dir, split.path)
    if os.path.isfile(tsv):
        first = next(_tsv_rows(tsv), None)
        if first is None:
            raise GlueFormatError(f"{tsv}: empty file, expected {task.name} {split.name} rows")
        line, fields = first
        if len(fields) != split.columns.num_columns:
            what = "header" if split.columns.has_header else "first row"
            raise GlueFormatError(
                f"{tsv}:{line}: {what} has {len(fields)} fields, expected "
                f"{split.columns.num_columns} for {task.name} {split.name}")
        return
    files = find_hf_files(data_dir, task, split)
    if not files:
        raise _missing_split(data_dir, task, split)
    wanted = [*task.hf_text_fields, "idx"] + (["label"] if split.columns.label is not None else [])
    for path in files:
        missing = [c for c in wanted if c not in _hf_columns(path)]
        if missing:
            raise GlueFormatError(f"{path}: missing columns {missing} for {task.name} {split.name}")


def file_problems(data_dir: str, tasks: Sequence[TaskSpec],
                  predict_test: bool) -> tuple[list[str], list[str]]:
    """(missing files, malformed files) of a run of `tasks`, one line each.

    Train and dev files must exist; test files are optional (a task without one has no
    leaderboard file) but, when `predict_test`, those present must start right.
    """
    missing: list[str] = []
    malformed: list[str] = []
    for task in tasks:
        tests = [s for s in task.test if has_split(data_dir, task, s)] if predict_test else []
        for split in (task.train, *task.dev, *tests):
            try:
                check_split_file(data_dir, task, split)
            except FileNotFoundError as e:
                missing.append(str(e))
            except GlueFormatError as e:
                malformed.append(str(e))
    return missing, malformed


def check_task_files(data_dir: str, tasks: Sequence[TaskSpec], predict_test: bool) -> None:
    """Check every file a run of `tasks` reads before any of them is fine-tuned (`file_problems`).

    All problems are reported at once: FileNotFoundError when every one is a missing file, else
    GlueFormatError.
    """
    missing, malformed = file_problems(data_dir, tasks, predict_test)
    problems = missing + malformed
    if problems:
        error = GlueFormatError if malformed else FileNotFoundError
        raise error(f"--data {data_dir}: {len(problems)} problem(s) found before any "
                    "fine-tuning:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------------------------------------
# Tokenization and batching
# ---------------------------------------------------------------------------------------------

def load_glue_tokenizer(model_dir: str, max_seq_length: int = MAX_SEQ_LENGTH):
    """The checkpoint folder's tokenizer (`finetune.checkpoint.load_tokenizer`), truncating
    pairs longest-first to `max_seq_length`."""
    from finetune.checkpoint import load_tokenizer

    return truncating(load_tokenizer(model_dir), max_seq_length)


def truncating(tokenizer, max_seq_length: int):
    """A copy of `tokenizer` that truncates to `max_seq_length` tokens; longest_first drops
    tokens from the longer sentence one at a time, as BERT's `_truncate_seq_pair` does
    (run_classifier.py). Padding is off: batches are padded or packed per batch."""
    from tokenizers import Tokenizer

    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_padding()
    copy.enable_truncation(max_length=max_seq_length, strategy="longest_first")
    return copy


@dataclass(frozen=True)
class EncodedSplit:
    """Token ids of a split, one variable-length array per example (no padding)."""

    input_ids: list[np.ndarray]
    token_type_ids: list[np.ndarray]
    labels: np.ndarray
    """(N,) int64 class ids, float32 scores, or -1 for test rows."""
    guids: list[str]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.input_ids), dtype=np.int64, count=len(self))


def encode_split(tokenizer, split: GlueSplit, task: TaskSpec,
                 batch_size: int = 1024) -> EncodedSplit:
    """Tokenize every example of `split` (batched through the Rust tokenizer)."""
    input_ids: list[np.ndarray] = []
    token_type_ids: list[np.ndarray] = []
    examples = split.examples
    for start in range(0, len(examples), batch_size):
        chunk = examples[start:start + batch_size]
        inputs = [(e.text_a, e.text_b) if e.text_b is not None else e.text_a for e in chunk]
        for enc in tokenizer.encode_batch(inputs):
            input_ids.append(np.asarray(enc.ids, dtype=np.int64))
            token_type_ids.append(np.asarray(enc.type_ids, dtype=np.int64))
    if task.is_regression:
        labels = np.array([np.nan if e.label is None else e.label for e in examples], np.float32)
    else:
        labels = np.array([-1 if e.label is None else e.label for e in examples], np.int64)
    return EncodedSplit(input_ids, token_type_ids, labels, [e.guid for e in examples])


@dataclass(frozen=True)
class Batch:
    """A padded batch: (B, T) tensors, T = the longest example in the batch."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor
    labels: torch.Tensor


def collate(encoded: EncodedSplit, indices: Sequence[int], pad_id: int = 0) -> Batch:
    """Pad the examples at `indices` to their longest length (dynamic padding)."""
    ids = [encoded.input_ids[i] for i in indices]
    input_ids = pad(ids, pad_id)  # (B, T)
    token_type_ids = pad([encoded.token_type_ids[i] for i in indices])  # (B, T)
    attention_mask = pad([np.ones(len(x)) for x in ids])  # (B, T)
    return Batch(torch.from_numpy(input_ids), torch.from_numpy(attention_mask),
                 torch.from_numpy(token_type_ids), torch.from_numpy(encoded.labels[list(indices)]))
