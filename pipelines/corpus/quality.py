"""Quality filters for a source's documents: length bounds, language identification and the
Gopher rules, as one pure function `check(passages, config) -> Drop | None`.

A source opts in with `quality` in its declaration (pipelines/documents/source.py); a source
without it (every source by default: wikipedia and books included) is not filtered at all.
`pipelines.corpus.filter_quality.FilterQuality` runs `check` in Beam, with a counter per rule and
a side output of what it dropped.

Thresholds (`QualityConfig`): every rule has one number, and 0 turns that rule off. The defaults
are the Gopher paper's (Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights
from Training Gopher", arXiv:2112.11446, appendix A.1.1, and its Table A1 for repetition), as
datatrove's GopherQualityFilter and GopherRepetitionFilter also use them: 50 to 100,000 words;
mean word length 3 to 10; '#' or ellipsis to word ratio at most 0.1; at most 90% of lines
starting with a bullet and 30% ending with an ellipsis; at least 80% of words holding a letter;
at least two of the stop words "the be to of and that have with"; duplicate lines and
paragraphs at most 30% by count and 20% by characters; the most frequent 2-, 3-, 4-gram at most
20%, 18%, 16% of the characters; duplicate 5- to 10-grams at most 15% down to 10%.

How the text is measured (pure Python, no tokenizer model):
- words: the passages' whitespace-separated tokens; a word's length leaves out the punctuation
  at its ends ("end." is 3), and a word of punctuation only counts for no mean word length;
- lines: each passage's lines, stripped, empty ones left out; paragraphs: the passages, stripped;
- a duplicate line (paragraph) is one equal to an earlier one; its characters are its length,
  over the length of all lines (paragraphs);
- n-gram characters are word characters (the words' lengths, spaces not counted) over all the
  words' characters; the top n-gram counts every occurrence (of n-grams as frequent, the one
  with the most characters; none when no n-gram occurs twice); duplicate n-grams count each word
  once, however many repeated n-grams cover it (the paper's "not double counting").

Rules run in this fixed order and the first that fails names the drop (`RULES`): word count,
language, then the Gopher rules. Language comes second so that a text in another language is
dropped as such, not for its lack of English stop words.

Language identification: py3langid (a langid.py fork, its model inside the wheel, 4.5 MB; nothing
is downloaded), loaded once per process on first use into an identifier of this module's own
(py3langid's module-level one, which `set_languages` changes, is never touched), with
probabilities (`norm_probs`). The whole text is classified among all of the model's languages; a
document is kept when the best language is one of `languages` and its probability is at least
`min_language_score`. The model is a few float32 table lookups and one matrix product: the same
text gives the same answer on every run of one machine; a score within ~1e-6 of the threshold
may fall the other way on another CPU. The model walks the text byte by byte in Python, about
1.4 MB/s on one core: most of `check`'s time (benchmarks/bench_quality.py: 0.6-1 MB/s for the
whole check on 10 KB documents of the shared books, every rule and the language on; 0.25-0.33
MB/s on one-paragraph documents, where the per-call costs dominate).
"""
from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from common import settings

STOP_WORDS = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})
"""Gopher's stop words (English)."""
BULLETS = ("•", "●", "○", "◦", "▪", "▫", "‣", "⁃", "∙", "-", "*")
"""What a bulleted line starts with."""
ELLIPSES = ("...", "…")
PUNCTUATION = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~“”‘’«»„‚—–…¡¿"
"""Stripped from both ends of a word to measure it."""
TOP_NGRAMS = (2, 3, 4)
DUPLICATE_NGRAMS = (5, 6, 7, 8, 9, 10)
RULES = ("too_few_words", "too_many_words", "language", "mean_word_length", "hash_ratio",
         "ellipsis_ratio", "bullet_lines", "ellipsis_lines", "alpha_words", "stop_words",
         "duplicate_lines", "duplicate_line_chars", "duplicate_paragraphs",
         "duplicate_paragraph_chars", *(f"top_{n}gram" for n in TOP_NGRAMS),
         *(f"duplicate_{n}gram" for n in DUPLICATE_NGRAMS))
"""Every rule's name, in the order `check` applies them (the counters' `dropped_<rule>`)."""
_LANGUAGE_CODE = re.compile(r"[a-z]{2,3}")
_LETTER = re.compile(r"[^\W\d_]")


