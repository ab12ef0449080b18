"""Dynamic re-masking (RoBERTa section 4.1): new masks for every row each epoch, drawn with
`common.masking` from the row's identity in the data set (`KeyedRow`), and the masking share as
a schedule over a phase's steps (`MaskSchedule`)."""
from __future__ import annotations

import dataclasses
import functools
import zlib
from dataclasses import dataclass

import numpy as np

from common.masking import (
    MaskingConfig,
    num_to_predict,
    replace_tokens,
    take_word_groups,
    word_groups,
)
from common.shard_format import Row


@dataclass(frozen=True)
class KeyedRow:
    """A row with its identity in the data set (seeds the dynamic masks)."""
    row: Row
    shard: str
    key: str
    index: int


@dataclass(frozen=True)
class Remasker:
    """Dynamic masking (RoBERTa section 4.1): new masks for every row each epoch, drawn with
    `common.masking` (the MASK/SAME/RND split and whole-word groups make_shards uses).

    Candidates are all non-special tokens. Each row keeps its number of predicted positions,
    unless `recount` is set: then each instance of the row gets
    `common.masking.num_to_predict` of its own tokens.
    """
    mask_id: int
    """Id of `[MASK]`."""
    vocab_size: int
    """Random replacements are drawn from [0, vocab_size)."""
    special_ids: tuple[int, ...]
    """Ids never masked ([CLS], [SEP], [PAD])."""
    seed: int = 0
    """Seed; a row's masks depend only on (seed, epoch, row identity), not on the rank split."""
    masking: MaskingConfig = dataclasses.field(default_factory=MaskingConfig)
    """The split, whole-word masking and (with `recount`) the rate and cap."""
    recount: bool = False
    """True: `masking.masked_lm_prob` decides each instance's count; False: keep the row's."""
    subword_ids: tuple[int, ...] = ()
    """Ids of pieces that continue a word (WordPiece's `##`, a BPE piece without the space
    prefix: `common.tokenization.is_continuation`); whole-word masking joins them to the word
    before."""

    @classmethod
    def from_vocab(cls, vocab_dir: str, seed: int, masking: MaskingConfig | None = None,
                   recount: bool = False) -> Remasker:
        from common.tokenization import (
            CLS,
            MASK,
            PAD,
            SEP,
            continuation_flags,
            read_vocab,
            vocab_kind,
        )
        tokens = read_vocab(vocab_dir)
        ids = {t: i for i, t in enumerate(tokens)}
        masking = masking or MaskingConfig()
        flags = continuation_flags(tokens, vocab_kind(vocab_dir)) \
            if masking.do_whole_word_mask else []
        subwords = tuple(i for i, continues in enumerate(flags) if continues)
        return cls(ids[MASK], len(tokens), (ids[CLS], ids[SEP], ids[PAD]), seed, masking,
                   recount, subwords)

    def __call__(self, item: KeyedRow, epoch: int, rate: float | None = None) -> Row:
        """The row with new masks; `rate`: the share to predict in force (`MaskSchedule`),
        else `masking.masked_lm_prob` (with `recount`) or the row's own count."""
        row = item.row
        original = np.array(row.input_ids, dtype=np.int64)
        original[np.asarray(row.masked_lm_positions, np.int64)] = row.masked_lm_ids
        rng = np.random.default_rng([self.seed, epoch, zlib.crc32(item.shard.encode()),
                                     zlib.crc32(item.key.encode()), item.index])
        candidates = np.flatnonzero(~np.isin(original, self.special_ids))
        count = min(self._count(row, rate), len(candidates))
        if self.masking.do_whole_word_mask:
            positions = self._whole_words(original, candidates, count, rng)
        else:
            positions = np.sort(rng.choice(candidates, size=count, replace=False))
        ids = original.copy()
        replace_tokens(ids, positions, rng.random(len(positions)), self.masking, self.mask_id,
                       self.replacement_ids)
        return Row(ids, row.segment_ids, row.sequence_ids, positions, original[positions],
                   row.next_sentence_labels)

    @functools.cached_property
    def replacement_ids(self) -> np.ndarray:
        """(vocab_size,) every id: random replacements draw from the whole vocabulary."""
        return np.arange(self.vocab_size)

    @functools.cached_property
    def is_subword(self) -> np.ndarray:
        """(vocab_size,) bool: the id continues a word (`subword_ids`)."""
        flags = np.zeros(self.vocab_size, dtype=bool)
        flags[list(self.subword_ids)] = True
        return flags

    def _count(self, row: Row, rate: float | None = None) -> int:
        """Positions to predict in the row: the shards' count, or the rate's per instance."""
        if not self.recount:
            return len(row.masked_lm_positions)
        masking = self.masking if rate is None else dataclasses.replace(self.masking,
                                                                        masked_lm_prob=rate)
        lengths = np.bincount(np.asarray(row.sequence_ids, np.int64))  # (K,) tokens per instance
        return int(num_to_predict(lengths[lengths > 0], masking).sum())

    def _whole_words(self, original: np.ndarray, candidates: np.ndarray, count: int,
                     rng: np.random.Generator) -> np.ndarray:
        """Whole words in a random order, each taken unless it would exceed `count`."""
        group = word_groups(original[candidates], self.is_subword)  # (C,)
        sizes = np.bincount(group)
        chosen = take_word_groups(sizes, np.argsort(rng.random(len(sizes)), kind="stable"), count)
        return candidates[np.isin(group, chosen)]  # ascending


@dataclass(frozen=True)
class MaskSchedule:
    """Dynamic masking's share as a schedule over a phase's optimizer steps (mmBERT's 30% ->
    5%, EuroBERT's 50% -> 10%): `start` at the first step, linearly to `end` at the last."""
    start: float
    end: float
    steps: int
    """Optimizer steps of the phase."""
    micro_batches_per_step: int
    """Micro-batches of one rank per optimizer step (gradient accumulation)."""

    def rate(self, step: int) -> float:
        """The share in force at optimizer step `step` (0-based) of the phase."""
        return self.start + (self.end - self.start) * min(1.0, step / max(1, self.steps - 1))

    def rate_of_batch(self, micro_batch: int) -> float:
        """The share of the phase's micro-batch `micro_batch` (0-based, this rank's)."""
        return self.rate(micro_batch // self.micro_batches_per_step)

