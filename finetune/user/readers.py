"""Readers of a user's classification and regression files: CSV, TSV and JSON lines, their
columns found by name (the entry's `columns` map), read into the GLUE family's `GlueSplit`, so
the GLUE code encodes, packs and scores them.

CSV: comma-separated with standard quoting. TSV: tab-separated with quoting off, as GLUE's
files are (a sentence may hold an unbalanced `"`). Both: UTF-8 (a byte-order mark is dropped),
the first row names the columns. JSONL: one JSON object per line, the columns its keys; a label
may be written as a number (`1`) or a string (`"1"`). The `id` column is used where a file has
it, else an example's id is its row number from 0 (as GLUE's MRPC train/dev files, whose test
file alone has an index column); a test file needs no label column.

A row with the wrong number of fields, a missing or empty text, or a label not in the entry's
`labels` raises `GlueFormatError` naming the file and line, or with `skip_bad_rows` is set
aside as a `BadRow` (written to the run's dead-letter file), as the GLUE readers do. A header
without a column the entry names is an error before any training (`check_header`).
"""
from __future__ import annotations

import csv
import json
from collections.abc import Iterator

from finetune.glue import data as glue_data
from finetune.glue.data import BadRow, Example, GlueFormatError, GlueSplit
from finetune.glue.tasks import TaskSpec
from finetune.user.spec import UserTask

Record = dict[str, object]


def _table_rows(path: str, fmt: str) -> Iterator[tuple[int, list[str]]]:
    """(line number from 1, fields) of a CSV or TSV file."""
    if fmt == "tsv":
        yield from glue_data._tsv_rows(path)
        return
    try:
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, strict=True)
            for fields in reader:
                yield reader.line_num, fields
    except UnicodeDecodeError as e:
        raise GlueFormatError(f"{path}: not UTF-8 text ({e.reason})") from None
    except csv.Error as e:
        raise GlueFormatError(f"{path}:{reader.line_num}: {e}") from None


def records(path: str, fmt: str) -> Iterator[tuple[str, Record, str]]:
    """(record name, {column: value}, raw text) of every data row of `path`; a CSV/TSV row
    with the wrong number of fields has the value None under the key "" (`_example` says so)."""
    if fmt == "jsonl":
        for record, row in glue_data._json_lines(path):
            yield record, row, json.dumps(row, ensure_ascii=False)
        return
    rows = _table_rows(path, fmt)
    _, header = next(rows, (0, []))
    for line, fields in rows:
        row: Record = dict(zip(header, fields))
        if len(fields) != len(header):
            row = {"": f"{len(fields)} fields, the header has {len(header)}"}
        yield f"line {line}", row, ("\t" if fmt == "tsv" else ",").join(fields)


def count_rows(path: str, fmt: str, limit: int) -> int:
    """Data rows of `path`, counted up to `limit` (a large file is not read through); 0 for a
    file that cannot be read (its error comes from reading it)."""
    import itertools

    try:
        return sum(1 for _ in itertools.islice(records(path, fmt), limit))
    except (OSError, GlueFormatError, ValueError):
        return 0


def header(path: str, fmt: str) -> list[str]:
    """The column names of a file: its first row (CSV/TSV) or its first record's keys."""
    if fmt == "jsonl":
        return list(next((row for _, row in glue_data._json_lines(path)), {}))
    return next(_table_rows(path, fmt), (0, []))[1]


def wanted_columns(task: UserTask, labelled: bool) -> list[str]:
    roles = ["text_a", "text_b"] + (["label"] if labelled else [])
    return [name for role in roles if (name := task.column(role)) is not None]


def check_header(task: UserTask, path: str, labelled: bool) -> None:
    """`GlueFormatError` naming the file, the task and the columns missing from its header."""
    names = header(path, task.format)
    if not names:
        raise GlueFormatError(f"{path}: empty file, expected {task.name} rows")
    missing = [c for c in wanted_columns(task, labelled) if c not in names]
    if missing:
        raise GlueFormatError(f"{path}: no column {', '.join(map(repr, missing))} for task "
                              f"{task.name} ({task.source}); the file has: {', '.join(names)}")


def _text(row: Record, column: str | None) -> str | None:
    if column is None:
        return None
    value = row.get(column)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"column {column!r} is missing or empty")
    return value


def _example(task: UserTask, spec: TaskSpec, row: Record, number: int, labelled: bool) -> Example:
    if "" in row:
        raise ValueError(row[""])
    label = None
    if labelled:
        raw = row.get(task.column("label"))
        if raw is None or isinstance(raw, (dict, list, bool)):
            raise ValueError(f"no label in column {task.column('label')!r}")
        label = glue_data.parse_label(spec, str(raw))
    guid = row.get(task.column("id")) if task.column("id") else None
    return Example(guid=str(guid) if guid is not None else str(number),
                   text_a=_text(row, task.column("text_a")),
                   text_b=_text(row, task.column("text_b")), label=label)


def read_split(task: UserTask, spec: TaskSpec, split: str, path: str, labelled: bool,
               skip_bad_rows: bool) -> GlueSplit:
    """The examples of one file of `task` (`spec`: its GLUE form, for the labels)."""
    examples: list[Example] = []
    bad_rows: list[BadRow] = []
    for record, row, text in records(path, task.format):
        try:
            examples.append(_example(task, spec, row, len(examples) + len(bad_rows), labelled))
        except ValueError as e:
            if not skip_bad_rows:
                raise GlueFormatError(f"{path}: {record}: {e} (task {task.name})") from None
            bad_rows.append(BadRow(file=path, record=record, reason=str(e), text=text))
    return GlueSplit(task.name, split, path, examples=examples, bad_records=bad_rows)
