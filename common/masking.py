"""Masked-LM masking: which tokens to predict and what the model sees there (paper section 3.1,
appendix C.2, Table 8).

One implementation, used by every path that masks:
- `pipelines/shards/instances.py` scalable mode (make_shards on Beam) and reference mode (BERT's exact
  `create_pretraining_data.py` draw order, `reference_replacement`);
- `training/remasking.py` dynamic re-masking (RoBERTa section 4.1).

A chosen position becomes `[MASK]` with probability `mask_fraction`, stays the same token with
`same_fraction` and becomes a random vocabulary token with `random_fraction` (BERT: 80/10/10;
Table 8 also runs 100/0/0, 80/0/20, 80/20/0, 0/20/80 and 0/0/100). Pure numpy; no Beam, no torch.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from common.settings import check

SPLIT_TOLERANCE = 1e-6
"""How far the three fractions may sum from 1 (decimal settings such as 0.7/0.2/0.1)."""


@dataclass(frozen=True)
class MaskSplit:
    """What a predicted position shows the model: the MASK/SAME/RND split of Table 8 and
    whole-word selection. Declared once here; every config that masks derives from it
    (`MaskingConfig`, make_shards' `InstanceConfig`, pre-training's dynamic re-masking)."""
    mask_fraction: float = 0.8
    """Share of predicted positions replaced by `[MASK]` (Table 8's MASK column)."""
    same_fraction: float = 0.1
    """Share of predicted positions left unchanged (Table 8's SAME column)."""
    random_fraction: float = 0.1
    """Share of predicted positions replaced by a random vocabulary token (Table 8's RND); the
    three sum to 1."""
    do_whole_word_mask: bool = False
    """Choose whole words: a piece that continues a word (WordPiece's `##`; in a byte-level BPE,
    one without the space prefix `Ġ`) is predicted together with the pieces before it."""

    def __post_init__(self):
        self.check_split()

    def check_split(self) -> None:
        split = (self.mask_fraction, self.same_fraction, self.random_fraction)
        check(all(0.0 <= f <= 1.0 for f in split) and abs(sum(split) - 1.0) <= SPLIT_TOLERANCE,
              "mask_fraction", "with same_fraction and random_fraction (the MASK/SAME/RND "
              f"split): each must be in [0, 1] and the three sum to 1, got {split}")


@dataclass(frozen=True)
class MaskingConfig(MaskSplit):
    """How many positions to mask and what to put there."""
    masked_lm_prob: float = 0.15
    """Share of an instance's tokens, special tokens included in the count, to predict."""
    max_predictions_per_seq: int = 20
    """Cap on predicted positions per instance."""

    def __post_init__(self):
        check(0.0 < self.masked_lm_prob < 1.0, "masked_lm_prob",
              f"must be in (0, 1), got {self.masked_lm_prob}")
        check(self.max_predictions_per_seq >= 1, "max_predictions_per_seq",
              f"must be >= 1, got {self.max_predictions_per_seq}")
        self.check_split()


def num_to_predict(num_tokens, cfg: MaskingConfig):
    """Predicted positions of instances of `num_tokens` tokens (an int or an (N,) array),
    specials included in the count: round(num_tokens * rate), at least 1, at most the cap
    (the reference's rule; np.round rounds half to even, as Python 3's round)."""
    if isinstance(num_tokens, (int, np.integer)):
        return min(cfg.max_predictions_per_seq, max(1, round(num_tokens * cfg.masked_lm_prob)))
    rounded = np.round(np.asarray(num_tokens) * cfg.masked_lm_prob).astype(np.int64)
    return np.minimum(cfg.max_predictions_per_seq, np.maximum(1, rounded))


def word_groups(candidate_tokens: np.ndarray, is_subword: np.ndarray) -> np.ndarray:
    """(C,) group index of each candidate position: a `##` piece joins the word before it (even
    across a skipped special token, as in the reference); the first candidate starts a word."""
    starts = ~is_subword[candidate_tokens]
    if len(starts):
        starts[0] = True
    return np.cumsum(starts) - 1


def take_word_groups(sizes: np.ndarray, order: np.ndarray, n: int) -> list[int]:
    """Groups visited in `order`, each taken unless it would exceed `n` predictions, until `n`
    are reached (the reference's scan over shuffled words)."""
    taken, chosen = 0, []
    for g in order:
        if taken >= n:
            break
        if taken + sizes[g] <= n:
            chosen.append(int(g))
            taken += int(sizes[g])
    return chosen


def replace_tokens(tokens: np.ndarray, positions: np.ndarray, draws: np.ndarray,
                   cfg: MaskingConfig, mask_id: int, replacement_ids: np.ndarray) -> None:
    """What the model sees at the predicted `positions` (M,) of `tokens`, in place, from one
    uniform draw in [0, 1) per position (M,): below `mask_fraction` `[MASK]`, from
    `1 - random_fraction` on a random id of `replacement_ids` (the draw's place in that range
    scaled to the ids), else the token unchanged."""
    random_from = 1.0 - cfg.random_fraction
    tokens[positions[draws < cfg.mask_fraction]] = mask_id
    to_random = (draws >= random_from) & (draws >= cfg.mask_fraction)
    if to_random.any():
        k = len(replacement_ids)
        scaled = (draws[to_random] - random_from) * (1.0 / cfg.random_fraction)
        picks = np.minimum((scaled * k).astype(np.int64), k - 1)
        tokens[positions[to_random]] = replacement_ids[picks]


def reference_replacement(token: int, rng: random.Random, cfg: MaskingConfig, mask_id: int,
                          replacement_ids: np.ndarray) -> int:
    """`replace_tokens` for one position in the reference's draw order (reference mode): a
    first draw for `[MASK]`, then, for the rest, a second for same-or-random, then the random
    id; at 80/10/10 the second threshold is exactly 0.5, so the stream equals BERT's."""
    if rng.random() < cfg.mask_fraction:
        return mask_id
    rest = cfg.same_fraction + cfg.random_fraction
    if rest <= 0.0:  # a split within SPLIT_TOLERANCE of 100/0/0
        return mask_id
    if rng.random() >= cfg.same_fraction / rest:
        return int(replacement_ids[rng.randint(0, len(replacement_ids) - 1)])
    return token