@dataclass(frozen=True)
class QualityConfig:
    """A source's quality filters; for each threshold, 0 turns its rule off."""
    min_words: int = 50
    """Fewest words a document may have (Gopher: 50)."""
    max_words: int = 100_000
    """Most words a document may have (Gopher: 100,000)."""
    languages: tuple[str, ...] = ()
    """Languages kept, as py3langid names them (ISO 639-1 codes: en, de, fr; a few ISO 639-3
    codes where 639-1 has none: ary, yue); empty: no language filter."""
    min_language_score: float = 0.65
    """Lowest probability of the identified language (py3langid, 0..1) for a document to be
    kept; used with `languages`."""
    min_mean_word_length: float = 3.0
    """Lowest mean word length, in characters (Gopher: 3)."""
    max_mean_word_length: float = 10.0
    """Highest mean word length, in characters (Gopher: 10)."""
    max_symbol_ratio: float = 0.1
    """Most '#', and most ellipses ('...' or '…'), per word (Gopher: 0.1, each on its own)."""
    max_bullet_lines: float = 0.9
    """Largest fraction of lines starting with a bullet (Gopher: 0.9)."""
    max_ellipsis_lines: float = 0.3
    """Largest fraction of lines ending with an ellipsis (Gopher: 0.3)."""
    min_alpha_words: float = 0.8
    """Smallest fraction of words holding a letter (Gopher: 0.8)."""
    min_stop_words: int = 2
    """Fewest distinct English stop words (the, be, to, of, and, that, have, with) a document
    holds (Gopher: 2); set 0 when `languages` keeps other languages."""
    max_duplicate_lines: float = 0.3
    """Largest fraction of lines equal to an earlier line (Gopher: 0.3)."""
    max_duplicate_line_chars: float = 0.2
    """Largest fraction of line characters in such duplicate lines (Gopher: 0.2)."""
    max_duplicate_paragraphs: float = 0.3
    """Largest fraction of paragraphs (passages) equal to an earlier one (Gopher: 0.3)."""
    max_duplicate_paragraph_chars: float = 0.2
    """Largest fraction of paragraph characters in such duplicate paragraphs (Gopher: 0.2)."""
    max_top_ngram_chars: tuple[float, ...] = (0.2, 0.18, 0.16)
    """For the 2-, 3- and 4-gram: largest fraction of word characters in the most frequent
    one (Gopher: 0.2, 0.18, 0.16)."""
    max_duplicate_ngram_chars: tuple[float, ...] = (0.15, 0.14, 0.13, 0.12, 0.11, 0.10)
    """For the 5- to 10-grams: largest fraction of word characters in n-grams that occur
    more than once (Gopher: 0.15, 0.14, 0.13, 0.12, 0.11, 0.10)."""

    def __post_init__(self):
        self._check_counts()
        self._check_fractions()
        self._check_languages()

    def _check_counts(self) -> None:
        for name in ("min_words", "max_words", "min_stop_words"):
            settings.check(getattr(self, name) >= 0, name, f"must be >= 0 (0 = off), got "
                           f"{getattr(self, name)}")
        settings.check(not self.max_words or self.max_words >= self.min_words, "max_words",
                       f"{self.max_words} is below min_words {self.min_words}")
        low, high = self.min_mean_word_length, self.max_mean_word_length
        settings.check(low >= 0 and high >= 0, "min_mean_word_length",
                       f"the mean word length bounds must be >= 0, got {low} and {high}")
        settings.check(not high or high >= low, "max_mean_word_length",
                       f"{high} is below min_mean_word_length {low}")

    def _check_fractions(self) -> None:
        for name in ("min_language_score", "max_symbol_ratio", "max_bullet_lines",
                     "max_ellipsis_lines", "min_alpha_words", "max_duplicate_lines",
                     "max_duplicate_line_chars", "max_duplicate_paragraphs",
                     "max_duplicate_paragraph_chars"):
            value = getattr(self, name)
            settings.check(0 <= value <= 1, name, f"must be in [0, 1] (0 = off), got {value}")
        for name, sizes in (("max_top_ngram_chars", TOP_NGRAMS),
                            ("max_duplicate_ngram_chars", DUPLICATE_NGRAMS)):
            values = getattr(self, name)
            settings.check(len(values) == len(sizes) and all(0 <= v <= 1 for v in values), name,
                           f"takes {len(sizes)} fractions in [0, 1] (for n = "
                           f"{sizes[0]}..{sizes[-1]}; 0 = off), got {list(values)}")

    def _check_languages(self) -> None:
        bad = [code for code in self.languages if not _LANGUAGE_CODE.fullmatch(code)]
        settings.check(not bad, "languages", f"{bad}: ISO 639 codes in lower case (en, de)")
        others = [code for code in self.languages if code != "en"]
        settings.check(not (others and self.min_stop_words), "min_stop_words",
                       f"counts English stop words, which a text in {others} lacks: set it to "
                       f"0 when languages holds other languages than en")


@dataclass(frozen=True)
class Drop:
    """Why a document is dropped: the rule (one of `RULES`) and what it measured."""
    rule: str
    detail: str


