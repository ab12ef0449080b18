"""Sentence segmentation for the corpus: one segmenter, blingfire (model compiled into its wheel).

Chosen for quality by `benchmarks/bench_sentences.py` on the 12 shared books and on SQuAD's
Wikipedia paragraphs, against sentencex and nupunkt (all three ship their model in the wheel;
nothing is downloaded at run time):
- sentencex is the fastest (~7x ours) but never splits inside quotation marks, so a dialogue
  paragraph of five sentences stays one "sentence" (~7,600 missed breaks on the books).
- nupunkt (Punkt, ~1.5-2x ours) ships a model trained on legal text whose abbreviation list holds
  common words ("cheerful", "so", "sir", "day", "n"), so it misses breaks after them ("... to be
  cheerful. His spirits ..."): 212 missed breaks on the books and 46 on Wikipedia against our 17
  and 5, plus ~1,800 false breaks before a lower-case word.
- blingfire misses the fewest breaks; its error kinds are regular and repaired here (the repairs
  cost ~25% of its speed): a break right after a title abbreviation ("Mrs. | Weston was ..."), a
  break before a lower-case word ('"Is it you?" | she asked.', '"Ah! | my dear ..."'), and no
  break before a title that starts a sentence ("... for some time. Mr. Knightley had ...").
  The lower-case rule also joins the rare sentence that really starts lower-case ("eBay ...").

Repairs only join or cut the original spans, so a sentence is always an exact slice of its
(whitespace collapsed) passage.
"""
from __future__ import annotations

import re

import blingfire

# A break after these is a false break: they are written before a name. ("Jr." is not here: it
# ends a name, and often a sentence.)
_TITLES = ("Mr.", "Mrs.", "Ms.", "Mme.", "Mlle.", "Dr.", "St.", "Mt.", "Messrs.", "Prof.", "Rev.",
           "Hon.", "Gen.", "Col.", "Capt.", "Lt.", "Sgt.", "Gov.", "Sen.", "Rep.")
_OPENERS = "\"'\u2018\u201c([_"
# blingfire does not break between "... for some time." and "Mr. Knightley had ...": a word ending
# a sentence, then a title and a name. The break is at the space(s) between them.
_BREAK_BEFORE_TITLE = re.compile(
    r"(?<=[a-z]{2}[.!?])[\"'\u2019\u201d)]*(?P<space> +)(?=[\"'\u2018\u201c(]*(?:Mr|Mrs|Ms|Dr|Messrs)\. [A-Z])")


def _ends_with_title(sentence: str) -> bool:
    if not sentence.endswith(_TITLES):
        return False
    word = sentence.rsplit(None, 1)[-1].lstrip(_OPENERS)
    return word in _TITLES


def _starts_lower(piece: str) -> bool:
    first = piece.lstrip(_OPENERS)[:1]
    return first.islower()


def _spans(text: str) -> list[list[int]]:
    """blingfire's sentences as [start, end] offsets into `text`.

    `text_to_sentences` runs in C; its `..._and_offsets` twin maps offsets byte by byte in Python
    (4x slower), so the offsets are found with `str.find`, which the pieces always satisfy when
    the text holds no newline (blingfire only rewrites whitespace)."""
    spans: list[list[int]] = []
    position = 0
    for piece in blingfire.text_to_sentences(text).split("\n"):
        piece = piece.strip()  # blingfire may keep a trailing space
        if not piece:
            continue
        start = text.find(piece, position)
        if start < 0:
            raise ValueError(f"blingfire changed the text: {piece!r} not found after {position}")
        spans.append([start, start + len(piece)])
        position = start + len(piece)
    return spans


def split_sentences(text: str) -> list[str]:
    """Split one passage into sentences: stripped, non-empty, one line each, in order.

    Whitespace runs (newlines included) become one space first, so every sentence can be written
    as one line of the reference text format. NUL counts as whitespace: blingfire turns it into a
    space (so its sentences would not be slices of the text), and BERT's tokenizer drops it.
    """
    text = " ".join(text.replace("\x00", " ").split())
    if not text:
        return []
    merged: list[list[int]] = []
    for span in _spans(text):
        if merged and (_starts_lower(text[span[0]:span[1]])
                       or _ends_with_title(text[merged[-1][0]:merged[-1][1]])):
            merged[-1][1] = span[1]
        else:
            merged.append(span)
    sentences: list[str] = []
    for start, end in merged:
        sentence = text[start:end]
        if ". " in sentence and _BREAK_BEFORE_TITLE.search(sentence):
            sentences += _split_before_titles(sentence)
        else:
            sentences.append(sentence)
    return sentences


def _split_before_titles(sentence: str) -> list[str]:
    pieces, start = [], 0
    for m in _BREAK_BEFORE_TITLE.finditer(sentence):
        pieces.append(sentence[start:m.start("space")])
        start = m.end("space")
    pieces.append(sentence[start:])
    return [p for piece in pieces if (p := piece.strip())]


def split_passages(passages: list[str] | tuple[str, ...]) -> list[str]:
    """The sentences of a document: each passage split on its own (no sentence spans two
    paragraphs), concatenated in order."""
    return [s for passage in passages for s in split_sentences(passage)]
