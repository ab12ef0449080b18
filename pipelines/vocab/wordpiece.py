"""WordPiece vocabulary training in BERT's layout: the pure functions `train_vocab` wires.

The corpus is reduced to exact word counts first (normalise with BERT's normaliser, split with
BERT's pre-tokenizer, count); that part is a Beam combine. The WordPiece trainer of Hugging Face
`tokenizers` then learns the vocabulary from those counts on one worker. Its Python API takes
text, not counts, so each word is fed as itself repeated `count` times (`repeat_words`): exact,
and the trainer's own multi-threaded splitting and counting of that stream is the only part that
grows with the corpus size on that worker (no normalising or parsing there).

Vocabulary layout (bert-base-uncased's, so that special ids match every BERT checkpoint):

    0            [PAD]
    1 .. 99      [unused0] .. [unused98]
    100 .. 103   [UNK] [CLS] [SEP] [MASK]
    104 ..       [unused99] .. [unused{N-1}]
    then         the learned tokens (characters, "##" characters, then wordpieces in merge order)

N, the number of `[unused*]` tokens, is 994 for the 30,522-entry vocabulary (as bert-base-uncased)
and scales with the size: N = max(99, vocab_size * 994 // 30522); 99 is the floor that keeps
`[UNK]` at id 100. When the corpus is too small to fill `vocab_size` with learned tokens, the
remaining slots become further `[unused*]` tokens, so the size is always exactly `vocab_size`.

Determinism: the `tokenizers` trainer breaks ties between equally frequent merges by token id,
and assigns ids to characters in hash-map order, so two runs on the same counts can differ. We
choose the alphabet ourselves (most frequent characters, ties by code point) and hand the trainer
every character and "##" character in sorted order as its first tokens; its ids, and so its merges,
are then fixed. Words holding a character outside the alphabet are left out of training: WordPiece
turns such a word into `[UNK]` whatever the vocabulary, so they carry no information.
"""
from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from common.settings import check, check_choices
from common.tokenization import (
    CLS,
    MASK,
    MAX_INPUT_CHARS_PER_WORD,
    PAD,
    SEP,
    UNK,
    bert_normalizer,
    build_tokenizer,
)

logger = logging.getLogger(__name__)

BERT_VOCAB_SIZE = 30522
BERT_NUM_UNUSED = 994  # bert-base-uncased: [unused0] .. [unused993]
MIN_NUM_UNUSED = 99  # [unused0] .. [unused98] sit before [UNK] = 100
MIN_BPE_VOCAB_SIZE = 5 + 256  # the specials and a byte-level BPE's alphabet
CONTINUATION_PREFIX = "##"
# Longest run of one word the trainer gets in a single string: bounds memory, not results.
REPEAT_CHUNK = 65536


