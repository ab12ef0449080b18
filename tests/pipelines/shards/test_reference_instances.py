"""Reference mode of pipelines/shards/instances.py: exact, step by step, and the spec's invariants on
the books."""

from __future__ import annotations

import random

import numpy as np
import pytest

from pipelines.shards.instances import (
    ACTUAL_NEXT,
    RANDOM_NEXT,
    InstanceConfig,
    Vocab,
    create_instances_reference,
)
from tests.pipelines.shards.instance_checks import (
    assert_80_10_10,
    assert_structure,
    assert_whole_words,
)

# ---------------------------------------------------------------------------------------------
# reference mode: exact, step by step
# ---------------------------------------------------------------------------------------------

TINY_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat",
               "dog", "ran", "far", "away", "##s", "home"]


CLS_, SEP_, MASK_ = 2, 3, 4


THE, CAT, SAT, ON, MAT, DOG, RAN, FAR, AWAY, HOME = 5, 6, 7, 8, 9, 10, 11, 12, 13, 15


def test_reference_mode_tiny_input_step_by_step():
    """The reference's random stream written out draw by draw for a tiny corpus."""
    doc0 = [[THE, CAT, SAT], [ON, THE, MAT], [DOG, RAN]]
    doc1 = [[FAR, AWAY], [HOME]]
    cfg = InstanceConfig(max_seq_length=10, max_predictions_per_seq=1, masked_lm_prob=0.3,
                         short_seq_prob=0.5, dupe_factor=1, random_seed=169)
    rng = random.Random(169)
    docs = [doc0, doc1]
    rng.shuffle(docs)
    assert docs == [doc0, doc1]  # the shuffle kept the order
    # -- document 0, max_num_tokens = 7
    assert rng.random() >= 0.5  # 0.5198: no short target, target = 7
    # 3 + 3 + 2 = 8 >= 7 at the last segment: chunk = all three segments
    assert rng.randint(1, 2) == 1  # a_end = 1: A = "the cat sat"
    assert rng.random() >= 0.5  # 0.5553: actual next, B = "on the mat dog ran"
    assert rng.random() < 0.5  # 0.1229: 3 + 5 > 7, B is longer: delete its first token ("on")
    tokens = [CLS_, THE, CAT, SAT, SEP_, THE, MAT, DOG, RAN, SEP_]  # 10 tokens
    # n = min(1, round(10 * 0.3)) = 1
    candidates = [1, 2, 3, 5, 6, 7, 8]
    rng.shuffle(candidates)
    assert candidates[0] == 5
    assert rng.random() >= 0.8  # 0.8284: not [MASK]
    assert rng.random() >= 0.5  # 0.6026: a random word ...
    assert rng.randint(0, 15) == 4  # ... vocab_words[4], which happens to be "[MASK]"
    first = (tokens[:5] + [MASK_] + tokens[6:], [5], [THE], ACTUAL_NEXT)
    # -- document 1
    assert rng.random() < 0.5  # 0.4760: short target ...
    assert rng.randint(2, 7) == 2  # ... of 2 tokens
    # "far away" (2 >= 2): a one-segment chunk, so random next with no coin drawn
    assert rng.randint(0, 1) == 0  # random document 0 != 1 on the first try
    assert rng.randint(0, 2) == 1  # start at "on the mat": 3 >= target_b = 0, one segment
    # nothing put back (the chunk had no B segments); 2 + 3 <= 7: no truncation
    candidates = [1, 2, 4, 5, 6]  # [CLS] far away [SEP] on the mat [SEP]; n = round(2.4) = 2 -> 1
    rng.shuffle(candidates)
    assert candidates[0] == 6
    assert rng.random() < 0.8  # 0.3132: [MASK]
    second = ([CLS_, FAR, AWAY, SEP_, ON, THE, MASK_, SEP_], [6], [MAT], RANDOM_NEXT)
    # "home" is the last segment: a one-segment chunk again
    assert rng.randint(0, 1) == 0
    assert rng.randint(0, 2) == 1
    candidates = [1, 3, 4, 5]  # [CLS] home [SEP] on the mat [SEP]; n = round(2.1) = 2 -> 1
    rng.shuffle(candidates)
    assert candidates[0] == 5
    assert rng.random() < 0.8  # 0.3835: [MASK]
    third = ([CLS_, HOME, SEP_, ON, THE, MASK_, SEP_], [5], [MAT], RANDOM_NEXT)
    expected = [first, second, third]
    rng.shuffle(expected)
    assert [e[0][1] for e in expected] == [THE, HOME, FAR]  # the final shuffle's order

    got = create_instances_reference([[np.array(s) for s in d] for d in (doc0, doc1)],
                                     Vocab.from_tokens(TINY_TOKENS), cfg)
    assert [(i.input_ids.tolist(), i.masked_lm_positions.tolist(), i.masked_lm_ids.tolist(),
             i.next_sentence_label) for i in got] == expected
    assert [i.segment_ids.tolist() for i in got] == [
        [0] * 5 + [1] * 5, [0] * 3 + [1] * 4, [0] * 4 + [1] * 4]


