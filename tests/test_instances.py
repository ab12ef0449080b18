"""Pretraining instances (pipelines/shards/instances.py) against the spec's algorithm and invariants.

Real data: the reference sample text and two shared books, tokenized with the bert-base-uncased
vocabulary of the MiniLM checkpoint. Statistical checks use a 4-sigma binomial tolerance
(|count - N p| <= 4 sqrt(N p (1 - p)); a false alarm has probability ~6e-5 per check).
Exactness against BERT's own generator is in test_reference_parity.py.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
from collections import defaultdict

import numpy as np
import pytest

from common.masking import num_to_predict
from common.tokenization import load_tokenizer, read_vocab
from pipelines.corpus.sentences import split_passages
from pipelines.shards import instances as inst
from pipelines.shards.instances import (
    ACTUAL_NEXT,
    NO_NSP,
    RANDOM_NEXT,
    InstanceConfig,
    Vocab,
    create_instances_reference,
    create_instances_scalable,
    fill_random_next,
    finalize_instance,
    finalize_instances,
    plan_document,
    read_reference_text,
)

SIGMAS = 4.0
BOOKS = ("austen-persuasion.txt", "chesterton-brown.txt")
PARAGRAPHS_PER_DOCUMENT = 8


# ---------------------------------------------------------------------------------------------
# fixtures: real text, real vocabulary
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vocab_tokens(minilm_dir) -> list[str]:
    return read_vocab(str(minilm_dir / "vocab.txt"))


@pytest.fixture(scope="module")
def vocab(vocab_tokens) -> Vocab:
    return Vocab.from_tokens(vocab_tokens)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return load_tokenizer(str(minilm_dir / "vocab.txt"))


@pytest.fixture(scope="module")
def sample_docs(shared_data, tokenizer) -> list[list[np.ndarray]]:
    with open(shared_data / "reference" / "sample_text.txt", encoding="utf-8", newline="\n") as f:
        return read_reference_text(f, tokenizer)


@pytest.fixture(scope="module")
def book_docs(shared_data, tokenizer) -> list[list[np.ndarray]]:
    """Two books as documents of 8 paragraphs each, split into sentences (pipelines.corpus.sentences)."""
    docs = []
    for name in BOOKS:
        text = (shared_data / "books" / name).read_text(encoding="utf-8").replace("\r\n", "\n")
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        for k in range(0, len(paragraphs), PARAGRAPHS_PER_DOCUMENT):
            sentences = split_passages(paragraphs[k:k + PARAGRAPHS_PER_DOCUMENT])
            encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
            doc = [np.asarray(e.ids, dtype=np.int32) for e in encodings if e.ids]
            if doc:
                docs.append(doc)
    return docs


def books_cfg(**overrides) -> InstanceConfig:
    return dataclasses.replace(InstanceConfig(dupe_factor=3), **overrides)


def scalable_plans(docs, cfg: InstanceConfig) -> list[inst.InstancePlan]:
    """All passes' plans, random next filled, in (pass, document) order."""
    return [plan for plans in inst.document_plans(docs, cfg) for plan in plans]


@pytest.fixture(scope="module")
def book_plans(book_docs):
    return scalable_plans(book_docs, books_cfg())


@pytest.fixture(scope="module")
def book_instances(book_plans, vocab):
    return finalize_instances(book_plans, vocab, books_cfg())


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


# ---------------------------------------------------------------------------------------------
# configuration, vocabulary, input
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, flag", [
    ("max_seq_length", 4, "--max_seq_length"),
    ("max_predictions_per_seq", 0, "--max_predictions_per_seq"),
    ("masked_lm_prob", 1.5, "--masked_lm_prob"),
    ("short_seq_prob", -0.1, "--short_seq_prob"),
    ("dupe_factor", 0, "--dupe_factor"),
    ("random_seed", -1, "--random_seed"),
])
def test_config_validation_names_the_flag(field, value, flag):
    with pytest.raises(ValueError, match=flag):
        InstanceConfig(**{field: value})


def test_presets():
    from pipelines.shards import config as shards_config

    base = [shards_config.base(phase) for phase in (1, 2)]
    assert [(c.max_seq_length, c.max_predictions_per_seq) for c in base] == [(128, 20), (512, 80)]
    assert [shards_config.tiny(phase).max_seq_length for phase in (1, 2)] == [128, 256]
    assert InstanceConfig().max_num_tokens == 125
    assert InstanceConfig(next_sentence=False).max_num_tokens == 126


def test_mask_counts_of_the_spec():
    cfg = InstanceConfig(max_predictions_per_seq=76)
    assert [num_to_predict(t, cfg) for t in (30, 128, 510, 512)] == [4, 19, 76, 76]
    assert num_to_predict(512, InstanceConfig(max_predictions_per_seq=80)) == 77
    assert num_to_predict(5, cfg) == 1  # round(0.75) = 1, and never 0
    for prob in (0.15, 0.1, 0.2, 0.3, 0.125):  # the vectorised count rounds like Python 3
        c = InstanceConfig(masked_lm_prob=prob, max_predictions_per_seq=80)
        lengths = np.arange(1, 600)
        np.testing.assert_array_equal(num_to_predict(lengths, c),
                                      [num_to_predict(int(t), c) for t in lengths])
    assert round(0.125 * 20) == 2  # half to even (2.5 -> 2): the reference's Python 3 round
    assert num_to_predict(20, InstanceConfig(masked_lm_prob=0.125)) == 2


