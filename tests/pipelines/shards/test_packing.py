"""Packing, the columnar instance batch, shuffle keys and balanced shard assignment."""
from __future__ import annotations

import numpy as np
import pytest

from common import shard_format
from common.tokenization import load_tokenizer, read_vocab
from pipelines.shards import packing, shard_files
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_scalable,
    read_reference_text,
)


def test_pack_lengths_best_fit_decreasing_exact():
    lengths = [100, 60, 50, 30, 28, 20, 128, 5]
    # Longest first: 128 alone; 100 opens a row (28 free); 60 opens one (68 free); 50 -> the
    # 68 row (18 free); 30 opens one (98 free); 28 fills the 100 row exactly; 20 -> the 98 row;
    # 5 -> the tightest fit, the row with 18 free.
    rows = packing.pack_lengths(lengths, 128)
    assert rows == [[0, 4], [1, 2, 7], [3, 5], [6]]
    assert packing.padding_share(lengths, rows, 128) == 1 - 421 / 512
    assert packing.padding_share(lengths, packing.unpacked_rows(8), 128) == 1 - 421 / 1024


def test_pack_lengths_rejects_too_long_and_handles_empty():
    with pytest.raises(ValueError, match="128"):
        packing.pack_lengths([129], 128)
    assert packing.pack_lengths([], 128) == []


def _batch(instances) -> packing.InstanceBatch:
    n = len(instances)
    return packing.InstanceBatch.from_instances(
        instances, packing.shuffle_keys(1, np.arange(n), np.zeros(n), np.zeros(n)),
        np.arange(n), np.zeros(n), np.zeros(n))


@pytest.fixture(scope="module")
def book_instances(shared_data, minilm_dir):
    """Real instances from the start of two books (one sentence per line, paragraph = document)."""
    lines = []
    for name in ("austen-emma.txt", "melville-moby_dick.txt"):
        text = (shared_data / "books" / name).read_bytes().decode("utf-8", "replace")
        lines += text.replace("\r\n", "\n").split("\n")[:1500]
    docs = read_reference_text(lines, load_tokenizer(str(minilm_dir)))
    vocab = Vocab.from_tokens(read_vocab(str(minilm_dir)))
    return {L: create_instances_scalable(docs, vocab, InstanceConfig(
        max_seq_length=L, max_predictions_per_seq=20 if L == 128 else 76, dupe_factor=1))
        for L in (128, 512)}


@pytest.mark.parametrize("max_seq_length", [128, 512])
def test_packing_real_instances(book_instances, max_seq_length):
    instances = book_instances[max_seq_length]
    batch = _batch(instances).shuffled()
    rows_idx = packing.pack_lengths(batch.lengths, max_seq_length)
    order, sizes = packing.rows_order(rows_idx)
    assert sorted(order.tolist()) == list(range(len(batch)))  # every instance exactly once
    rows = packing.to_rows(batch.take(order), sizes)
    assert max(len(r.input_ids) for r in rows) <= max_seq_length
    packed = packing.padding_share(batch.lengths, rows_idx, max_seq_length)
    unpacked = packing.padding_share(batch.lengths, packing.unpacked_rows(len(batch)),
                                     max_seq_length)
    assert packed < unpacked
    # Each instance comes back whole from its row: tokens, segments, masks and its label.
    by_tokens = {tuple(i.input_ids.tolist()): i for i in instances}
    seen = 0
    for row in rows:
        pos = shard_format.position_ids(row.sequence_ids)
        for k in range(len(row.next_sentence_labels)):
            where = np.flatnonzero(row.sequence_ids == k)
            assert pos[where].tolist() == list(range(len(where)))
            inst = by_tokens[tuple(row.input_ids[where].tolist())]
            np.testing.assert_array_equal(row.segment_ids[where], inst.segment_ids)
            in_k = (row.masked_lm_positions >= where[0]) & (row.masked_lm_positions <= where[-1])
            np.testing.assert_array_equal(row.masked_lm_positions[in_k] - where[0],
                                          inst.masked_lm_positions)
            np.testing.assert_array_equal(row.masked_lm_ids[in_k], inst.masked_lm_ids)
            assert row.next_sentence_labels[k] == inst.next_sentence_label
            seen += 1
    assert seen == len(instances)


