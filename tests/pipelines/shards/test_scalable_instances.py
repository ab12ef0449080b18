"""Scalable mode of pipelines/shards/instances.py: the spec's invariants on the shared books and Wikipedia,
determinism, phase 2 lengths, whole-word masking, errors and corner configurations."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import pytest

from pipelines.shards import instances as inst
from pipelines.shards.instances import (
    InstanceConfig,
    create_instances_scalable,
    fill_random_next,
    finalize_instance,
    finalize_instances,
    plan_document,
)
from tests.pipelines.shards.instance_checks import (
    assert_80_10_10,
    assert_random_next_share,
    assert_segment_coverage,
    assert_structure,
    assert_whole_words,
    books_cfg,
    original_ids,
    scalable_plans,
    word_groups,
)

# ---------------------------------------------------------------------------------------------
# scalable mode: the spec's invariants on the shared books
# ---------------------------------------------------------------------------------------------

def test_splitmix_stream_matches_published_vectors():
    # SplitMix64 seeded with 0 and 1234567 (Vigna's reference splitmix64.c); we keep 53 bits
    assert [int(x * 2 ** 53) for x in inst.uniforms(0, 2)] == [
        0xE220A8397B1DCDAF >> 11, 0x6E789E6AA1B965F4 >> 11]
    assert int(inst.uniforms(1234567, 1)[0] * 2 ** 53) == 6457827717110365317 >> 11
    keys = inst._stream_keys(12345, np.array([0, 3]), np.array([7, 7]), np.array([2, 2]), 1)
    assert keys.tolist() == [inst.stream_key(12345, 0, 7, 2, 1), inst.stream_key(12345, 3, 7, 2, 1)]
    batch = inst._batch_uniforms(keys, np.array([3, 5]))
    np.testing.assert_array_equal(batch, np.concatenate([inst.uniforms(int(keys[0]), 3),
                                                         inst.uniforms(int(keys[1]), 5)]))


def test_truncation_counts_equal_the_reference_loop():
    for max_num_tokens in range(2, 14):
        for len_a in range(1, 16):
            for len_b in range(1, 16):
                a, b = len_a, len_b
                while a + b > max_num_tokens:  # which side the reference trims, step by step
                    if a > b:
                        a -= 1
                    else:
                        b -= 1
                cut_a, cut_b = inst._removals(np.array([len_a]), np.array([len_b]), max_num_tokens)
                assert (cut_a[0], cut_b[0]) == (len_a - a, len_b - b)
                assert inst._removals(len_a, len_b, max_num_tokens) == (len_a - a, len_b - b)


def test_scalable_structure_and_mask_statistics(book_instances, vocab):
    cfg = books_cfg()
    assert len(book_instances) == 6656
    assert_structure(book_instances, vocab, cfg)
    assert assert_80_10_10(book_instances, vocab) == 114_480  # masked positions in all


def test_scalable_random_next_share(book_plans, book_docs):
    f1 = assert_random_next_share(book_plans, book_docs)
    assert 0.05 < f1 < 0.6


def test_scalable_segment_coverage_per_pass(book_plans, book_docs):
    assert_segment_coverage(book_plans, book_docs, dupe_factor=3)


def test_scalable_wikipedia_invariants(shared_data, tokenizer, vocab):
    """Invariants 1-6 on Wikipedia text: SQuAD dev contexts, one document per article."""
    import json

    from pipelines.corpus.sentences import split_sentences

    articles = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    docs = []
    for article in articles["data"][:20]:
        sentences = [s for p in article["paragraphs"] for s in split_sentences(p["context"])]
        encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
        docs.append([np.asarray(e.ids, dtype=np.int32) for e in encodings if e.ids])
    assert len(docs) == 20
    cfg = InstanceConfig(dupe_factor=2)
    plans = scalable_plans(docs, cfg)
    instances = finalize_instances(plans, vocab, cfg)
    assert_structure(instances, vocab, cfg)
    assert assert_80_10_10(instances, vocab) > 15_000
    f1 = assert_random_next_share(plans, docs)
    assert f1 < 0.2  # long articles: chunks rarely hold a single sentence
    assert_segment_coverage(plans, docs, cfg.dupe_factor)


def test_scalable_passes_differ(book_plans, book_instances, book_docs):
    """Invariant 7: the same document gets other splits and masks in another pass."""
    by_doc = defaultdict(lambda: defaultdict(list))
    for p, i in zip(book_plans, book_instances):
        by_doc[p.doc_index][p.pass_index].append(
            (p.a_segments, p.next_sentence_label, tuple(i.masked_lm_positions.tolist())))
    assert len(by_doc) == len(book_docs)
    for passes in by_doc.values():
        # identical (splits, labels, masks) would need every split, coin and mask draw to repeat
        assert passes[0] != passes[1] and passes[1] != passes[2] and passes[0] != passes[2]
    splits_differ = sum([r[0] for r in passes[0]] != [r[0] for r in passes[1]]
                        for passes in by_doc.values())
    assert splits_differ > 0.9 * len(book_docs)  # documents of 8 paragraphs split anew


def test_scalable_is_deterministic_and_batch_independent(book_docs, book_plans, book_instances,
                                                         vocab):
    cfg = books_cfg()
    again = plan_document(book_docs[11], 11, len(book_docs), 2, cfg)
    first = [p for p in book_plans if p.doc_index == 11 and p.pass_index == 2]
    assert [(p.a_segments, p.random_doc_index) for p in again] == \
        [(p.a_segments, p.random_doc_index) for p in first]
    # a different worker layout: other batches, other order
    order = np.random.default_rng(0).permutation(len(book_plans))[:1500]
    shuffled = [book_plans[k] for k in order]
    regrouped = (finalize_instances(shuffled[:7], vocab, cfg)
                 + finalize_instances(shuffled[7:1000], vocab, cfg)
                 + [finalize_instance(p, vocab, cfg) for p in shuffled[1000:]])
    for k, got in zip(order, regrouped):
        want = book_instances[k]
        np.testing.assert_array_equal(got.input_ids, want.input_ids)
        np.testing.assert_array_equal(got.segment_ids, want.segment_ids)
        np.testing.assert_array_equal(got.masked_lm_positions, want.masked_lm_positions)
        np.testing.assert_array_equal(got.masked_lm_ids, want.masked_lm_ids)
    other_seed = finalize_instances(book_plans[:50], vocab, books_cfg(random_seed=1))
    assert sum(np.array_equal(a.input_ids, b.input_ids)
               for a, b in zip(other_seed, book_instances[:50])) < 5


def test_scalable_phase2_lengths(book_docs, vocab):
    cfg = InstanceConfig(max_seq_length=512, max_predictions_per_seq=76, dupe_factor=1)
    instances = create_instances_scalable(book_docs, vocab, cfg)
    assert_structure(instances, vocab, cfg)
    lengths = np.array([len(i.input_ids) for i in instances])
    assert lengths.max() == 512
    masked = np.array([len(i.masked_lm_positions) for i in instances])
    assert masked[lengths == 512].tolist() == [76] * int((lengths == 512).sum())  # 77 capped
    assert masked[lengths == 510].tolist() == [76] * int((lengths == 510).sum())


def test_scalable_whole_word_masking(book_docs, vocab):
    cfg = books_cfg(do_whole_word_mask=True, dupe_factor=1)
    instances = create_instances_scalable(book_docs[:300], vocab, cfg)
    assert_structure(instances, vocab, cfg)
    multi = assert_whole_words(instances, vocab, cfg)
    assert multi == 1208
    # 80/10/10 per wordpiece: some masked words have pieces with different fates
    mixed = 0
    for i in instances:
        ids = original_ids(i)
        masked = set(i.masked_lm_positions.tolist())
        for group in word_groups(ids, vocab):
            if len(group) > 1 and group[0] in masked:
                mixed += len({i.input_ids[g] == vocab.mask_id for g in group}) > 1
    assert mixed == 463
    assert_80_10_10(instances, vocab)


def test_scalable_mlm_only(book_docs, vocab):
    cfg = books_cfg(next_sentence=False, dupe_factor=2)
    plans = scalable_plans(book_docs, cfg)
    assert all(p.tokens_b is None and p.random_doc_index is None for p in plans)
    covered = defaultdict(list)
    for p in plans:  # no put-back: the chunks partition each document in each pass
        covered[(p.pass_index, p.doc_index)] += list(range(*p.a_segments))
    assert all(c == list(range(len(book_docs[d]))) for (_, d), c in covered.items())
    instances = finalize_instances(plans, vocab, cfg)
    assert_structure(instances, vocab, cfg)
    assert {int(i.segment_ids.max()) for i in instances} == {0}
    for plan, batched in zip(plans[:300], instances):  # one at a time: the same instances
        single = finalize_instance(plan, vocab, cfg)
        np.testing.assert_array_equal(single.input_ids, batched.input_ids)
        np.testing.assert_array_equal(single.masked_lm_positions, batched.masked_lm_positions)
    assert max(len(i.input_ids) for i in instances) == 128


def test_scalable_sample_text(sample_docs, vocab):
    cfg = InstanceConfig()
    instances = create_instances_scalable(sample_docs, vocab, cfg)
    assert_structure(instances, vocab, cfg)
    assert len(instances) == len(scalable_plans(sample_docs, cfg))


def test_scalable_errors(vocab):
    cfg = InstanceConfig()
    with pytest.raises(ValueError, match="document 4: .*empty segment"):
        plan_document([np.array([5]), np.array([], dtype=np.int32)], 4, 10, 0, cfg)
    plans = plan_document([np.array([2000, 2001])], 0, 2, 0, cfg)
    assert plans[0].random_doc_index == 1 and plans[0].tokens_b is None
    with pytest.raises(ValueError, match="call fill_random_next first"):
        finalize_instance(plans[0], vocab, cfg)
    actual = dataclasses.replace(plans[0], tokens_b=np.array([7], dtype=np.int32),
                                 random_doc_index=None)
    with pytest.raises(ValueError, match="not a random-next plan"):
        fill_random_next(actual, [np.array([1])], cfg)


@pytest.mark.parametrize("num_docs, max_seq_length, short_seq_prob, masked_lm_prob, wwm, nsp", [
    (1, 16, 0.1, 0.15, False, True),  # one document: random next comes from itself
    (2, 5, 0.5, 0.15, False, True),  # the smallest length
    (7, 7, 1.0, 0.9, True, True),  # more masks wanted than candidates
    (30, 12, 0.0, 0.5, True, False),
    (60, 40, 0.3, 0.15, False, False),
])
def test_scalable_corner_configurations(vocab, num_docs, max_seq_length, short_seq_prob,
                                        masked_lm_prob, wwm, nsp):
    """Random documents (1-30 tokens per segment, 1-12 segments) in corners real text rarely
    reaches; ids from 999 on (real words and ## pieces of bert-base-uncased)."""
    gen = np.random.default_rng(num_docs)
    docs = [[gen.integers(999, vocab.vocab_size, size=gen.integers(1, 31)).astype(np.int32)
             for _ in range(gen.integers(1, 13))] for _ in range(num_docs)]
    cfg = InstanceConfig(max_seq_length=max_seq_length, max_predictions_per_seq=6,
                         short_seq_prob=short_seq_prob, masked_lm_prob=masked_lm_prob,
                         dupe_factor=3, do_whole_word_mask=wwm, next_sentence=nsp)
    plans = scalable_plans(docs, cfg)
    instances = finalize_instances(plans, vocab, cfg)
    assert_structure(instances, vocab, cfg)
    if wwm:
        assert_whole_words(instances, vocab, cfg)
    if nsp:
        assert_segment_coverage(plans, docs, cfg.dupe_factor)
    for plan, batched in zip(plans, instances):
        np.testing.assert_array_equal(finalize_instance(plan, vocab, cfg).input_ids,
                                      batched.input_ids)
