"""The shard loader on real shards of the books corpus: rank/worker splits, equal per-rank
counts with uneven shards, exact resume, remote sources, dynamic re-masking, collation."""
from __future__ import annotations

import collections
import dataclasses
import functools
import http.server
import json
import logging
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelines import shard_format
from tests.support.shard_fixtures import book_shards, write_shards
from training.loader import (
    IGNORE_INDEX,
    LoaderConfig,
    Remasker,
    ShardInfo,
    ShardLoader,
    collate,
    list_shards,
    plan_epoch,
    validation_batches,
)

SEQ = 128


@pytest.fixture(scope="session")
def books(shared_data, tmp_path_factory):
    """(vocabulary folder, train rows made by pipelines.make_shards from the books)."""
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    return made.vocab_dir, made.rows_128


def _shards(books, folder: Path, train: list[int], validation: list[int] = ()) -> Path:
    vocab_dir, rows = books
    write_shards(list(rows), folder, {"train": train, "validation": list(validation)},
                 vocab_size=len((vocab_dir / "vocab.txt").read_text().split()),
                 max_seq_length=SEQ, rows_per_block=16)
    return folder


def _row_key(batch: dict, i: int) -> tuple:
    n = int(batch["attention_mask"][i].sum())
    return tuple(batch["input_ids"][i, :n].tolist())


def _epoch_keys(loader: ShardLoader) -> list[tuple]:
    keys = []
    for batch in loader:
        if loader.epoch > 0:
            break
        keys += [_row_key(batch, i) for i in range(batch["input_ids"].shape[0])]
    return keys


def test_plan_equal_rows_per_slot_with_uneven_shards():
    shards = [ShardInfo(f"train-{i:06d}.tar", "", n, i) for i, n in enumerate([40, 24, 56, 30, 17])]
    for epoch in range(5):
        plan = plan_epoch(shards, epoch, seed=7, num_slots=4, batch_size=4)
        # Largest first onto the lightest slot: 56 | 40 | 30 | 24+17; the smallest slot has 30.
        assert sorted(sum(s.num_rows for s in slot) for slot in plan.slots) == [30, 40, 41, 56]
        assert plan.rows_per_slot == 28
        assert sorted(s.index for slot in plan.slots for s in slot) == [0, 1, 2, 3, 4]
    orders = {tuple(s.index for slot in plan_epoch(shards, e, 7, 1, 4).slots for s in slot)
              for e in range(5)}
    assert len(orders) > 1, "the shard order must change between epochs"


def test_rows_cut_to_equalise_the_slots_are_counted_and_logged(books, tmp_path, caplog):
    """167 rows in 2 slots: 56+24 | 40+30+17 -> 80 and 87, cut to 80 each: 7 rows (4.19%) cut
    every epoch, logged once per epoch by rank 0 as a warning (> 1%) and counted."""
    shards = [ShardInfo(f"train-{i:06d}.tar", "", n, i) for i, n in enumerate([40, 24, 56, 30, 17])]
    plan = plan_epoch(shards, 0, seed=5, num_slots=2, batch_size=4)
    assert (plan.total_rows, plan.rows_per_slot, plan.rows_cut) == (167, 80, 7)
    assert plan_epoch(shards, 0, seed=5, num_slots=4, batch_size=4).rows_cut == 167 - 4 * 28
    folder = _shards(books, tmp_path / "s", [40, 24, 56, 30, 17])
    loaders = [ShardLoader(LoaderConfig(str(folder), 4, SEQ, rank=r, world_size=2, seed=5,
                                        shuffle_buffer=16)) for r in range(2)]
    caplog.set_level(logging.INFO, logger="training.loader")
    for loader in loaders:
        assert loader.rows_cut == 7  # epoch 0's plan
        stream = iter(loader)
        _take(stream, 20 + 1)  # 80 rows / 4 = 20 batches, then the first of epoch 1
        assert (loader.epoch, loader.rows_cut) == (1, 14)
    messages = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "training.loader"]
    assert [level for level, _ in messages] == [logging.WARNING] * 2  # rank 0 only, per epoch
    assert "epoch 0: 7 of 167 train rows (4.19%) left out so that each of the 2 loader slots " \
           "(ranks x workers) yields 80 rows; 7 cut so far" in messages[0][1]
    assert messages[1][1].endswith("; 14 cut so far")
    resumed = ShardLoader(loaders[0].config)
    resumed.load_state_dict(loaders[0].state_dict())
    assert resumed.rows_cut == 14
    # Resumed on 4 ranks: epoch 0 cut 7 rows on the 2 ranks it ran on; epoch 1 is planned anew.
    wider = ShardLoader(dataclasses.replace(loaders[0].config, world_size=4))
    wider.load_state_dict(loaders[0].state_dict())
    assert wider.plan(0).rows_cut == 167 - 4 * 28  # what a recount would wrongly add
    assert wider.rows_cut == 7 + wider.plan(1).rows_cut
    caplog.clear()
    even_folder = _shards(books, tmp_path / "e", [48, 48])
    even = ShardLoader(LoaderConfig(str(even_folder), 8, SEQ, num_workers=2, seed=5))
    next(iter(even))
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, (f"{even_folder} epoch 0: 0 of 96 train rows (0.00%) left out so that "
                        "each of the 2 loader slots (ranks x workers) yields 48 rows; 0 cut so "
                        "far"))]


