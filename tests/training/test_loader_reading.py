"""The shard loader's rows: dynamic masking, the collate of packed rows, corrupt members and short
manifests named, worker errors, the remasker, the shuffle buffer."""

from __future__ import annotations

import collections
import dataclasses
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from common import shard_format
from model.heads import IGNORE_INDEX
from tests.training.loader_shards import SEQ, _row_key, _shards, layout_tensors
from training.batching import collate
from training.loader import LoaderConfig, ShardLoader
from training.remasking import Remasker
from training.shard_trust import list_shards


def test_dynamic_masking_redraws_per_epoch_and_keeps_the_text(books):
    vocab_dir, rows = books
    remasker = Remasker.from_vocab(str(vocab_dir), seed=4)
    assert (remasker.mask_id, remasker.special_ids) == (4, (2, 3, 0))  # [MASK]; [CLS] [SEP] [PAD]
    from training.remasking import KeyedRow
    changed, kinds = 0, collections.Counter()
    for i, row in enumerate(rows[:400]):
        keyed = KeyedRow(row, "train-000000.tar", "000000-000000", i)
        original = row.input_ids.astype(np.int64).copy()
        original[row.masked_lm_positions] = row.masked_lm_ids
        e0, e0_again, e1 = remasker(keyed, 0), remasker(keyed, 0), remasker(keyed, 1)
        assert np.array_equal(e0.input_ids, e0_again.input_ids)
        for new in (e0, e1):
            restored = new.input_ids.copy()
            restored[new.masked_lm_positions] = new.masked_lm_ids
            assert np.array_equal(restored, original)
            assert len(new.masked_lm_positions) == len(row.masked_lm_positions)
            assert not np.isin(original[new.masked_lm_positions], remasker.special_ids).any()
        changed += not np.array_equal(e0.masked_lm_positions, e1.masked_lm_positions)
        at = e0.input_ids[e0.masked_lm_positions]
        kinds.update(np.where(at == 4, "mask", np.where(at == e0.masked_lm_ids, "keep", "random")))
    assert changed >= 395
    total = sum(kinds.values())
    assert abs(kinds["mask"] / total - 0.8) < 0.02
    assert abs(kinds["keep"] / total - 0.1) < 0.02  # a random draw equal to the original counts here


def test_collate_pads_packed_rows():
    packed = shard_format.Row(
        input_ids=np.array([2, 7, 4, 3, 9, 3, 2, 8, 3, 5, 3]),
        segment_ids=np.array([0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1], np.uint8),
        sequence_ids=np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1], np.uint8),
        masked_lm_positions=np.array([2, 7]), masked_lm_ids=np.array([11, 12]),
        next_sentence_labels=np.array([1, 0], np.int8))
    single = shard_format.Row(np.array([2, 4, 3]), np.zeros(3, np.uint8), np.zeros(3, np.uint8),
                              np.array([1]), np.array([13]), np.array([-1], np.int8))
    batch = collate([packed, single])
    assert batch["input_ids"].shape == (2, 16)
    assert batch["position_ids"][0, :12].tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 0]
    assert batch["sequence_ids"][1].tolist() == [0, 0, 0] + [-1] * 13
    assert batch["attention_mask"].sum(1).tolist() == [11, 3]
    assert batch["masked_lm_positions"].tolist() == [[2, 7], [1, 0]]
    assert batch["masked_lm_ids"].tolist() == [[11, 12], [13, -100]]
    assert batch["next_sentence_label"].tolist() == [[1, 0], [-1, -100]]
    assert batch["cls_positions"].tolist() == [[0, 6], [0, 0]]
    layout = batch.pop("layout")
    assert all(t.dtype == torch.int64 for t in batch.values())
    # Instances of 6, 5 and 3 tokens at flat offsets 0, 6 and 16 (row 1 starts at 16): one
    # length bucket, each slot past an instance's end repeating its first token.
    assert layout_tensors(layout) == (True, [(
        [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 6], [16, 17, 18, 16, 16, 16]],
        [[True] * 6, [True] * 5 + [False], [True] * 3 + [False] * 3])],
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 17, 18])
    # For a GPU the same batch without the plan: it attends over whole rows under a mask.
    gpu = collate([packed, single], attention_plan=False)
    assert (gpu["layout"].plan, gpu["layout"].masked) == (None, True)
    assert all(torch.equal(gpu[name], batch[name]) for name in batch)


