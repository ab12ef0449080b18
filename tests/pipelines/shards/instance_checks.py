"""The spec's invariants of pretraining instances, checked the same way in both modes, and the
books' instance configuration."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np

from pipelines.shards import instances as inst
from pipelines.shards.instances import (
    ACTUAL_NEXT,
    NO_NSP,
    RANDOM_NEXT,
    InstanceConfig,
    Vocab,
    num_to_predict,
)

SIGMAS = 4.0


def books_cfg(**overrides) -> InstanceConfig:
    return dataclasses.replace(InstanceConfig(dupe_factor=3), **overrides)


def scalable_plans(docs, cfg: InstanceConfig) -> list[inst.InstancePlan]:
    """All passes' plans, random next filled, in (pass, document) order."""
    return [plan for plans in inst.document_plans(docs, cfg) for plan in plans]


# ---------------------------------------------------------------------------------------------
# checks shared by both modes
# ---------------------------------------------------------------------------------------------

def original_ids(instance) -> np.ndarray:
    ids = instance.input_ids.copy()
    ids[instance.masked_lm_positions] = instance.masked_lm_ids
    return ids


def assert_structure(instances, vocab: Vocab, cfg: InstanceConfig) -> None:
    """Invariants 1-3 on every instance, exactly."""
    for instance in instances:
        ids, pos = original_ids(instance), instance.masked_lm_positions
        t = len(ids)
        assert t <= cfg.max_seq_length
        assert ids[0] == vocab.cls_id
        seps = np.flatnonzero(ids == vocab.sep_id)
        assert seps[-1] == t - 1 and seps[0] >= 2  # len(A) >= 1
        if cfg.next_sentence:
            assert len(seps) == 2 and seps[1] - seps[0] >= 2  # len(B) >= 1
            assert instance.next_sentence_label in (ACTUAL_NEXT, RANDOM_NEXT)
        else:
            assert len(seps) == 1 and instance.next_sentence_label == NO_NSP
        np.testing.assert_array_equal(instance.segment_ids, np.arange(t) > seps[0])
        assert instance.input_ids.dtype == np.int32 and instance.segment_ids.dtype == np.uint8
        assert np.all(np.diff(pos) > 0) and pos[0] > 0 and pos[-1] < t - 1
        assert not np.isin(pos, seps).any()
        if not cfg.do_whole_word_mask:
            assert len(pos) == num_to_predict(t, cfg)
        unmasked = np.setdiff1d(np.arange(t), pos)
        np.testing.assert_array_equal(instance.input_ids[unmasked], ids[unmasked])


def within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= SIGMAS * math.sqrt(n * p * (1 - p))


def assert_80_10_10(instances, vocab: Vocab) -> int:
    """Invariant 4; returns the number of masked positions checked."""
    masked = np.concatenate([i.input_ids[i.masked_lm_positions] for i in instances])
    labels = np.concatenate([i.masked_lm_ids for i in instances])
    n = len(masked)
    n_mask = int(np.count_nonzero(masked == vocab.mask_id))
    n_same = int(np.count_nonzero(masked == labels))
    # a random replacement can pick [MASK] or the original itself: +0.1/V each, far inside 4 sigma
    assert within(n_mask, n, 0.8), (n_mask, n)
    assert within(n_same, n, 0.1), (n_same, n)
    assert within(n - n_mask - n_same, n, 0.1), (n - n_mask - n_same, n)
    return n


def word_groups(ids: np.ndarray, vocab: Vocab) -> list[list[int]]:
    """Candidate groups as the spec states them: a ## token joins the previous candidate's group."""
    groups: list[list[int]] = []
    for i, token in enumerate(ids.tolist()):
        if token in (vocab.cls_id, vocab.sep_id):
            continue
        if groups and vocab.is_subword[token]:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def assert_whole_words(instances, vocab: Vocab, cfg: InstanceConfig) -> int:
    """Masks are unions of whole words; a word is left out only if it no longer fits (the scan
    skips groups that would exceed n). Returns the number of masked multi-piece words."""
    multi = 0
    for instance in instances:
        ids = original_ids(instance)
        n = num_to_predict(len(ids), cfg)
        masked = set(instance.masked_lm_positions.tolist())
        assert len(masked) <= n
        for group in word_groups(ids, vocab):
            hit = masked.intersection(group)
            assert not hit or len(hit) == len(group), (group, masked)
            if not hit:
                assert len(group) > n - len(masked)
            multi += bool(hit) and len(group) > 1
    return multi


def assert_random_next_share(plans, docs, p: float = 0.5) -> float:
    """Invariant 5: every one-segment chunk is random next, the others by a coin of p (the
    reference's is fair), so P(random) = p + (1 - p) * f1. Random documents come from the whole
    corpus. Returns f1."""
    single = [plan for plan in plans if plan.chunk_segments == 1]
    multi = [plan for plan in plans if plan.chunk_segments > 1]
    f1 = len(single) / len(plans)
    assert all(plan.next_sentence_label == RANDOM_NEXT for plan in single)
    random_multi = sum(plan.next_sentence_label == RANDOM_NEXT for plan in multi)
    assert within(random_multi, len(multi), p), (random_multi, len(multi))
    share = sum(plan.next_sentence_label == RANDOM_NEXT for plan in plans) / len(plans)
    tolerance = SIGMAS * math.sqrt(p * (1 - p) * len(multi)) / len(plans)
    assert abs(share - (p + (1 - p) * f1)) <= tolerance
    randoms = [plan for plan in plans if plan.next_sentence_label == RANDOM_NEXT]
    # never the document itself: all 10 tries failing has probability (1 / len(docs)) ** 10
    assert all(plan.random_doc_index != plan.doc_index for plan in randoms)
    upper_half = sum(plan.random_doc_index >= len(docs) // 2 for plan in randoms)
    assert within(upper_half, len(randoms), 1 - (len(docs) // 2) / len(docs))
    return f1


def assert_segment_coverage(plans, docs, dupe_factor: int) -> None:
    """Invariant 6: in each pass, each segment is in exactly one A or actual-next B of its
    document, and A and B are those segments' tokens before truncation."""
    used = defaultdict(list)
    for p in plans:
        doc = docs[p.doc_index]
        used[(p.pass_index, p.doc_index)].append(p.a_segments)
        np.testing.assert_array_equal(p.tokens_a, np.concatenate(doc[slice(*p.a_segments)]))
        source = doc if p.next_sentence_label == ACTUAL_NEXT else docs[p.random_doc_index]
        np.testing.assert_array_equal(p.tokens_b, np.concatenate(source[slice(*p.b_segments)]))
        if p.next_sentence_label == ACTUAL_NEXT:
            used[(p.pass_index, p.doc_index)].append(p.b_segments)
    assert len(used) == dupe_factor * len(docs)
    for (_, d), ranges in used.items():
        covered = [s for start, end in ranges for s in range(start, end)]
        assert covered == list(range(len(docs[d])))  # once each, in order
