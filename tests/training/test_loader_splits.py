"""The shard loader on real shards of the books corpus: rank/worker splits, equal per-rank batch
counts on uneven shards, an exact resume, remote sources, validation rows between ranks."""

from __future__ import annotations

import collections
import dataclasses
import functools
import http.server
import logging
import threading

import pytest
import torch

from tests.training.loader_shards import SEQ, _row_key, _shards, layout_tensors
from training.loader import LoaderConfig, ShardLoader, plan_epoch, validation_batches
from training.shard_trust import ShardInfo


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
    _take(iter(even), 12 + 1)  # into epoch 1: the same share is not told again at INFO
    assert even.epoch == 1
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
