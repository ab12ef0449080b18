"""Packed rows and the attention plan: position ids, per-instance attention, the row-mask fallback,
the loader's batch layout."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from common import shard_format
from model.attention import (
    attend_instances,
    attention_mask_4d,
    attention_plan,
    instance_ids,
    packed_position_ids,
    split_heads,
)
from tests.model.tiny_models import instance, pack, pretraining_model, shard_row


def test_packed_position_ids_match_the_shard_format():
    seq = np.array([0, 0, 0, 1, 1, 2, 2, 2, 2, 3], np.uint8)
    expected = shard_format.position_ids(seq)
    assert expected.tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3, 0]
    padded = torch.tensor([seq.tolist() + [-1, -1]])
    assert packed_position_ids(padded)[0, :10].tolist() == expected.tolist()


def test_dense_batches_pass_no_mask_to_sdpa():
    ids = torch.ones(2, 5, dtype=torch.long)
    assert attention_mask_4d(instance_ids(None, None, ids)) is None
    assert attention_mask_4d(instance_ids(torch.ones(2, 5), torch.zeros(2, 5), ids)) is None
    mask = attention_mask_4d(instance_ids(torch.tensor([[1, 1, 0]]), torch.tensor([[0, 1, 0]]),
                                          ids[:1, :3]))
    assert mask[0, 0].tolist() == [[True, False, False], [False, True, False],
                                   [False, False, True]]


def test_packed_row_equals_instances_computed_alone():
    model = pretraining_model()
    a, b = instance(11, 4, seed=3), instance(8, 2, seed=4)
    # masked positions: A at 2, 5, 9; B at 1, 6 (row-relative 12, 17 in the packed row)
    masked_a, masked_b = torch.tensor([2, 5, 9]), torch.tensor([1, 6])
    labels_a, labels_b = torch.tensor([17, 42, 99]), torch.tensor([7, 500])
    nsp = torch.tensor([1, 0])

    row = pack([a, b], length=22)
    packed = model(**{k: v[None] for k, v in row.items()},
                   masked_lm_positions=torch.cat([masked_a, masked_b + 11, torch.tensor([0])])[None],
                   masked_lm_ids=torch.cat([labels_a, labels_b, torch.tensor([-100])])[None],
                   next_sentence_label=torch.tensor([[1, 0, -100]]))
    hidden = model.bert(**{k: v[None] for k, v in row.items()})

    unpacked = model(input_ids=torch.stack([a["input_ids"], F.pad(b["input_ids"], (0, 3))]),
                     token_type_ids=torch.stack([a["token_type_ids"],
                                                 F.pad(b["token_type_ids"], (0, 3))]),
                     attention_mask=torch.tensor([[1] * 11, [1] * 8 + [0] * 3]),
                     masked_lm_positions=torch.stack([masked_a, F.pad(masked_b, (0, 1))]),
                     masked_lm_ids=torch.stack([labels_a, F.pad(labels_b, (0, 1), value=-100)]),
                     next_sentence_label=nsp)
    for inst, start in [(a, 0), (b, 11)]:
        n = len(inst["input_ids"])
        alone = model.bert(inst["input_ids"][None], inst["token_type_ids"][None])
        torch.testing.assert_close(hidden[0, start:start + n], alone[0])

    torch.testing.assert_close(packed.mlm_logits[0, :3], unpacked.mlm_logits[0])
    torch.testing.assert_close(packed.mlm_logits[0, 3:5], unpacked.mlm_logits[1, :2])
    torch.testing.assert_close(packed.nsp_logits[0, :2], unpacked.nsp_logits)
    for name in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(getattr(packed, name), getattr(unpacked, name))
    assert (packed.mlm_count.item(), packed.nsp_count.item()) == (5, 2)
    assert (unpacked.mlm_count.item(), unpacked.nsp_count.item()) == (5, 2)

    # gradients too: the packed row trains the model exactly as the two instances do
    grads = []
    for out in (packed, unpacked):
        model.zero_grad()
        out.loss.backward(retain_graph=True)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], msg=name)


def test_attention_plan_groups_instances_by_length_bucket():
    ids = torch.tensor([[0, 0, 0, 1, 1, -1, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    plan = attention_plan(ids, bucket=4)
    short, full = plan.groups  # lengths 3 and 2 share the bucket of 4; the full row is alone
    assert short.index.tolist() == [[0, 1, 2], [3, 4, 3]]  # the slot past B's end repeats its start
    assert short.real.tolist() == [[True, True, True], [True, True, False]]
    assert short.key_mask.shape == (2, 1, 1, 3)
    assert full.index.tolist() == [list(range(8, 16))] and full.key_mask is None
    assert plan.token_index.tolist() == [0, 1, 2, 3, 4, *range(8, 16)]
    assert attention_plan(torch.zeros(2, 8, dtype=torch.long)) is None  # dense: no plan
    assert attention_plan(None) is None


def test_attention_per_instance_equals_the_block_diagonal_mask():
    torch.manual_seed(0)
    ids = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, -1, -1, 2, 2, 2, 2, 2, 2],
                        [-1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])
    qkv = torch.randn(2, 16, 3 * 8, dtype=torch.float64)  # A = 2 heads of D = 4
    per_instance = attend_instances(qkv, attention_plan(ids, bucket=4), num_heads=2,
                                    dropout_p=0.0)
    q, k, v = split_heads(qkv, 2)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask_4d(ids))
    masked = masked.transpose(1, 2).reshape(2, 16, 8)  # (B, A, T, D) -> (B, T, H)
    real = ids >= 0
    torch.testing.assert_close(per_instance[real], masked[real])
    assert (per_instance[~real] == 0).all()  # padding gets no attention output


def test_dropout_in_training_stays_within_each_instance():
    """With dropout on, changing instance B's tokens leaves A's states exactly as they were."""
    model = pretraining_model().bert.train()
    a, b = instance(11, 4, seed=20), instance(8, 2, seed=21)
    other_b = instance(8, 3, seed=22)
    states = []
    for second, seed in [(b, 0), (other_b, 0), (b, 1)]:
        row = {k: v[None] for k, v in pack([a, second], length=24).items()}
        torch.manual_seed(seed)
        states.append(model(**row)[0, :11])
    assert torch.equal(states[0], states[1])
    assert not torch.allclose(states[0], states[2])  # dropout is really on: another seed differs


def test_padding_inside_a_row_falls_back_to_the_row_mask():
    """An attention mask with a hole (padding inside an instance) cannot be split into runs:
    the model masks whole rows instead, and the real tokens get the states they have without
    the hole (same tokens, same positions)."""
    ids = torch.tensor([[0, 0, 1, 1], [0, 0, -1, 0]])  # row 1: padding inside instance 0
    assert attention_plan(ids) is None
    model = pretraining_model().bert
    one = instance(9, 3, seed=30)
    holed = {k: torch.cat([v[:5], torch.zeros(2, dtype=v.dtype), v[5:]])[None]
             for k, v in one.items()}
    mask = torch.ones(1, 11, dtype=torch.long)
    mask[0, 5:7] = 0
    positions = torch.cat([torch.arange(5), torch.zeros(2, dtype=torch.long),
                           torch.arange(5, 9)])[None]
    with torch.no_grad():
        with_hole = model(**holed, attention_mask=mask, position_ids=positions)
        compact = model(**{k: v[None] for k, v in one.items()})
    torch.testing.assert_close(with_hole[mask.bool()], compact[0])


def test_the_loaders_batch_layout_gives_the_forward_it_would_make_itself():
    """collate works out the attention plan on the host (`BatchLayout`); the forward with it
    equals the forward that makes its own, also after the layout's move to a device."""
    from training.batching import collate

    model = pretraining_model()
    packed = collate([shard_row([9, 12], seed=1), shard_row([7], seed=2)])
    dense = collate([shard_row([16], seed=3), shard_row([16], seed=4)])
    assert packed["layout"].masked and len(packed["layout"].plan.groups) == 1
    assert not dense["layout"].masked and dense["layout"].plan is None
    for batch in (packed, dense):
        inputs = {k: v for k, v in batch.items() if k != "layout"}
        own = model(**inputs)
        for layout in (batch["layout"], batch["layout"].to("cpu", non_blocking=True)):
            given = model(**inputs, layout=layout)
            assert torch.equal(given.mlm_logits, own.mlm_logits)
            assert torch.equal(given.nsp_logits, own.nsp_logits)
    # The forward does use the layout it is given: the dense one lets the packed rows' instances
    # (and padding) attend to each other.
    inputs = {k: v for k, v in packed.items() if k != "layout"}
    assert not torch.equal(model(**inputs, layout=dense["layout"]).mlm_logits,
                           model(**inputs).mlm_logits)