def test_corrupt_member_names_the_shard_and_member(books, tmp_path):
    folder = _shards(books, tmp_path / "s", [16, 16])
    bad = folder / "train-000001.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("000001-000000.rows.npz")
        info.size = 5
        tar.addfile(info, fileobj=__import__("io").BytesIO(b"notnp"))
    loader = ShardLoader(LoaderConfig(str(folder), 4, SEQ, shuffle_buffer=0))
    with pytest.raises(ValueError, match=r"train-000001\.tar: member 000001-000000: cannot decode"):
        for _ in loader:
            pass


def test_manifest_lists_shards_and_checks_the_sequence_length(books, tmp_path):
    folder = _shards(books, tmp_path / "s", [16, 24], validation=[8])
    shards, _ = list_shards(str(folder), "train")
    assert [(s.name, s.num_rows) for s in shards] == [("train-000000.tar", 16),
                                                      ("train-000001.tar", 24)]
    with pytest.raises(ValueError, match="shards have max_seq_length 128, the phase wants 512"):
        ShardLoader(LoaderConfig(str(folder), 4, 512))
    with pytest.raises(FileNotFoundError, match="cannot read the shard manifest"):
        ShardLoader(LoaderConfig(str(tmp_path / "missing"), 4, SEQ))


def test_a_manifest_promising_more_rows_than_the_shards_hold_fails_loudly(books, tmp_path):
    """A rank running short would hang the others: raise instead, naming the shards."""
    folder = _shards(books, tmp_path / "s", [16, 16])
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["shards"][1]["num_rows"] = 24
    (folder / "manifest.json").write_text(json.dumps(manifest))
    loader = ShardLoader(LoaderConfig(str(folder), 4, SEQ, shuffle_buffer=0))
    assert loader.batches_per_epoch() == 10
    with pytest.raises(ValueError, match=r"hold 32 rows, their manifest promises at least 40"):
        for _ in loader:
            pass


def test_worker_errors_keep_our_message_and_library_tracebacks(tmp_path):
    """torch re-raises a loader worker's error with the worker's traceback as its message: our
    checks' errors get their own message back (one line for the user); a library's error is
    left as it is, traceback and all (it is a bug)."""
    from torch._utils import ExceptionWrapper

    from training.loader import _without_worker_traceback
    from training.shard_trust import ShardInfo, check_shard_files

    def as_from_a_worker(fn):
        try:
            fn()
        except Exception:  # noqa: BLE001 (what a worker does with any error)
            wrapped = ExceptionWrapper(where="in DataLoader worker process 0")
        try:
            wrapped.reraise()
        except Exception as e:  # noqa: BLE001
            return e
        raise AssertionError("not raised")

    shard = tmp_path / "train-000000.tar"
    shard.write_bytes(b"x" * 10)
    ours = as_from_a_worker(lambda: check_shard_files([ShardInfo(shard.name, str(shard), 1, 0, 99)]))
    assert "Original Traceback" in str(ours)
    clean = _without_worker_traceback(ours)
    assert type(clean) is ValueError and str(clean) == (
        f"{shard}: 10 bytes, the manifest records 99: truncated or replaced; check the folder "
        "with `python -m pipelines.verify_shards <folder>`")
    library = as_from_a_worker(lambda: json.loads("{"))
    assert _without_worker_traceback(library) is library


def _epochs(loader: ShardLoader, count: int) -> list[list[dict]]:
    """The batches of the loader's first `count` epochs, epoch by epoch."""
    epochs: list[list[dict]] = [[] for _ in range(count)]
    for batch in loader:
        if loader.epoch >= count:
            break
        epochs[loader.epoch].append(batch)
    return epochs