def test_packed_row_layout_exact():
    inst = [
        _Inst([101, 7, 102, 8, 102], [0, 0, 0, 1, 1], [1, 3], [70, 80], 1),
        _Inst([101, 9, 102, 10, 11, 102], [0, 0, 0, 1, 1, 1], [4], [11], 0),
    ]
    batch = _batch(inst)
    (row,) = packing.to_rows(batch, np.array([2]))
    assert row.input_ids.tolist() == [101, 7, 102, 8, 102, 101, 9, 102, 10, 11, 102]
    assert row.sequence_ids.tolist() == [0] * 5 + [1] * 6
    assert row.masked_lm_positions.tolist() == [1, 3, 9]
    assert row.masked_lm_ids.tolist() == [70, 80, 11]
    assert row.next_sentence_labels.tolist() == [1, 0]
    assert shard_format.position_ids(row.sequence_ids).tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5]


class _Inst:
    def __init__(self, ids, seg, pos, mids, label):
        self.input_ids, self.segment_ids = np.array(ids), np.array(seg)
        self.masked_lm_positions, self.masked_lm_ids = np.array(pos), np.array(mids)
        self.next_sentence_label = label


def test_batch_take_concat_and_shuffle_are_consistent():
    inst = [_Inst([101, i, 102, i + 1, 102], [0, 0, 0, 1, 1], [1], [i], i % 2) for i in range(20)]
    batch = _batch(inst)
    halves = packing.InstanceBatch.concat([batch.take(np.arange(10, 20)),
                                           batch.take(np.arange(10))])
    a, b = batch.shuffled(), halves.shuffled()
    for name in ("keys", "input_ids", "masked_lm_ids", "next_sentence_labels", "lengths"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert sorted(a.input_ids[1::5].tolist()) == list(range(20))
    assert a.input_ids[1::5].tolist() != list(range(20))  # shuffled


def test_shuffle_keys_deterministic_and_distinct():
    doc, pas, ins = np.meshgrid(np.arange(50), np.arange(4), np.arange(10), indexing="ij")
    keys = packing.shuffle_keys(12345, doc.ravel(), pas.ravel(), ins.ravel())
    assert len(np.unique(keys)) == keys.size == 2000
    again = packing.shuffle_keys(12345, doc.ravel(), pas.ravel(), ins.ravel())
    np.testing.assert_array_equal(keys, again)
    assert not np.array_equal(keys, packing.shuffle_keys(1, doc.ravel(), pas.ravel(), ins.ravel()))


def test_round_robin_balance_and_shard_count():
    shard, pos = shard_files.assign_round_robin(np.arange(10), 4)
    assert np.bincount(shard).tolist() == [3, 3, 2, 2]  # balanced to within one row
    assert shard.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert pos.tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert shard_files.choose_num_shards(0, 0, 100) == 0
    assert shard_files.choose_num_shards(1000, 250, 100) == 3
    assert shard_files.choose_num_shards(5, 10 ** 9, 100) == 5  # never more shards than rows
    assert shard_files.choose_num_shards(1000, 250, 100, num_shards=7) == 7


@pytest.mark.parametrize("rows_per_block", [1, 7, 128])
def test_columnar_blocks_equal_encode_block_on_rows(book_instances, rows_per_block):
    batch = _batch(book_instances[128]).shuffled()
    order, sizes = packing.rows_order(packing.pack_lengths(batch.lengths, 128))
    batch = batch.take(order)
    rows = packing.to_rows(batch, sizes)
    want = [shard_format.encode_block(rows[i:i + rows_per_block], 30522)
            for i in range(0, len(rows), rows_per_block)]
    assert list(packing.encode_blocks(batch, sizes, rows_per_block, 30522)) == want
