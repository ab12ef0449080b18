"""NER data: the CoNLL column format, read into sentences of words and IOB tags.

Formats (`NerFormat`, one per task in `finetune.ner.tasks`):
- CoNLL-2003: `token POS chunk NER`, four space-separated columns; every document starts with a
  `-DOCSTART- -X- -X- O` line (not a sentence); sentences end at an empty line.
- WNUT-17: `token<TAB>tag`; a sentence ends at any whitespace-only line (2,394 of the train
  file's boundaries are a lone tab: reading only empty lines as boundaries merges 3,394 sentences
  into 1,001).

The word is the first column and the NER tag the last. Tags are `O`, `B-<type>` or `I-<type>`
(IOB2 in both shipped sets; IOB1 files read the same way, the scorer decodes either; a user's
BIOES task, finetune/user, also takes `E-`/`S-`: `NerFormat.tag_prefixes`). A line
with the wrong number of columns or a tag of another shape raises `NerFormatError` naming the
file and line; with `skip_bad_records` its whole sentence is set aside as a `BadRecord`
(counted, written to the run's dead-letter file) rather than scored with a word missing. Labels
are those of the training file (`label_list`), which the task table fixes in advance
(`finetune.ner.tasks`); `check_labels` names a train/dev/test tag outside them, with its file
and line, before any training.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from common.errors import BadRecord

DOCSTART = "-DOCSTART-"
OUTSIDE = "O"
TAG_PATTERN = re.compile(r"O|[BI]-\S+")


class NerFormatError(ValueError):
    """A CoNLL-format file that does not have the layout its task describes."""


@dataclass(frozen=True)
class NerFormat:
    """How one task's files lay out a token per line."""

    num_columns: int
    """Fields on every token line (CoNLL-2003: 4, WNUT-17: 2)."""
    delimiter: str
    """What separates the fields: " " (CoNLL-2003) or "\\t" (WNUT-17). Splitting on this alone,
    not on any whitespace, keeps a token holding another space character whole."""
    tag_prefixes: str = "BI"
    """Prefixes a tag other than `O` may have: "BI" (IOB1, IOB2), "BIES" (BIOES: a task
    file's tag set, finetune/user)."""

    def __post_init__(self) -> None:
        if self.num_columns < 2:
            raise ValueError(f"num_columns must be >= 2 (word and tag), got {self.num_columns}")
        if not self.delimiter or self.delimiter.strip():
            raise ValueError(f"delimiter must be whitespace, got {self.delimiter!r}")

    def is_tag(self, tag: str) -> bool:
        """`O`, or one of `tag_prefixes`, a dash and a type without spaces."""
        return tag == OUTSIDE or (tag[:1] in self.tag_prefixes and TAG_PATTERN.fullmatch(
            f"B{tag[1:]}") is not None)

    def tag_shapes(self) -> str:
        """"O, B-<type> or I-<type>": the tags `is_tag` takes, for errors."""
        shapes = [OUTSIDE, *(f"{p}-<type>" for p in self.tag_prefixes)]
        return f"{', '.join(shapes[:-1])} or {shapes[-1]}"


@dataclass(frozen=True)
class Sentence:
    """One sentence: its words and their gold NER tags."""

    words: tuple[str, ...]
    tags: tuple[str, ...]
    document: int
    """Index of its document in the file (0, 1, ...); every sentence is its own document in a
    file without `-DOCSTART-` lines."""
    line: int
    """Line number (from 1) of its first word: where a reader of the file finds it."""


@dataclass(frozen=True)
class NerSplit:
    """The sentences of one file and the sentences set aside from it."""

    path: str
    sentences: list[Sentence]
    num_documents: int
    """`-DOCSTART-` documents (0 in a file without them)."""
    bad_records: list[BadRecord] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.sentences)

    @property
    def num_tokens(self) -> int:
        return sum(len(s.words) for s in self.sentences)

    @property
    def num_entities(self) -> int:
        """Entity mentions as the CoNLL scorer decodes the tags (an `I-` after `O` or another
        type starts one, as does every `B-`)."""
        return sum(len(entity_spans(s.tags)) for s in self.sentences)