@dataclass(frozen=True)
class _Text:
    """A document's text as the rules measure it (see the module docstring)."""
    text: str
    words: list[str]
    lines: list[str]
    paragraphs: list[str]

    @classmethod
    def of(cls, passages: Sequence[str]) -> _Text:
        text = "\n".join(passages)
        return cls(text, text.split(),
                   [line.strip() for line in text.splitlines() if line.strip()],
                   [p.strip() for p in passages if p.strip()])


def check(passages: Sequence[str], config: QualityConfig) -> Drop | None:
    """The first rule (in `RULES` order) that the document fails, or None: keep it."""
    doc = _Text.of(passages)
    for rule in _CHECKS:
        drop = rule(doc, config)
        if drop is not None:
            return drop
    return None


def _over(rule: str, what: str, value: float, limit: float) -> Drop | None:
    """A Drop when `value` passes the upper bound `limit` (0: the rule is off)."""
    return Drop(rule, f"{what} {_shown(value)} > {limit:g}") if limit and value > limit else None


def _under(rule: str, what: str, value: float, limit: float) -> Drop | None:
    """A Drop when `value` is below the lower bound `limit` (0: the rule is off)."""
    return Drop(rule, f"{what} {_shown(value)} < {limit:g}") if limit and value < limit else None


def _shown(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4g}"


def _fraction(part: float, whole: float) -> float:
    return part / whole if whole else 0.0


def _word_count(doc: _Text, config: QualityConfig) -> Drop | None:
    n = len(doc.words)
    return (_under("too_few_words", "words", n, config.min_words)
            or _over("too_many_words", "words", n, config.max_words))


def _language(doc: _Text, config: QualityConfig) -> Drop | None:
    if not config.languages:
        return None
    language, score = identify_language(doc.text)
    if language not in config.languages:
        return Drop("language", f"{language} ({score:.2f}) not in {','.join(config.languages)}")
    return _under("language", f"{language} score", score, config.min_language_score)


def _mean_word_length(doc: _Text, config: QualityConfig) -> Drop | None:
    if not doc.words:
        return None
    measured = [n for n in (len(w.strip(PUNCTUATION)) for w in doc.words) if n]
    mean = _fraction(sum(measured), len(measured))
    return (_under("mean_word_length", "mean word length", mean, config.min_mean_word_length)
            or _over("mean_word_length", "mean word length", mean, config.max_mean_word_length))


def _symbols(doc: _Text, config: QualityConfig) -> Drop | None:
    n = len(doc.words)
    ellipses = sum(doc.text.count(mark) for mark in ELLIPSES)
    return (_over("hash_ratio", "'#' per word", _fraction(doc.text.count("#"), n),
                  config.max_symbol_ratio)
            or _over("ellipsis_ratio", "ellipses per word", _fraction(ellipses, n),
                     config.max_symbol_ratio))


def _line_marks(doc: _Text, config: QualityConfig) -> Drop | None:
    n = len(doc.lines)
    bullets = sum(line.startswith(BULLETS) for line in doc.lines)
    ellipses = sum(line.endswith(ELLIPSES) for line in doc.lines)
    return (_over("bullet_lines", "bulleted lines", _fraction(bullets, n),
                  config.max_bullet_lines)
            or _over("ellipsis_lines", "lines ending with an ellipsis", _fraction(ellipses, n),
                     config.max_ellipsis_lines))


def _alpha_words(doc: _Text, config: QualityConfig) -> Drop | None:
    if not doc.words:
        return None
    alpha = sum(1 for w in doc.words if _LETTER.search(w))
    return _under("alpha_words", "words with a letter", alpha / len(doc.words),
                  config.min_alpha_words)


def _stop_words(doc: _Text, config: QualityConfig) -> Drop | None:
    if not config.min_stop_words:
        return None
    found = STOP_WORDS.intersection(w.strip(PUNCTUATION).lower() for w in doc.words)
    return _under("stop_words", "distinct stop words", len(found), config.min_stop_words)


def duplicates(items: Sequence[str]) -> tuple[int, int]:
    """(how many items equal an earlier one, their characters)."""
    seen: set[str] = set()
    count = chars = 0
    for item in items:
        if item in seen:
            count, chars = count + 1, chars + len(item)
        seen.add(item)
    return count, chars


def _duplicate_items(doc: _Text, config: QualityConfig) -> Drop | None:
    for unit, items, max_count, max_chars in (
            ("line", doc.lines, config.max_duplicate_lines, config.max_duplicate_line_chars),
            ("paragraph", doc.paragraphs, config.max_duplicate_paragraphs,
             config.max_duplicate_paragraph_chars)):
        count, chars = duplicates(items)
        total = sum(len(item) for item in items)
        drop = (_over(f"duplicate_{unit}s", f"duplicate {unit}s", _fraction(count, len(items)),
                      max_count)
                or _over(f"duplicate_{unit}_chars", f"characters in duplicate {unit}s",
                         _fraction(chars, total), max_chars))
        if drop:
            return drop
    return None