def default_num_unused(vocab_size: int) -> int:
    """The `[unused*]` count: bert-base-uncased's 994 scaled to `vocab_size`, at least 99."""
    return max(MIN_NUM_UNUSED, vocab_size * BERT_NUM_UNUSED // BERT_VOCAB_SIZE)


@dataclass(frozen=True)
class VocabConfig:
    """How to train the vocabulary (flags of `pipelines/train_vocab.py`)."""

    vocab_size: int = BERT_VOCAB_SIZE
    """Total entries, special and `[unused*]` tokens included."""
    do_lower_case: bool = True
    """Lower-case and strip accents as the uncased BERT does; false (train_vocab's `--cased`)
    keeps case and accents."""
    min_frequency: int = 2
    """A pair of pieces seen fewer times than this is never merged."""
    limit_alphabet: int = 1000
    """Keep at most this many distinct characters, the most frequent."""
    num_unused_tokens: int | None = None
    """`[unused*]` tokens; None for the default rule, see `default_num_unused`."""
    kind: Literal["wordpiece", "bpe"] = "wordpiece"
    """wordpiece (BERT's) or bpe (byte-level, as RoBERTa and ModernBERT; its size is
    `vocab_size` rounded up to a multiple of 64 with `[unused*]` tokens, and `limit_alphabet`
    and `num_unused_tokens` do not apply: the alphabet is the 256 bytes)."""

    def __post_init__(self) -> None:
        check_choices(self)  # kind: common.tokenization.VOCAB_KINDS
        check(self.kind != "bpe" or self.vocab_size >= MIN_BPE_VOCAB_SIZE, "vocab_size",
              f"a byte-level BPE needs at least {MIN_BPE_VOCAB_SIZE} entries (5 special tokens "
              f"and the 256 byte symbols), got {self.vocab_size}")
        check(self.num_unused_tokens is None or self.num_unused_tokens >= MIN_NUM_UNUSED,
              "num_unused_tokens", f"must be >= {MIN_NUM_UNUSED} (so that [UNK] keeps BERT's id "
              f"100), got {self.num_unused_tokens}")
        check(self.vocab_size > self.num_reserved, "vocab_size",
              f"must exceed the {self.num_reserved} special and [unused*] tokens, got "
              f"{self.vocab_size}")
        check(self.min_frequency >= 1, "min_frequency", f"must be >= 1, got {self.min_frequency}")
        check(self.limit_alphabet >= 1, "limit_alphabet",
              f"must be >= 1, got {self.limit_alphabet}")

    @property
    def num_unused(self) -> int:
        if self.num_unused_tokens is not None:
            return self.num_unused_tokens
        return default_num_unused(self.vocab_size)

    @property
    def num_reserved(self) -> int:
        return self.num_unused + 5  # [PAD] [UNK] [CLS] [SEP] [MASK]

    def resolved(self) -> dict:
        """The config with the `[unused*]` count filled in, as saved in the manifest (a BPE's
        count follows from its training: the manifest's top-level `num_unused_tokens`)."""
        num_unused = self.num_unused if self.kind == "wordpiece" else self.num_unused_tokens
        return {**asdict(self), "num_unused_tokens": num_unused}


def tiny() -> VocabConfig:
    """The demo's vocabulary of the bundled sample: 4,000 entries, uncased."""
    return VocabConfig(vocab_size=4000)


def base() -> VocabConfig:
    """bert-base-uncased's size and layout: 30,522 entries, 994 `[unused*]`."""
    return VocabConfig()


large = base


def reserved_tokens(num_unused: int) -> list[str]:
    """The first `num_unused + 5` entries: specials at bert-base-uncased's ids, `[unused*]` around."""
    if num_unused < MIN_NUM_UNUSED:
        raise ValueError(f"need at least {MIN_NUM_UNUSED} [unused*] tokens, got {num_unused}")
    unused = [f"[unused{i}]" for i in range(num_unused)]
    return [PAD, *unused[:MIN_NUM_UNUSED], UNK, CLS, SEP, MASK, *unused[MIN_NUM_UNUSED:]]


def word_splitter(do_lower_case: bool) -> Callable[[str], list[str]]:
    """A function from text to its words: BERT normaliser, then BERT pre-tokenizer.

    The pre-tokenizer splits on whitespace and punctuation. After the normaliser, whose
    `clean_text` turns every whitespace character into " " and drops control characters, Python's
    `str.split()` splits on exactly the same characters; a piece that is all letters and digits
    (`str.isalnum`) holds no punctuation, so it is one word as it is. Only the other pieces go
    through the pre-tokenizer: same words, ~4x faster than pre-tokenizing every text.
    """
    from tokenizers import pre_tokenizers

    normalizer = bert_normalizer(do_lower_case)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def split(text: str) -> list[str]:
        words: list[str] = []
        for piece in normalizer.normalize_str(text).split():
            if piece.isalnum():
                words.append(piece)
            else:
                words.extend(word for word, _ in pre_tokenizer.pre_tokenize_str(piece))
        return words

    return split


def count_words(texts: Iterable[str], split: Callable[[str], list[str]]) -> collections.Counter:
    """Exact word counts of `texts` under `split` (see `word_splitter`)."""
    counts: collections.Counter = collections.Counter()
    for text in texts:
        counts.update(split(text))
    return counts


def choose_alphabet(word_counts: Mapping[str, int], limit: int) -> list[str]:
    """The `limit` most frequent characters (occurrences weighted by word count), sorted.

    Ties at the cut go to the lower code point, so the choice is deterministic.
    """
    char_counts: collections.Counter = collections.Counter()
    for word, count in word_counts.items():
        for char in word:
            char_counts[char] += count
    ranked = sorted(char_counts.items(), key=lambda item: (-item[1], item[0]))
    return sorted(char for char, _ in ranked[:limit])


@dataclass(frozen=True)
class TrainingWords:
    """The word counts the trainer sees, and what was left out and why."""

    counts: dict[str, int]
    alphabet: list[str]
    too_long: dict[str, int] = field(default_factory=dict)
    """Unique words longer than the 200-character WordPiece limit ([UNK] whatever we learn)."""
    outside_alphabet: dict[str, int] = field(default_factory=dict)
    """Unique words with a character outside the alphabet ([UNK] whatever we learn)."""


def select_training_words(word_counts: Mapping[str, int], limit_alphabet: int,
                          max_chars: int = MAX_INPUT_CHARS_PER_WORD) -> TrainingWords:
    """Drop the words WordPiece would turn into `[UNK]` anyway; choose the alphabet on the rest."""
    too_long = {w: c for w, c in word_counts.items() if len(w) > max_chars}
    fitting = {w: c for w, c in word_counts.items() if len(w) <= max_chars}
    alphabet = choose_alphabet(fitting, limit_alphabet)
    allowed = set(alphabet)
    kept = {w: c for w, c in fitting.items() if allowed.issuperset(w)}
    outside = {w: c for w, c in fitting.items() if w not in kept}
    return TrainingWords(kept, alphabet, too_long, outside)


def initial_tokens(words: Iterable[str], alphabet: list[str]) -> list[str]:
    """Every character, then every "##" character that occurs inside a word, in code-point order.

    Given to the trainer first, these fix the ids that its merge tie-breaking depends on.
    """
    continuations = sorted({char for word in words for char in word[1:]})
    return list(alphabet) + [CONTINUATION_PREFIX + char for char in continuations]


def repeat_words(word_counts: Mapping[str, int], chunk: int = REPEAT_CHUNK) -> Iterator[str]:
    """Strings of space-separated words in which each word occurs exactly its count times.

    The `tokenizers` trainers count words only from text; a word repeated `count` times, split on
    whitespace by the trainer, hands it the exact count. Words never hold whitespace (BERT's
    pre-tokenizer splits on it), so the split gives the words back unchanged.
    """
    for word in sorted(word_counts):
        remaining = word_counts[word]
        piece = word + " "
        while remaining > 0:
            n = min(remaining, chunk)
            yield piece * n
            remaining -= n


def num_repeat_strings(word_counts: Mapping[str, int], chunk: int = REPEAT_CHUNK) -> int:
    return sum(-(-count // chunk) for count in word_counts.values())


def learn_wordpieces(words: TrainingWords, num_tokens: int, min_frequency: int,
                     show_progress: bool = False) -> list[str]:
    """Up to `num_tokens` WordPiece tokens learned from `words`, in the trainer's id order."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    initial = initial_tokens(words.counts, words.alphabet)
    if len(initial) > num_tokens:
        raise ValueError(f"the alphabet needs {len(initial)} entries (characters and '##' "
                         f"characters) but only {num_tokens} learned slots are left: raise "
                         "--vocab_size or lower --limit_alphabet")
    trainer = trainers.WordPieceTrainer(
        vocab_size=num_tokens, min_frequency=min_frequency, show_progress=show_progress,
        special_tokens=initial, continuing_subword_prefix=CONTINUATION_PREFIX)
    tokenizer = Tokenizer(models.WordPiece(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # words arrive normalised and split
    tokenizer.train_from_iterator(repeat_words(words.counts), trainer,
                                  length=num_repeat_strings(words.counts))
    learned = sorted(tokenizer.get_vocab(with_added_tokens=False).items(), key=lambda kv: kv[1])
    return [token for token, _ in learned]


def assemble_vocab(learned: list[str], config: VocabConfig) -> list[str]:
    """BERT's layout around `learned`, padded with more `[unused*]` to exactly `vocab_size`."""
    room = config.vocab_size - config.num_reserved
    if len(learned) > room:
        raise ValueError(f"{len(learned)} learned tokens do not fit in {room} slots")
    num_unused = config.num_unused + room - len(learned)
    vocab = reserved_tokens(num_unused) + list(learned)
    if len(set(vocab)) != len(vocab):
        clash = sorted(t for t, n in collections.Counter(vocab).items() if n > 1)
        raise ValueError(f"learned tokens clash with reserved ones: {clash[:10]}")
    return vocab


@dataclass(frozen=True)
class VocabResult:
    """A trained vocabulary (tokens in id order) and the numbers that describe how it was made."""

    tokens: list[str]
    stats: dict


def train_vocab(word_counts: Mapping[str, int], config: VocabConfig,
                show_progress: bool = False) -> VocabResult:
    """A BERT-layout WordPiece vocabulary of exactly `config.vocab_size` tokens from word counts."""
    if not word_counts:
        raise ValueError("no words to train on")
    words = select_training_words(word_counts, config.limit_alphabet)
    if not words.counts:
        raise ValueError("every word is longer than the WordPiece limit "
                         f"({MAX_INPUT_CHARS_PER_WORD} characters): nothing to train on")
    room = config.vocab_size - config.num_reserved
    learned = learn_wordpieces(words, room, config.min_frequency, show_progress)
    tokens = assemble_vocab(learned, config)
    stats = {
        **word_count_stats(word_counts, words),
        "alphabet_size": len(words.alphabet),
        "num_learned_tokens": len(learned),
        "num_unused_tokens": len(tokens) - len(learned) - 5,
        **tokenization_stats(tokens, word_counts, config.do_lower_case,
                             show_progress=show_progress),
    }
    if len(learned) < room:
        logger.warning("the corpus filled %d of %d learned slots; %d more [unused*] tokens pad "
                       "the vocabulary to %d", len(learned), room, room - len(learned),
                       config.vocab_size)
    return VocabResult(tokens, stats)


def word_count_stats(word_counts: Mapping[str, int], words: TrainingWords) -> dict:
    total = sum(word_counts.values())
    return {
        "num_words": total,
        "num_unique_words": len(word_counts),
        "num_training_words": sum(words.counts.values()),
        "num_unique_training_words": len(words.counts),
        "num_words_too_long": sum(words.too_long.values()),
        "num_words_outside_alphabet": sum(words.outside_alphabet.values()),
        "num_unique_words_outside_alphabet": len(words.outside_alphabet),
        "num_singleton_words": sum(1 for c in word_counts.values() if c == 1),
    }


def tokenization_stats(tokens: list[str], word_counts: Mapping[str, int],
                       do_lower_case: bool, batch_size: int = 10000,
                       show_progress: bool = False) -> dict:
    """How the vocabulary tokenizes the corpus words, weighted by their counts."""
    from common.logs import progress

    tokenizer = build_tokenizer(tokens, do_lower_case)
    unk_id = tokens.index(UNK)
    words = sorted(word_counts)
    pieces = unk_words = whole_words = 0
    for start in progress(range(0, len(words), batch_size), desc="tokenization stats", unit="batch",
                      disable=not show_progress):
        batch = words[start:start + batch_size]
        for word, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False)):
            count = word_counts[word]
            pieces += count * len(encoding.ids)
            unk_words += count * (unk_id in encoding.ids)
            whole_words += count * (len(encoding.ids) == 1 and encoding.ids[0] != unk_id)
    total = sum(word_counts.values())
    return {
        "tokens_per_word": round(pieces / total, 6),
        "unk_word_fraction": round(unk_words / total, 6),
        "whole_word_fraction": round(whole_words / total, 6),
    }