def entity_spans(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """(type, first word, last word) of every entity mention in one sentence's IOB tags.

    The chunking of the CoNLL scorer `conlleval`: a mention starts at `B-`, or at `I-` after `O`
    or after another type (IOB1's and broken IOB2's starts), and ends before `O`, `B-` or a
    change of type.
    """
    spans: list[tuple[str, int, int]] = []
    kind, start = None, 0
    for i, tag in enumerate(tags):
        prefix, _, this = tag.partition("-")
        if kind is not None and (prefix != "I" or this != kind):
            spans.append((kind, start, i - 1))
            kind = None
        if prefix in ("B", "I") and kind is None:
            kind, start = this, i
    if kind is not None:
        spans.append((kind, start, len(tags) - 1))
    return spans


def _lines(path: str) -> Iterator[tuple[int, str]]:
    """(line number from 1, line without its line end); undecodable text names the line."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                raise NerFormatError(f"{path}:{number}: not UTF-8 text ({e.reason}, byte "
                                     f"0x{raw[e.start]:02x})") from None


def _parse_line(line: str, fmt: NerFormat) -> tuple[str, str]:
    """(word, tag) of a token line; ValueError says what is wrong with it."""
    fields = line.split(fmt.delimiter)
    if len(fields) != fmt.num_columns:
        raise ValueError(f"{len(fields)} {fmt.delimiter!r}-separated fields, expected "
                         f"{fmt.num_columns} (word ... tag): {line!r}")
    word, tag = fields[0], fields[-1]
    if not word:
        raise ValueError(f"empty word: {line!r}")
    if not fmt.is_tag(tag):
        raise ValueError(f"tag {tag!r} is not {fmt.tag_shapes()}")
    return word, tag


def read_conll(path: str, fmt: NerFormat, skip_bad_records: bool = False) -> NerSplit:
    """Every sentence of a CoNLL-format file, in file order.

    A bad line raises `NerFormatError` ("<path>:<line>: ..."), or with `skip_bad_records` sets
    its sentence aside (one `BadRecord` per sentence, naming the first bad line).
    """
    sentences: list[Sentence] = []
    bad: list[BadRecord] = []
    words: list[str] = []
    tags: list[str] = []
    first_line, error = 0, None
    document, num_documents = -1, 0

    def finish() -> None:
        nonlocal words, tags, error, document
        if error is not None:
            bad.append(BadRecord(path, f"line {error[0]}", error[1]))
        elif words:
            if num_documents == 0:
                document += 1  # no -DOCSTART- lines: a sentence is its own document
            sentences.append(Sentence(tuple(words), tuple(tags), document, first_line))
        words, tags, error = [], [], None

    for number, line in _lines(path):
        if not line.strip():
            finish()
            continue
        if line.split(fmt.delimiter, 1)[0] == DOCSTART:
            finish()
            num_documents += 1
            document += 1
            continue
        if not words and error is None:
            first_line = number
        if error is not None:
            continue  # the rest of a sentence already set aside
        try:
            word, tag = _parse_line(line, fmt)
        except ValueError as e:
            if not skip_bad_records:
                raise NerFormatError(f"{path}:{number}: {e}") from None
            error = (number, str(e))
            continue
        words.append(word)
        tags.append(tag)
    finish()
    return NerSplit(path, sentences, num_documents, bad)


def label_list(train: NerSplit) -> tuple[str, ...]:
    """The training file's tags: `O` first, then by entity type, `B-` before `I-`."""
    seen = {t for s in train.sentences for t in s.tags}
    if not seen:
        raise NerFormatError(f"{train.path}: no tagged words")

    def key(tag: str) -> tuple[int, str, str]:
        prefix, _, kind = tag.partition("-")
        return (tag != OUTSIDE, kind, prefix)

    return tuple(sorted(seen | {OUTSIDE}, key=key))


def check_labels(split: NerSplit, labels: Sequence[str], source: str) -> None:
    """Raise `NerFormatError` at the first tag of `split` not among `labels` (those of the
    training file, or of the task table: `source` names which).

    A model has no output for such a tag, and scoring would count every one of its entities
    as missed: that is a data problem to fix, named before any training.
    """
    known = set(labels)
    for sentence in split.sentences:
        for offset, tag in enumerate(sentence.tags):
            if tag not in known:
                raise NerFormatError(
                    f"{split.path}:{sentence.line + offset}: tag {tag!r} is not a label of "
                    f"{source} ({', '.join(labels)})")


def subset(split: NerSplit, limit: int | None, seed: int = 0) -> NerSplit:
    """A fixed random subset of `limit` sentences in file order (all when limit is None)."""
    import numpy as np

    if limit is None or limit >= len(split.sentences):
        return split
    keep = np.sort(np.random.default_rng(seed).choice(len(split.sentences), limit, replace=False))
    return NerSplit(split.path, [split.sentences[i] for i in keep], split.num_documents,
                    split.bad_records)