def test_too_few_shards_or_rows_is_a_clear_error():
    shards = [ShardInfo("train-000000.tar", "", 100, 0), ShardInfo("train-000001.tar", "", 3, 1)]
    with pytest.raises(ValueError, match="2 shards cannot feed 4 loader slots"):
        plan_epoch(shards, 0, 0, num_slots=4, batch_size=4)
    with pytest.raises(ValueError, match="smallest loader slot has 3 rows"):
        plan_epoch(shards, 0, 0, num_slots=2, batch_size=4)


def test_ranks_and_workers_read_every_row_exactly_once(books, tmp_path):
    """2 ranks x 2 DataLoader worker processes, 4 equal shards: each row once per epoch."""
    folder = _shards(books, tmp_path / "s", [48, 48, 48, 48])
    expected = collections.Counter(tuple(r.input_ids.tolist()) for r in books[1][:192])
    seen = collections.Counter()
    for rank in range(2):
        loader = ShardLoader(LoaderConfig(str(folder), 8, SEQ, rank=rank, world_size=2,
                                          num_workers=2, seed=3, shuffle_buffer=20))
        assert loader.batches_per_epoch() == 12
        keys = _epoch_keys(loader)
        assert len(keys) == 96
        seen.update(keys)
    assert seen == expected


def test_uneven_shards_give_every_rank_the_same_number_of_batches(books, tmp_path):
    folder = _shards(books, tmp_path / "s", [40, 24, 56, 30, 17])
    for epoch in range(3):
        counts = []
        for rank in range(2):
            loader = ShardLoader(LoaderConfig(str(folder), 4, SEQ, rank=rank, world_size=2,
                                              num_workers=2, seed=5, shuffle_buffer=16))
            loader.epoch = epoch
            counts.append(len(_epoch_keys_from(loader)))
        assert counts == [14, 14], f"epoch {epoch}"  # 2 slots x 28 rows / 4 per batch


def _epoch_keys_from(loader: ShardLoader) -> list:
    start, batches = loader.epoch, []
    for batch in loader:
        if loader.epoch != start:
            break
        batches.append(batch)
    return batches