def test_vocab_from_tokens_keeps_the_reference_word_list():
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "a", "##b"]
    v = Vocab.from_tokens(tokens)
    assert (v.cls_id, v.sep_id, v.mask_id, v.vocab_size) == (2, 3, 4, 8)
    assert v.is_subword.tolist() == [False] * 7 + [True]
    # the reference's vocab_words = keys of its vocab dict (first position, last id)
    assert v.replacement_ids.tolist() == [0, 1, 2, 3, 4, 6, 7]
    with pytest.raises(ValueError, match="MASK"):
        Vocab.from_tokens(["[CLS]", "[SEP]", "a"])


def test_vocab_of_bert_base(vocab, vocab_tokens):
    assert (vocab.cls_id, vocab.sep_id, vocab.mask_id, vocab.vocab_size) == (101, 102, 103, 30522)
    assert int(vocab.is_subword.sum()) == sum(t.startswith("##") for t in vocab_tokens) == 5828
    np.testing.assert_array_equal(vocab.replacement_ids, np.arange(30522))


def test_read_reference_text_documents(tokenizer):
    lines = ["  The cat sat.  \n", "On the mat!\n", "\n", " \t \n", "\x00\x01\n", "\n",
             "Second document\n", "\n", "\n"]
    docs = read_reference_text(lines, tokenizer)
    ids = [[seg.tolist() for seg in doc] for doc in docs]
    expected = [[tokenizer.encode(s, add_special_tokens=False).ids
                 for s in ("The cat sat.", "On the mat!")],
                [tokenizer.encode("Second document", add_special_tokens=False).ids]]
    assert ids == expected  # the control-character line has no tokens: its document is dropped
    assert ids[0][0] == [1996, 4937, 2938, 1012]
    assert all(seg.dtype == np.int32 for doc in docs for seg in doc)


def test_encode_like_reference_corner_cases(tokenizer, vocab_tokens, minilm_dir):
    """Literal special-token text stays words and a final sigma stays final, as the reference's
    tokenizer gives them (test_reference_parity.py checks against it)."""
    text = "A [MASK] of ΣΊΣΥΦΟΣ [SEP]"
    expected = ["a", "[", "mask", "]", "of", "σ", "##ι", "##σ", "##υ", "##φ", "##ος",
                "[", "sep", "]"]
    [ids] = inst.encode_like_reference(tokenizer, [text])  # a copy that splits special tokens
    assert [vocab_tokens[i] for i in ids] == expected
    assert not tokenizer.encode_special_tokens  # the caller's tokenizer is left as it was
    splitting = load_tokenizer(str(minilm_dir / "vocab.txt"), split_special_tokens=True)
    assert inst.splitting_special_tokens(splitting) is splitting  # no copy needed
    [ids] = inst.encode_like_reference(splitting, [text])
    assert [vocab_tokens[i] for i in ids] == expected
    plain = tokenizer.encode("A [MASK] of ΣΊΣΥΦΟΣ", add_special_tokens=False).tokens
    assert plain == ["a", "[MASK]", "of", "σ", "##ι", "##σ", "##υ", "##φ", "##ο", "##σ"]


def test_sample_text_documents(sample_docs, minilm_dir, shared_data):
    from transformers import BertTokenizer  # the slow, pure-Python peer tokenizer

    assert [len(d) for d in sample_docs] == [3, 13, 15]  # non-empty lines between blank lines
    peer = BertTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
    lines = (shared_data / "reference" / "sample_text.txt").read_text(encoding="utf-8").split("\n")
    segments = [peer.convert_tokens_to_ids(peer.tokenize(line.strip())) for line in lines]
    assert [s.tolist() for d in sample_docs for s in d] == [s for s in segments if s]
    assert sum(len(s) for d in sample_docs for s in d) == 1019


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


def assert_random_next_share(plans, docs) -> float:
    """Invariant 5: every one-segment chunk is random next, the others are by a fair coin, so
    P(random) = 0.5 + 0.5 * f1. Random documents come from the whole corpus. Returns f1."""
    single = [p for p in plans if p.chunk_segments == 1]
    multi = [p for p in plans if p.chunk_segments > 1]
    f1 = len(single) / len(plans)
    assert all(p.next_sentence_label == RANDOM_NEXT for p in single)
    random_multi = sum(p.next_sentence_label == RANDOM_NEXT for p in multi)
    assert within(random_multi, len(multi), 0.5), (random_multi, len(multi))
    share = sum(p.next_sentence_label == RANDOM_NEXT for p in plans) / len(plans)
    tolerance = SIGMAS * math.sqrt(0.25 * len(multi)) / len(plans)
    assert abs(share - (0.5 + 0.5 * f1)) <= tolerance
    randoms = [p for p in plans if p.next_sentence_label == RANDOM_NEXT]
    # never the document itself: all 10 tries failing has probability (1 / len(docs)) ** 10
    assert all(p.random_doc_index != p.doc_index for p in randoms)
    upper_half = sum(p.random_doc_index >= len(docs) // 2 for p in randoms)
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