@dataclass(frozen=True)
class Words:
    """A document's words as arrays, for the n-gram rules (numpy sorts and sums them in C)."""
    ids: np.ndarray
    """(W,) int64: equal words, equal ids (0..V-1)."""
    lengths: np.ndarray
    """(W,) int64: each word's characters."""
    _tables: dict = field(default_factory=dict, compare=False)

    @classmethod
    def of(cls, words: Sequence[str]) -> Words:
        index: dict[str, int] = {}
        ids = np.fromiter((index.setdefault(w, len(index)) for w in words), np.int64, len(words))
        return cls(ids, np.fromiter(map(len, words), np.int64, len(words)))

    def ngrams(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(each position's n-gram as an index into the distinct n-grams (W-n+1,), each
        distinct n-gram's count). An n-gram is the pair ((n-1)-gram index, last word id),
        packed into one int64 (both are below W), so each n costs one sort of integers."""
        if n not in self._tables:
            if n == 1:
                prefix, vocab = self.ids, 0
            else:
                prefix, vocab = self.ngrams(n - 1)[0][:-1], int(self.ids.max()) + 1
            keys = prefix * vocab + self.ids[n - 1:] if n > 1 else prefix
            _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
            self._tables[n] = (inverse.reshape(-1), counts)
        return self._tables[n]


def top_ngram_chars(words: Sequence[str] | Words, n: int) -> float:
    """Fraction of the word characters in every occurrence of the most frequent n-gram (of
    several as frequent, the one with the most characters); 0 when no n-gram repeats, as a
    single occurrence is no repetition, however short the document."""
    words = words if isinstance(words, Words) else Words.of(words)
    if len(words.ids) < n:
        return 0.0
    inverse, counts = words.ngrams(n)
    top = counts.max()
    if top < 2:
        return 0.0
    gram_chars = np.lib.stride_tricks.sliding_window_view(words.lengths, n).sum(axis=1)
    chars = top * gram_chars[counts[inverse] == top].max()
    return _fraction(int(chars), int(words.lengths.sum()))


def duplicate_ngram_chars(words: Sequence[str] | Words, n: int) -> float:
    """Fraction of the word characters covered by n-grams that occur more than once (each
    word counted once)."""
    words = words if isinstance(words, Words) else Words.of(words)
    if len(words.ids) < n:
        return 0.0
    inverse, counts = words.ngrams(n)
    repeated = counts[inverse] > 1  # (W-n+1,) at each n-gram's first word
    covered = np.zeros(len(words.ids), dtype=bool)
    for k in range(n):  # an n-gram starting at i covers words i..i+n-1
        covered[k:k + len(repeated)] |= repeated
    return _fraction(int(words.lengths[covered].sum()), int(words.lengths.sum()))


def _repetition(doc: _Text, config: QualityConfig) -> Drop | None:
    if not any(config.max_top_ngram_chars + config.max_duplicate_ngram_chars):
        return None
    words = Words.of(doc.words)
    for n, limit in zip(TOP_NGRAMS, config.max_top_ngram_chars, strict=True):
        if limit and (drop := _over(f"top_{n}gram", f"top {n}-gram characters",
                                    top_ngram_chars(words, n), limit)):
            return drop
    for n, limit in zip(DUPLICATE_NGRAMS, config.max_duplicate_ngram_chars, strict=True):
        if limit and (drop := _over(f"duplicate_{n}gram", f"duplicate {n}-gram characters",
                                    duplicate_ngram_chars(words, n), limit)):
            return drop
    return None


_CHECKS = (_word_count, _language, _mean_word_length, _symbols, _line_marks, _alpha_words,
           _stop_words, _duplicate_items, _repetition)


# ---------------------------------------------------------------- language identification

@functools.cache
def _identifier():
    """py3langid's model, loaded once per process (~2 s), as an identifier of our own."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify_language(text: str) -> tuple[str, float]:
    """(the most probable language's code, its probability) among all the model's languages."""
    language, score = _identifier().classify(text)
    return language, float(score)


def known_languages() -> list[str]:
    """The language codes the model can name."""
    return list(_identifier().labels)


def check_languages(config: QualityConfig, setting: str = "languages") -> None:
    """A SettingError naming `setting` for a code in `config.languages` that the model lacks
    (it loads the model: called once where a run starts, not per document)."""
    if not config.languages:
        return
    known = set(known_languages())
    unknown = [code for code in config.languages if code not in known]
    settings.check(not unknown, setting, f"{unknown}: not a language py3langid names "
                   f"(known: {', '.join(sorted(known))})")
