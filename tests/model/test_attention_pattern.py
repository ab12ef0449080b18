"""The attention pattern (model/attention.py `AttentionPattern`): what the encoder asks instead of
its objective: the row mask and the token each instance is summarised by."""

from __future__ import annotations

import torch

from model.attention import AttentionPattern, BatchLayout
from model.bert import BertModel, bert_tiny

CPU = torch.device("cpu")
SEQUENCE_IDS = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 0, 0]])  # (B=2, T=6)


def test_summary_positions_are_the_cls_or_under_causal_attention_the_last_token():
    both, causal = AttentionPattern(), AttentionPattern(causal=True)
    cls = torch.tensor([[0, 3], [0, 5]])  # row 1 has no second instance: padding position
    assert both.summary_positions(cls, SEQUENCE_IDS, 2, 6, CPU).tolist() == [[0, 3], [0, 5]]
    assert both.summary_positions(None, SEQUENCE_IDS, 2, 6, CPU).tolist() == [[0], [0]]
    assert causal.summary_positions(cls, SEQUENCE_IDS, 2, 6, CPU).tolist() == [[2, 4], [5, 0]]
    assert causal.summary_positions(None, None, 2, 6, CPU).tolist() == [[5], [5]]


def test_row_masks_and_layouts_of_the_two_patterns():
    ids = torch.tensor([[0, 0, 1]])
    assert AttentionPattern().row_mask(ids, None, 3, CPU)[0, 0].tolist() == [
        [True, True, False], [True, True, False], [False, False, True]]
    assert AttentionPattern(causal=True).row_mask(ids, None, 3, CPU)[0, 0].tolist() == [
        [True, False, False], [True, True, False], [False, False, True]]
    given = BatchLayout(None, masked=False)
    assert AttentionPattern().layout(given) is given
    assert AttentionPattern(causal=True).layout(given) == BatchLayout(None, masked=True)


def test_the_encoder_takes_its_pattern_from_the_config():
    assert BertModel(bert_tiny(vocab_size=50)).pattern == AttentionPattern(causal=False)
    assert BertModel(bert_tiny(vocab_size=50, is_decoder=True)).pattern == \
        AttentionPattern(causal=True)
