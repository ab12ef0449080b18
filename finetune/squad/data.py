"""SQuAD readers: the official JSON of v1.1 and v2.0 (`is_impossible`, `plausible_answers`).

Layout: `{"version", "data": [{"title", "paragraphs": [{"context", "qas": [{"id", "question",
"answers": [{"text", "answer_start"}], "is_impossible"?, "plausible_answers"?}]}]}]}`.

Bad input:
- a file that is not JSON (or not UTF-8) raises `SquadFormatError` naming the file, line and
  column; a file whose structure is not SQuAD's (no `data`, a paragraph without `context`)
  names the file and the JSON path of the record.
- a question with a missing or mistyped field names the file and the question id.
- in a training file, an answer whose text is not at its `answer_start` is set aside as a
  `BadRecord` (counted, written to the dead-letter file, never a crash); the question keeps its
  first answer that is where it says, and is set aside too when none is.
- an unanswerable question (`is_impossible` or no answers) in a SQuAD v1.1 training file is
  refused: v1.1 has a span for every question, so such a file is a v2.0 file given to `squad1`.

Evaluation files keep every gold answer as written (the official scorers compare texts only).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace

from common import storage
from common.errors import BadRecord
from finetune.family import ExampleSplit


class SquadFormatError(ValueError):
    """A SQuAD file that is not the official JSON layout."""


@dataclass(frozen=True)
class Answer:
    """One annotated answer: its text and the character where it starts in the context."""

    text: str
    start: int
    """Character offset into the paragraph's context (`answer_start`)."""

    @property
    def end(self) -> int:
        """Character offset one past the answer's last character."""
        return self.start + len(self.text)


@dataclass(frozen=True)
class SquadExample:
    """One question about one paragraph."""

    qid: str
    question: str
    context: str
    answers: tuple[Answer, ...]
    """Gold answers (training: the one trained on; evaluation: all of them). Empty when
    unanswerable."""
    is_impossible: bool = False
    """SQuAD v2.0: the paragraph does not answer the question."""
    article: int = 0
    """Index of the article (title) in the file: splits by article keep paragraphs together."""
    title: str = ""


@dataclass(frozen=True)
class SquadSplit(ExampleSplit[SquadExample]):
    """The questions of one SQuAD file and the answers set aside from it."""

    path: str
    version: str
    """The file's `version` field ("1.1", "v2.0")."""

    @property
    def num_unanswerable(self) -> int:
        return sum(e.is_impossible for e in self.examples)


def load_json(path: str) -> dict:
    """The parsed file; not JSON or not UTF-8 raises `SquadFormatError` with file:line:column."""
    text = storage.read_utf8(path, SquadFormatError)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise SquadFormatError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None


