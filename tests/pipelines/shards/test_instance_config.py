"""Pretraining instances (pipelines/shards/instances.py): configuration, vocabulary and input documents."""

from __future__ import annotations

import numpy as np
import pytest

from common.masking import num_to_predict
from common.tokenization import load_tokenizer
from pipelines.shards import instances as inst
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    read_reference_text,
)

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
