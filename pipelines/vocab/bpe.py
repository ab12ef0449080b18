"""Byte-level BPE vocabulary training (`vocab.kind=bpe`, RoBERTa's and ModernBERT's kind of
tokenizer): the pure functions `train_vocab` wires in place of `wordpiece`'s.

Words are what the byte-level pre-tokenizer cuts (`common.tokenization.bpe_pre_tokenizer`: GPT-2's
split, a space before every word folded into it as "Ġ"), counted exactly by the same Beam combine
as WordPiece's words; the BPE trainer of Hugging Face `tokenizers` then learns the merges from
those counts on one worker, fed each word repeated `count` times (`wordpiece.repeat_words`).
Byte-level words hold no whitespace (a space is "Ġ", a newline "Ċ"), so the trainer's whitespace
split hands them back unchanged.

Vocabulary layout (BERT's special-token names, as ModernBERT's BPE keeps them):

    0 .. 4       [PAD] [UNK] [CLS] [SEP] [MASK]
    5 .. 260     the 256 byte symbols, in code-point order (the trainer sorts its alphabet)
    261 ..       the merged pieces, in merge order
    then         [unused0] .. : padding to a multiple of 64

The size is padded, not the target: the trainer learns up to `vocab_size` entries (specials
included), then `[unused*]` tokens fill the vocabulary up to the next multiple of 64 (as
ModernBERT pads its 50,280-entry BPE with unused tokens), so the embedding matrix's rows divide
evenly into tensor cores' tiles; a corpus too small to fill `vocab_size` is padded the same way. The unused slots
are plain vocabulary entries that no merge produces.

Determinism: the trainer's alphabet is the 256 byte symbols in code-point order and it breaks
ties between equally frequent pairs by their ids, so the same counts give the same merges.
"""
from __future__ import annotations

import collections
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from common.tokenization import (
    SPECIAL_TOKENS,
    UNUSED_PREFIX,
    bpe_normalizer,
    bpe_pre_tokenizer,
    build_bpe_tokenizer,
)
from pipelines.vocab.wordpiece import VocabConfig, num_repeat_strings, repeat_words

logger = logging.getLogger(__name__)

SIZE_MULTIPLE = 64
"""The BPE vocabulary's size is a multiple of this (`padded_size`)."""


def padded_size(vocab_size: int) -> int:
    """`vocab_size` rounded up to a multiple of `SIZE_MULTIPLE`."""
    return -(-vocab_size // SIZE_MULTIPLE) * SIZE_MULTIPLE


def word_splitter(do_lower_case: bool) -> Callable[[str], list[str]]:
    """A function from text to its byte-level words ("ĠThe", ","): the normaliser, then the
    pre-tokenizer of `common.tokenization.build_bpe_tokenizer`, as the shards will encode."""
    normalizer = bpe_normalizer(do_lower_case)
    pre_tokenizer = bpe_pre_tokenizer()

    def split(text: str) -> list[str]:
        return [word for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]

    return split


@dataclass(frozen=True)
class LearnedBpe:
    """The trainer's vocabulary (byte symbols, then merged pieces, in id order) and merges."""
    tokens: list[str]
    merges: list[tuple[str, str]]


def learn_bpe(word_counts: Mapping[str, int], num_tokens: int, min_frequency: int,
              show_progress: bool = False) -> LearnedBpe:
    """Up to `num_tokens` entries (the 256 byte symbols included) learned from byte-level words."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if len(alphabet) > num_tokens:
        raise ValueError(f"a byte-level BPE needs {len(alphabet)} byte symbols but only "
                         f"{num_tokens} learned slots are left: raise --vocab_size")
    trainer = trainers.BpeTrainer(vocab_size=num_tokens, min_frequency=min_frequency,
                                  show_progress=show_progress, special_tokens=[],
                                  initial_alphabet=alphabet)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # words arrive split and mapped
    tokenizer.train_from_iterator(repeat_words(word_counts), trainer,
                                  length=num_repeat_strings(word_counts))
    model = json.loads(tokenizer.model.__getstate__())  # the BPE model's JSON: vocab, merges
    tokens = [token for token, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [(a, b) for a, b in model["merges"]]
    return LearnedBpe(tokens, merges)


def assemble_vocab(learned: list[str], size: int) -> list[str]:
    """Specials, the learned tokens, then `[unused*]` up to exactly `size` entries."""
    room = size - len(SPECIAL_TOKENS) - len(learned)
    if room < 0:
        raise ValueError(f"{len(learned)} learned tokens do not fit in {size} entries")
    vocab = [*SPECIAL_TOKENS, *learned, *(f"{UNUSED_PREFIX}{i}]" for i in range(room))]
    if len(set(vocab)) != len(vocab):
        clash = sorted(t for t, n in collections.Counter(vocab).items() if n > 1)
        raise ValueError(f"learned tokens clash with reserved ones: {clash[:10]}")
    return vocab


@dataclass(frozen=True)
class BpeResult:
    """A trained BPE vocabulary (tokens in id order, merges in rank order) and its numbers."""
    tokens: list[str]
    merges: list[tuple[str, str]]
    stats: dict


def train_vocab(word_counts: Mapping[str, int], config: VocabConfig,
                show_progress: bool = False) -> BpeResult:
    """A byte-level BPE vocabulary of `padded_size(config.vocab_size)` tokens from the counts of
    byte-level words (`word_splitter`)."""
    if not word_counts:
        raise ValueError("no words to train on")
    learned = learn_bpe(word_counts, config.vocab_size - len(SPECIAL_TOKENS),
                        config.min_frequency, show_progress)
    size = padded_size(config.vocab_size)
    tokens = assemble_vocab(learned.tokens, size)
    num_unused = size - len(SPECIAL_TOKENS) - len(learned.tokens)
    stats = {
        "num_words": sum(word_counts.values()),
        "num_unique_words": len(word_counts),
        "num_singleton_words": sum(1 for c in word_counts.values() if c == 1),
        "num_learned_tokens": len(learned.tokens),
        "num_merges": len(learned.merges),
        "num_unused_tokens": num_unused,
        **tokenization_stats(tokens, learned.merges, word_counts),
    }
    logger.info("BPE of %d entries: %d learned, %d [unused*] pad it to a multiple of %d",
                size, len(learned.tokens), num_unused, SIZE_MULTIPLE)
    return BpeResult(tokens, learned.merges, stats)


def tokenization_stats(tokens: list[str], merges: list[tuple[str, str]],
                       word_counts: Mapping[str, int], batch_size: int = 10000) -> dict:
    """How the vocabulary splits the corpus words, weighted by their counts. The words are
    byte-level already, so they go through the BPE model alone (no normaliser, no byte mapping)."""
    from tokenizers import pre_tokenizers

    tokenizer = build_bpe_tokenizer(tokens, merges)
    tokenizer.normalizer = None
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words = sorted(word_counts)
    pieces = whole_words = 0
    for start in range(0, len(words), batch_size):
        batch = words[start:start + batch_size]
        for word, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False)):
            count = word_counts[word]
            pieces += count * len(encoding.ids)
            whole_words += count * (len(encoding.ids) == 1)
    total = sum(word_counts.values())
    return {"tokens_per_word": round(pieces / total, 6),
            "whole_word_fraction": round(whole_words / total, 6)}