def _take(iterator, n: int) -> list[dict]:
    return [next(iterator) for _ in range(n)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_continues_exactly_at_the_saved_position(books, tmp_path, num_workers):
    folder = _shards(books, tmp_path / "s", [60, 52, 44, 36])
    config = LoaderConfig(str(folder), 8, SEQ, num_workers=num_workers, seed=11, shuffle_buffer=30)
    reference = ShardLoader(config)
    per_epoch = reference.batches_per_epoch()
    assert per_epoch == 24  # 192 rows / 8; with 2 workers 60+36 | 52+44 = 96 rows each
    stream = iter(reference)
    expected = _take(stream, per_epoch + 8)
    for stop in (5, per_epoch - 1, per_epoch + 3):  # inside epoch 0, at its end, inside epoch 1
        first = ShardLoader(config)
        it = iter(first)
        _take(it, stop)
        state = first.state_dict()
        assert state["rows_consumed_in_epoch"] == (stop % per_epoch) * 8
        resumed = ShardLoader(config)
        resumed.load_state_dict(state)
        got = _take(iter(resumed), 5)
        for a, b in zip(got, expected[stop:stop + 5]):
            assert a.keys() == b.keys()
            for key in a.keys() - {"layout"}:
                assert torch.equal(a[key], b[key]), (stop, key)
            assert layout_tensors(a["layout"]) == layout_tensors(b["layout"]), stop


def layout_tensors(layout) -> tuple:
    """A BatchLayout as nested lists, for comparing two of them."""
    if layout.plan is None:
        return (layout.masked, None)
    groups = [(g.index.tolist(), None if g.real is None else g.real.tolist())
              for g in layout.plan.groups]
    return (layout.masked, groups, layout.plan.token_index.tolist())


def test_one_rank_two_workers_sees_the_rows_of_two_ranks(books, tmp_path):
    """Slots are rank x worker: the global batches of 1x2 equal those of 2x1, in order."""
    folder = _shards(books, tmp_path / "s", [40, 24, 56, 30, 17])
    single = iter(ShardLoader(LoaderConfig(str(folder), 4, SEQ, num_workers=2, seed=2,
                                           shuffle_buffer=10)))
    ranks = [iter(ShardLoader(LoaderConfig(str(folder), 4, SEQ, rank=r, world_size=2,
                                           num_workers=0, seed=2, shuffle_buffer=10)))
             for r in range(2)]
    for _ in range(20):  # crosses the epoch boundary at 14
        for rank in range(2):
            a, b = next(single), next(ranks[rank])
            assert torch.equal(a["input_ids"], b["input_ids"])


def test_remote_sources_pipe_and_http_give_the_same_batches(books, tmp_path):
    folder = _shards(books, tmp_path / "s", [40, 40])
    local = _take(iter(ShardLoader(LoaderConfig(str(folder), 8, SEQ, seed=1))), 6)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sources = [f"pipe:cat {folder}/{{name}}", f"http://127.0.0.1:{server.server_port}/"]
        for source in sources:
            remote = _take(iter(ShardLoader(LoaderConfig(source, 8, SEQ, seed=1))), 6)
            for a, b in zip(remote, local):
                assert torch.equal(a["input_ids"], b["input_ids"]), source
    finally:
        server.shutdown()


def test_validation_batches_split_rows_between_ranks(books, tmp_path):
    folder = _shards(books, tmp_path / "s", [32, 32], validation=[40])
    batches = [list(validation_batches(LoaderConfig(str(folder), 4, SEQ, rank=r, world_size=2,
                                                    split="validation"), max_batches=100))
               for r in range(2)]
    assert [len(b) for b in batches] == [5, 5]  # 40 rows / 2 ranks / 4 per batch
    rows = books[1][64:104]
    assert _row_key(batches[0][0], 1) == tuple(rows[2].input_ids.tolist())
    assert _row_key(batches[1][0], 0) == tuple(rows[1].input_ids.tolist())


def test_dynamic_masking_redraws_per_epoch_and_keeps_the_text(books):
    vocab_dir, rows = books
    remasker = Remasker.from_vocab(str(vocab_dir), seed=4)
    assert (remasker.mask_id, remasker.special_ids) == (4, (2, 3, 0))  # [MASK]; [CLS] [SEP] [PAD]
    from training.loader import KeyedRow
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

    from training.loader import ShardInfo, _without_worker_traceback, check_shard_files

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
    """training/pretrain.py's `build_loader`: with dynamic_masking the training loader re-masks
    (seeded by the run's seed), the validation loader keeps the shards' masks; without it
    neither re-masks."""
    from training import pretrain
    from training.config import PhaseConfig, PretrainConfig

    vocab_dir, _ = books
    folder = _shards(books, tmp_path / "s", [32], validation=[16])
    phase = PhaseConfig(train_shards=str(folder), max_seq_length=SEQ, micro_batch_size=8,
                        global_batch_size=8, steps=4, warmup_steps=0)
    config = PretrainConfig(vocab_dir=str(vocab_dir), phases=(phase,), dynamic_masking=True,
                            seed=9, shuffle_buffer=0, num_workers=0)
    dist = pretrain.Dist(rank=0, world_size=1, on_gpu=False)
    train = pretrain.build_loader(config, phase, dist)
    assert train == LoaderConfig(str(folder), 8, SEQ, seed=9, shuffle_buffer=0, split="train",
                                 remasker=Remasker.from_vocab(str(vocab_dir), seed=9))
    validation = pretrain.build_loader(config, phase, dist, validation=True)
    assert (validation.split, validation.remasker) == ("validation", None)
    static = dataclasses.replace(config, dynamic_masking=False)
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