def _field(record: dict, name: str, kind: type, where: str):
    if not isinstance(record, dict):
        raise SquadFormatError(f"{where}: expected a JSON object, found {type(record).__name__}")
    if name not in record:
        raise SquadFormatError(f"{where}: missing {name!r}")
    value = record[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SquadFormatError(f"{where}: {name!r} is {type(value).__name__}, "
                               f"expected {kind.__name__}")
    return value


def _answers(qa: dict, where: str) -> list[Answer]:
    answers = []
    for k, raw in enumerate(_field(qa, "answers", list, where)):
        at = f"{where} answer {k}"
        answers.append(Answer(_field(raw, "text", str, at), _field(raw, "answer_start", int, at)))
    return answers


def _training_answer(answers: list[Answer], context: str, path: str, qid: str,
                     bad: list[BadRecord]) -> Answer | None:
    """The first answer found where it says; those that are not are set aside."""
    for k, answer in enumerate(answers):
        if 0 <= answer.start and context[answer.start:answer.end] == answer.text:
            return answer
        found = context[max(answer.start, 0):answer.end]
        bad.append(BadRecord(file=path, record=f"question {qid} answer {k}",
                             reason=f"answer text {answer.text!r} is not at answer_start "
                                    f"{answer.start} (the context there reads {found!r})"))
    return None


def read_squad(path: str, training: bool, version_2: bool) -> SquadSplit:
    """Read one official SQuAD JSON file.

    `training`: keep one answer per question, checked against the context (answers elsewhere
    are set aside); evaluation keeps all gold answers unchecked. `version_2`: unanswerable
    questions allowed (SQuAD v2.0); without it an unanswerable training question is an error.
    """
    dataset = load_json(path)
    articles = _field(dataset, "data", list, path)
    version = str(dataset.get("version", ""))
    examples: list[SquadExample] = []
    bad: list[BadRecord] = []
    seen: set[str] = set()
    for a, article in enumerate(articles):
        title = article.get("title", "") if isinstance(article, dict) else ""
        for p, paragraph in enumerate(_field(article, "paragraphs", list, f"{path}: data[{a}]")):
            where = f"{path}: data[{a}].paragraphs[{p}]"
            context = _field(paragraph, "context", str, where)
            for q, qa in enumerate(_field(paragraph, "qas", list, where)):
                qid = _field(qa, "id", str, f"{where}.qas[{q}]")
                at = f"{path}: question {qid}"
                if qid in seen:
                    raise SquadFormatError(f"{at}: id repeats an earlier question")
                seen.add(qid)
                question = _field(qa, "question", str, at)
                answers = _answers(qa, at)
                impossible = qa.get("is_impossible", False)
                if not isinstance(impossible, bool):
                    raise SquadFormatError(f"{at}: 'is_impossible' is not true or false")
                if impossible and answers:
                    raise SquadFormatError(f"{at}: is_impossible but has answers "
                                           "(SQuAD v2.0 keeps them as plausible_answers)")
                if impossible and not version_2 or training and not answers and not version_2:
                    raise SquadFormatError(_v1_unanswerable(path, qid))
                if training and not answers and not impossible:
                    raise SquadFormatError(f"{at}: no answers and not is_impossible")
                if training and answers:
                    answer = _training_answer(answers, context, path, qid, bad)
                    if answer is None:
                        continue
                    answers = [answer]
                examples.append(SquadExample(qid, question, context, tuple(answers),
                                             impossible, a, title))
    return SquadSplit(path, version, examples=examples, bad_records=bad)


def _v1_unanswerable(path: str, qid: str) -> str:
    return (f"{path}: question {qid} is unanswerable (is_impossible or no answers), but SQuAD "
            "v1.1 has an answer for every question: is this a v2.0 file? (use task squad2)")


# ---------------------------------------------------------------------------------------------
# Files of a data folder and subsets
# ---------------------------------------------------------------------------------------------

SPLIT_FILES = {
    "squad1": {"train": "train-v1.1.json", "dev": "dev-v1.1.json"},
    "squad2": {"train": "train-v2.0.json", "dev": "dev-v2.0.json"},
}


def split_path(data_dir: str, task: str, split: str) -> str:
    """`<data_dir>/squad/<official file name>` (`data_dir` may be the squad folder itself)."""
    name = SPLIT_FILES[task][split]
    nested = os.path.join(data_dir, "squad", name)
    return nested if os.path.isfile(nested) or not os.path.isfile(
        os.path.join(data_dir, name)) else os.path.join(data_dir, name)


def check_files(data_dir: str, task: str) -> None:
    """FileNotFoundError naming every missing file of `task` before any training."""
    missing = [split_path(data_dir, task, s) for s in SPLIT_FILES[task]
               if not os.path.isfile(split_path(data_dir, task, s))]
    if missing:
        raise FileNotFoundError(f"{task}: missing {', '.join(missing)} (the official SQuAD "
                                f"file names, under {os.path.join(data_dir, 'squad')})")


def subset(split: SquadSplit, limit: int | None, seed: int = 0) -> SquadSplit:
    """A fixed random subset of `limit` questions in file order (all when limit is None).

    Subsets are drawn by question, before windows are cut: all windows of a question stay
    together."""
    return split.subset(limit, seed)


def split_by_article(split: SquadSplit, num_train_articles: int) -> tuple[SquadSplit, SquadSplit]:
    """(questions of the first `num_train_articles` articles, those of the rest): a train/dev
    split with no paragraph on both sides, for files that have no training counterpart here."""
    first = [e for e in split.examples if e.article < num_train_articles]
    rest = [e for e in split.examples if e.article >= num_train_articles]
    return (replace(split, examples=first),
            replace(split, examples=rest, bad_records=[]))