def test_reference_whole_word_mask_step_by_step():
    """Whole-word masking: the shuffle is over word groups, 80/10/10 is drawn per wordpiece."""
    cats = 14  # "##s"
    doc = [[THE, CAT, cats, SAT], [ON, THE, MAT]]
    cfg = InstanceConfig(max_seq_length=12, max_predictions_per_seq=3, masked_lm_prob=0.25,
                         short_seq_prob=0.0, dupe_factor=1, random_seed=66,
                         do_whole_word_mask=True)
    rng = random.Random(66)
    docs = [doc]
    rng.shuffle(docs)
    rng.random()  # the short-target draw is made even with short_seq_prob = 0
    # 4 + 3 = 7 < 9 until the last segment: chunk = both segments
    assert rng.randint(1, 1) == 1  # a_end = 1
    assert rng.random() >= 0.5  # actual next
    tokens = [CLS_, THE, CAT, cats, SAT, SEP_, ON, THE, MAT, SEP_]  # n = round(2.5) = 2
    groups = [[1], [2, 3], [4], [6], [7], [8]]  # "cat ##s" is one group
    rng.shuffle(groups)
    assert groups[0] == [2, 3]  # taken first; then len(chosen) = n stops the scan
    assert rng.random() < 0.8  # "cat" -> [MASK]
    assert rng.random() >= 0.8  # "##s": not [MASK] ...
    assert rng.random() < 0.5  # ... kept: the fates are drawn per wordpiece, not per word
    expected = [CLS_, THE, MASK_, cats, SAT, SEP_, ON, THE, MAT, SEP_]
    got = create_instances_reference([[np.array(s) for s in doc]], Vocab.from_tokens(TINY_TOKENS),
                                     cfg)
    assert len(got) == 1
    assert got[0].input_ids.tolist() == expected != tokens
    assert got[0].masked_lm_positions.tolist() == [2, 3]
    assert got[0].masked_lm_ids.tolist() == [CAT, cats]
    assert got[0].next_sentence_label == ACTUAL_NEXT


def test_reference_mode_books_invariants(book_docs, vocab):
    cfg = InstanceConfig(dupe_factor=2)
    instances = create_instances_reference(book_docs, vocab, cfg)
    assert len(instances) == 4456
    assert_structure(instances, vocab, cfg)
    assert assert_80_10_10(instances, vocab) == sum(len(i.masked_lm_positions) for i in instances)
    assert create_instances_reference(book_docs, vocab, cfg)[7].input_ids.tolist() == \
        instances[7].input_ids.tolist()  # deterministic


def test_reference_mode_whole_word_and_mlm_only(sample_docs, vocab):
    wwm = InstanceConfig(do_whole_word_mask=True)
    instances = create_instances_reference(sample_docs, vocab, wwm)
    assert_structure(instances, vocab, wwm)
    assert assert_whole_words(instances, vocab, wwm) == 97  # masked words of several pieces
    mlm = InstanceConfig(next_sentence=False)
    instances = create_instances_reference(sample_docs, vocab, mlm)
    assert_structure(instances, vocab, mlm)


def test_reference_rejects_empty_segments(vocab):
    with pytest.raises(ValueError, match="document 0: segment 1 is empty"):
        create_instances_reference([[np.array([5, 6]), np.array([], dtype=np.int32)]], vocab,
                                   InstanceConfig())