def _masked_rows(batches: list[dict]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(input ids, masked positions, their labels) of every row, padding dropped."""
    rows = []
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            n = int(batch["attention_mask"][i].sum())
            real = batch["masked_lm_ids"][i] != IGNORE_INDEX
            rows.append((batch["input_ids"][i, :n].numpy(),
                         batch["masked_lm_positions"][i][real].numpy(),
                         batch["masked_lm_ids"][i][real].numpy()))
    return rows


# Measured once (books rows 0..63, Remasker seed 9): rows whose masked positions differ
# between epoch 0 and epoch 1, and rows whose epoch-0 positions differ from the shard's.
REMASKED_BETWEEN_EPOCHS = 64


REMASKED_VS_SHARD = 64


def test_loader_with_a_remasker_redraws_masks_each_epoch_and_keeps_the_text(books, tmp_path):
    """One shard read in order for 2 epochs with dynamic masking: every row gets new masks each
    epoch (its count of masked positions kept), the same again on a rerun, and putting the
    labels back at the masked positions gives the shard's original token ids."""
    vocab_dir, rows = books
    folder = _shards(books, tmp_path / "s", [64])
    remasker = Remasker.from_vocab(str(vocab_dir), seed=9)
    config = LoaderConfig(str(folder), 8, SEQ, seed=9, shuffle_buffer=0, remasker=remasker)
    epochs = [_masked_rows(e) for e in _epochs(ShardLoader(config), 2)]
    rerun = [_masked_rows(e) for e in _epochs(ShardLoader(config), 2)]
    assert [len(e) for e in epochs] == [64, 64]
    shard = rows[:64]
    for epoch in epochs:
        for (ids, positions, labels), row in zip(epoch, shard):
            original = row.input_ids.astype(np.int64).copy()
            original[row.masked_lm_positions] = row.masked_lm_ids
            restored = ids.copy()
            restored[positions] = labels
            assert np.array_equal(restored, original)
            assert len(positions) == len(row.masked_lm_positions)
    changed = sum(not np.array_equal(a[1], b[1]) for a, b in zip(*epochs))
    assert changed == REMASKED_BETWEEN_EPOCHS
    assert sum(not np.array_equal(got[1], row.masked_lm_positions)
               for got, row in zip(epochs[0], shard)) == REMASKED_VS_SHARD
    for epoch, again in zip(epochs, rerun):
        for a, b in zip(epoch, again):
            assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_pretraining_reads_training_rows_with_dynamic_masking_and_validation_rows_without(
        books, tmp_path):
    """training/pretrain.py's `build_loader`: with data.dynamic_masking the training loader re-masks
    (seeded by the run's seed), the validation loader keeps the shards' masks; without it
    neither re-masks."""
    from training import pretrain
    from training.config import PhaseConfig, PretrainConfig, PretrainDataConfig

    vocab_dir, _ = books
    folder = _shards(books, tmp_path / "s", [32], validation=[16])
    phase = PhaseConfig(train_shards=str(folder), max_seq_length=SEQ, micro_batch_size=8,
                        global_batch_size=8, steps=4, warmup_steps=0)
    data = PretrainDataConfig(vocab_dir=str(vocab_dir), dynamic_masking=True, shuffle_buffer=0,
                              num_workers=0)
    config = PretrainConfig(data=data, phases=(phase,), seed=9)
    dist = pretrain.Dist(rank=0, world_size=1, on_gpu=False)
    train = pretrain.build_loader(config, phase, dist)
    assert train == LoaderConfig(str(folder), 8, SEQ, seed=9, shuffle_buffer=0, split="train",
                                 remasker=Remasker.from_vocab(str(vocab_dir), seed=9))
    validation = pretrain.build_loader(config, phase, dist, validation=True)
    assert (validation.split, validation.remasker) == ("validation", None)
    static = dataclasses.replace(config, data=dataclasses.replace(data, dynamic_masking=False))
    assert pretrain.build_loader(static, phase, dist).remasker is None


def _row_order(folder: Path, shuffle_buffer: int, seed: int = 3) -> list[list[tuple]]:
    """Rows (as token-id tuples) of the first 2 epochs of a 1-rank loader, in reading order."""
    config = LoaderConfig(str(folder), 8, SEQ, seed=seed, shuffle_buffer=shuffle_buffer)
    return [[_row_key(batch, i) for batch in epoch for i in range(batch["input_ids"].shape[0])]
            for epoch in _epochs(ShardLoader(config), 2)]


def test_shuffle_buffer_reorders_rows_each_epoch_and_zero_keeps_the_shard_order(books, tmp_path):
    """One shard: a 16-row shuffle buffer gives each epoch its own order of the shard's rows (the
    same for the same seed); no buffer reads them in shard order every epoch."""
    folder = _shards(books, tmp_path / "s", [64])
    shard_order = [tuple(r.input_ids.tolist()) for r in books[1][:64]]
    assert len(set(shard_order)) == 64
    epoch0, epoch1 = _row_order(folder, 16)
    assert sorted(epoch0) == sorted(epoch1) == sorted(shard_order)
    assert epoch0 != shard_order, "epoch 0 read the shard in order: the rows were not shuffled"
    assert epoch1 != shard_order, "epoch 1 read the shard in order: the rows were not shuffled"
    assert epoch0 != epoch1, "epochs 0 and 1 read the rows in the same order"
    assert _row_order(folder, 16) == [epoch0, epoch1]
    assert _row_order(folder, 16, seed=4)[0] != epoch0
    assert _row_order(folder, 0) == [shard_order, shard_order]
