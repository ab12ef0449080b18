"""Tiny BERT models and hand-made instances shared by the model tests."""

from __future__ import annotations

import numpy as np
import torch

from common import shard_format
from model.bert import BertConfig, bert_tiny
from model.heads import BertForPreTraining

VOCAB = 1000


def tiny(**changes) -> BertConfig:
    return bert_tiny(vocab_size=VOCAB, **changes)


def pretraining_model(seed: int = 0, next_sentence: bool = True) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(tiny(), next_sentence=next_sentence).eval()
    with torch.no_grad():  # non-zero biases, so that a mix-up of positions or heads shows
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0, 0.1)
    return model


def instance(length: int, len_a: int, seed: int) -> dict[str, torch.Tensor]:
    """One unpacked instance: [CLS] A [SEP] B [SEP] token types, random ids."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (length,), generator=g)
    ids[0], ids[len_a + 1], ids[-1] = 2, 3, 3
    types = torch.zeros(length, dtype=torch.long)
    types[len_a + 2:] = 1
    return {"input_ids": ids, "token_type_ids": types}


def pack(instances: list[dict], length: int) -> dict[str, torch.Tensor]:
    """One packed row of `instances` padded to `length`, as the shard loader collates it."""
    row = {"input_ids": torch.zeros(length, dtype=torch.long),
           "token_type_ids": torch.zeros(length, dtype=torch.long),
           "attention_mask": torch.zeros(length, dtype=torch.long),
           "sequence_ids": torch.full((length,), -1, dtype=torch.long)}
    start = 0
    for k, inst in enumerate(instances):
        n = len(inst["input_ids"])
        row["input_ids"][start:start + n] = inst["input_ids"]
        row["token_type_ids"][start:start + n] = inst["token_type_ids"]
        row["attention_mask"][start:start + n] = 1
        row["sequence_ids"][start:start + n] = k
        start += n
    return row


def shard_row(lengths: list[int], seed: int) -> shard_format.Row:
    """A shard row holding instances of `lengths` tokens, two masked positions."""
    g = np.random.default_rng(seed)
    n = sum(lengths)
    return shard_format.Row(
        input_ids=g.integers(5, VOCAB, n), segment_ids=np.zeros(n, np.uint8),
        sequence_ids=np.repeat(np.arange(len(lengths)), lengths).astype(np.uint8),
        masked_lm_positions=np.array([1, n - 2]), masked_lm_ids=g.integers(5, VOCAB, 2),
        next_sentence_labels=np.zeros(len(lengths), np.int8))
