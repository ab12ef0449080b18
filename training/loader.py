"""The shard loader: WebDataset over `{split}-NNNNNN.tar` shards -> padded micro-batches per rank.

Where the shards are (`source`): a local folder, a `file://`, `http(s)://` or `gs://` base URL,
or a template with `{name}` for anything WebDataset's `gopen` can open, e.g.
`pipe:aws s3 cp s3://bucket/shards/{name} -`. The folder's `manifest.json` (written last by
`pipelines/make_shards.py`) gives every shard's row count; the loader needs it to plan.

Every epoch is planned up front, from the manifest alone (`plan_epoch`), the same way on every
rank: the shards are shuffled with (seed, epoch), then dealt to `ranks x workers` *slots* by
largest-first greedy balancing, and every slot is cut to the same number of rows (the smallest
slot's, rounded down to whole micro-batches). So every rank runs the same number of steps each
epoch whatever the shard sizes are (uneven shards make plain `split_by_node` hang the ranks
that run out first at their next collective). The rows cut this epoch differ the next epoch;
how many are cut is logged once per epoch (a warning above `CUT_WARN_FRACTION`) and counted in
`ShardLoader.rows_cut`, which training/pretrain.py writes into its metrics.

A slot's stream: its shards in order -> tar members -> `.rows.npz` blocks decoded with
`common.shard_format.decode_block` -> rows -> shuffle buffer (seeded by epoch and slot) ->
the first `rows_per_slot` rows -> optional dynamic re-masking -> micro-batches. A DataLoader with
W workers runs the rank's W slots and interleaves their batches round-robin, which is a fixed
order; so the position in the stream is one number per rank, `batch_in_epoch`, and resuming
replays each slot's stream (reading, not training) to exactly where it stopped.

With 1 rank x 2 workers and 2 ranks x 1 worker the slots, and so the global batches, are the
same: a 1-rank run with 2 accumulation steps sees the rows a 2-rank run sees.

Each shard is read whole and checked against its manifest entry before any of its rows is used
(training/shard_trust.py); rows are re-masked by training/remasking.py and padded into batches,
of one static shape per phase where asked, by training/batching.py.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import itertools
import logging
import os
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from common import shard_format
from common.shard_format import Row
from common.storage import MANIFEST_NAME
from training.batching import StaticShapes, collate
from training.remasking import KeyedRow, MaskSchedule, Remasker
from training.shard_trust import (
    VERIFY_HINT,
    ShardInfo,
    UnreadableShard,
    check_shard_bytes,
    list_shards,
    shard_location,
    shard_set_digest,
    unreadable_shard,
)

log = logging.getLogger(__name__)

CUT_WARN_FRACTION = 0.01
"""Above this share of an epoch's rows cut to equalise the slots, the loader warns."""


# ---------------------------------------------------------------- epoch plan

@dataclass(frozen=True)
class EpochPlan:
    """Which shards each slot (rank x worker) reads this epoch, and how many rows it yields."""
    slots: tuple[tuple[ShardInfo, ...], ...]
    """slots[rank * num_workers + worker]: the slot's shards in reading order."""
    rows_per_slot: int
    """Rows every slot yields (a multiple of the micro-batch size)."""

    @property
    def total_rows(self) -> int:
        return sum(s.num_rows for slot in self.slots for s in slot)

    @property
    def rows_cut(self) -> int:
        """Rows of the epoch's shards that no slot yields (all ranks together)."""
        return self.total_rows - self.rows_per_slot * len(self.slots)


def plan_epoch(shards: Sequence[ShardInfo], epoch: int, seed: int, num_slots: int,
               batch_size: int, shuffle: bool = True) -> EpochPlan:
    """Deal shards to `num_slots` slots with equal row counts (see the module docstring)."""
    if len(shards) < num_slots:
        raise ValueError(f"{len(shards)} shards cannot feed {num_slots} loader slots (ranks x "
                         "workers): write more, smaller shards or use fewer loader workers")
    order = list(shards)
    if shuffle:
        random.Random(f"shards-{seed}-{epoch}").shuffle(order)
    rank_of = {s.index: i for i, s in enumerate(order)}
    loads = [0] * num_slots
    dealt: list[list[ShardInfo]] = [[] for _ in range(num_slots)]
    # Largest first onto the lightest slot (LPT) keeps the rows cut to a minimum.
    for shard in sorted(order, key=lambda s: (-s.num_rows, rank_of[s.index])):
        slot = min(range(num_slots), key=lambda i: (loads[i], i))
        dealt[slot].append(shard)
        loads[slot] += shard.num_rows
    rows = min(loads) // batch_size * batch_size
    if rows == 0:
        raise ValueError(f"the smallest loader slot has {min(loads)} rows, less than one micro-"
                         f"batch of {batch_size}: too little data for {num_slots} slots")
    slots = tuple(tuple(sorted(d, key=lambda s: rank_of[s.index])) for d in dealt)
    return EpochPlan(slots=slots, rows_per_slot=rows)


# ---------------------------------------------------------------- rows

def block_rows(sample: dict, max_seq_length: int) -> list[KeyedRow]:
    """The rows of one decoded tar member; errors name the shard and member."""
    where = f"{sample.get('__url__', '?')}: member {sample.get('__key__', '?')}"
    member = sample.get(shard_format.MEMBER_SUFFIX)
    if member is None:
        raise ValueError(f"{where}: no .{shard_format.MEMBER_SUFFIX} member "
                         f"(found {sorted(k for k in sample if not k.startswith('__'))})")
    try:
        rows = shard_format.decode_block(member)
    except Exception as e:  # a corrupt member: name it, never skip it silently
        raise ValueError(f"{where}: cannot decode rows ({e})") from e
    shard = os.path.basename(str(sample.get("__url__", "")))
    for i, row in enumerate(rows):
        if len(row.input_ids) > max_seq_length:
            raise ValueError(f"{where} row {i}: {len(row.input_ids)} tokens > max_seq_length "
                             f"{max_seq_length}")
    return [KeyedRow(r, shard, sample["__key__"], i) for i, r in enumerate(rows)]


# ---------------------------------------------------------------- streams

@dataclass(frozen=True)
class LoaderConfig:
    """How one rank reads a shard location."""
    source: str
    """Shard folder / URL / `{name}` template (see the module docstring)."""
    batch_size: int
    """Rows per micro-batch."""
    max_seq_length: int
    """Longest row allowed (must match the shards)."""
    rank: int = 0
    """This process's rank."""
    world_size: int = 1
    """Number of ranks."""
    num_workers: int = 0
    """DataLoader worker processes (0 = read in this process); slots per rank = max(1, this)."""
    seed: int = 0
    """Seed of the shard order, shuffle buffers and dynamic masks."""
    shuffle_buffer: int = 1000
    """Rows in each slot's shuffle buffer (0 = keep the shard order)."""
    split: str = "train"
    """Shard name prefix (`train` or `validation`)."""
    remasker: Remasker | None = None
    """Dynamic re-masking, or None to use the shards' masks."""
    mask_schedule: MaskSchedule | None = None
    """The re-masking share per step (needs `remasker` with `recount`); None: fixed."""
    pin_memory: bool = False
    """Batches in page-locked memory (GPU training: their copies to the device then overlap
    with compute)."""
    attention_plan: bool = True
    """Work out each batch's per-instance attention plan (`model.attention.attention_plan`):
    the CPU's attention uses it; a GPU attends over whole rows under a mask and never does."""
    static_shapes: StaticShapes | None = None
    """Pad every batch to [batch_size, max_seq_length] and these masked positions and instances
    per row (`StaticShapes`); None: each batch only as large as its rows need."""

    def __post_init__(self):
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world_size {self.world_size}")
        for flag in ("batch_size", "max_seq_length"):
            if getattr(self, flag) <= 0:
                raise ValueError(f"loader {flag} must be positive")

    @property
    def slots_per_rank(self) -> int:
        return max(1, self.num_workers)


def slot_rows(config: LoaderConfig, slot: Sequence[ShardInfo], epoch: int, slot_index: int,
              start_row: int, stop_row: int | None) -> Iterator[Row]:
    """Rows [start_row, stop_row) of one slot's shuffled stream in one epoch, re-masked by
    `config.remasker` at its fixed share (`slot_items` gives them before re-masking)."""
    for item in slot_items(config, slot, epoch, slot_index, start_row, stop_row):
        yield config.remasker(item, epoch) if config.remasker else item.row


def slot_items(config: LoaderConfig, slot: Sequence[ShardInfo], epoch: int, slot_index: int,
               start_row: int, stop_row: int | None) -> Iterator[KeyedRow]:
    """Rows [start_row, stop_row) of one slot's shuffled stream in one epoch, with their keys.

    Each shard is read whole and checked (`check_shard_bytes`: sha256, member names) before
    any of its rows enters the stream, so a corrupt or hostile shard stops the loader before
    an optimizer step can use it. Raises ValueError if the shards hold fewer rows than that
    (the manifest overstates them): a rank running short would leave the others waiting at
    their next collective.
    """
    import webdataset as wds

    stages = [
        wds.SimpleShardList([s.url for s in slot]),
        functools.partial(_verified_samples, {s.url: s for s in slot}),
        wds.map(lambda sample: block_rows(sample, config.max_seq_length)),
        _flatten,
    ]
    if config.shuffle_buffer > 0:
        rng = random.Random(f"rows-{config.seed}-{epoch}-{slot_index}")
        stages.append(wds.shuffle(config.shuffle_buffer, initial=config.shuffle_buffer, rng=rng))
    keyed = itertools.islice(iter(wds.DataPipeline(*stages)), start_row, stop_row)
    count = start_row
    for item in keyed:
        count += 1
        yield item
    if stop_row is not None and count < stop_row:
        raise ValueError(f"shards {[s.url for s in slot]} hold {count} rows, their manifest "
                         f"promises at least {stop_row}: rewrite them or fix manifest.json")


def _verified_samples(shards: dict[str, ShardInfo], sources: Iterator[dict]) -> Iterator[dict]:
    """webdataset's `tarfile_to_samples` with each shard read into memory and checked
    against its manifest entry between opening and expanding it (a shard's bytes stay in
    memory while its rows are read: one shard per loader slot)."""
    from webdataset import tariterators

    def verified(streams: Iterator[dict]) -> Iterator[dict]:
        for source in streams:
            url = source["url"]
            try:  # closing a `pipe:` stream raises if its command failed
                with contextlib.closing(source["stream"]) as stream:
                    data = stream.read()
            except OSError as e:
                raise UnreadableShard(f"{url}: cannot read the shard ({type(e).__name__}: {e}); "
                                      f"{VERIFY_HINT}") from e
            check_shard_bytes(data, shards[url], url)
            yield {**source, "stream": io.BytesIO(data)}

    streams = tariterators.url_opener(sources, handler=unreadable_shard)
    files = tariterators.tar_file_expander(verified(streams), handler=unreadable_shard)
    return tariterators.group_by_keys(files, handler=unreadable_shard)


def _flatten(blocks: Iterator[list[KeyedRow]]) -> Iterator[KeyedRow]:
    for block in blocks:
        yield from block


class _EpochDataset(IterableDataset):
    """One epoch of one rank: each DataLoader worker runs one slot from `first_batch` on."""

    def __init__(self, config: LoaderConfig, plan: EpochPlan, epoch: int, first_batch: int,
                 batches_before: int = 0):
        super().__init__()
        self.config, self.plan, self.epoch, self.first_batch = config, plan, epoch, first_batch
        self.batches_before = batches_before
        """This rank's micro-batches in the phase's earlier epochs (`MaskSchedule`'s clock)."""

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        info = get_worker_info()
        physical = info.id if info is not None else 0
        w = self.config.slots_per_rank
        # The DataLoader asks worker 0 first; rotate so the next batch due comes first.
        logical = (physical + self.first_batch) % w
        done = max(0, -(-(self.first_batch - logical) // w))  # batches this slot already gave
        slot_index = self.config.rank * w + logical
        b, schedule = self.config.batch_size, self.config.mask_schedule
        if schedule is None:
            rows = slot_rows(self.config, self.plan.slots[slot_index], self.epoch, slot_index,
                             done * b, self.plan.rows_per_slot)
            batches: Iterator[list[Row]] = iter(lambda: list(itertools.islice(rows, b)), [])
        else:
            batches = self._scheduled(slot_index, logical, done, schedule)
        for batch in batches:
            yield collate(batch, max_seq_length=self.config.max_seq_length,
                          attention_plan=self.config.attention_plan,
                          static=self.config.static_shapes, batch_size=b)

    def _scheduled(self, slot_index: int, logical: int, done: int,
                   schedule: MaskSchedule) -> Iterator[list[Row]]:
        """The slot's batches re-masked at the share in force at each batch's step: slot
        `logical` of w gives the rank's batches logical, logical + w, ..."""
        b, w, remask = self.config.batch_size, self.config.slots_per_rank, self.config.remasker
        items = slot_items(self.config, self.plan.slots[slot_index], self.epoch, slot_index,
                           done * b, self.plan.rows_per_slot)
        index = done
        while keyed := list(itertools.islice(items, b)):
            rate = schedule.rate_of_batch(self.batches_before + logical + index * w)
            yield [remask(item, self.epoch, rate) for item in keyed]
            index += 1


class ShardLoader:
    """Endless micro-batches for one rank, epoch after epoch, with a saveable position.

    `state_dict()` after consuming n batches, then `load_state_dict` on a fresh loader, gives the
    batch n+1 onwards exactly.
    """

    def __init__(self, config: LoaderConfig):
        self.config = config
        self.shards, self.manifest = list_shards(config.source, config.split)
        seq = self.manifest.get("max_seq_length")
        if seq is not None and int(seq) != config.max_seq_length:
            raise ValueError(f"{shard_location(config.source, MANIFEST_NAME)}: shards have max_seq_length "
                             f"{seq}, the phase wants {config.max_seq_length}")
        self.epoch = 0
        self.batch_in_epoch = 0
        self.rows_cut_before = 0
        """Rows cut by the finished epochs, as they were planned (on the ranks of that time)."""
        self._plans: dict[int, EpochPlan] = {}
        self._cut_told = False

    def plan(self, epoch: int) -> EpochPlan:
        if epoch not in self._plans:
            c = self.config
            self._plans[epoch] = plan_epoch(self.shards, epoch, c.seed,
                                            c.world_size * c.slots_per_rank, c.batch_size,
                                            shuffle=c.shuffle_buffer > 0)
        return self._plans[epoch]

    @property
    def rows_cut(self) -> int:
        """Rows cut by the epochs started so far, the current one included (all ranks)."""
        return self.rows_cut_before + self.plan(self.epoch).rows_cut

    def shard_set_digest(self) -> str:
        """`shard_set_digest` of the shards this loader reads."""
        return shard_set_digest(self.manifest, shard_location(self.config.source, MANIFEST_NAME),
                                self.config.split)

    def _report_cut(self, plan: EpochPlan) -> None:
        """Log (rank 0; every rank plans the same) how many rows this epoch leaves out: a
        warning each epoch above CUT_WARN_FRACTION, else the first epoch's at INFO and the
        later ones' at DEBUG (each epoch's plan cuts a share of about the same size, and the
        run's total is `rows_cut` in the metrics)."""
        if self.config.rank != 0 or plan.total_rows == 0:
            return
        share = plan.rows_cut / plan.total_rows
        level = logging.WARNING if share > CUT_WARN_FRACTION else (
            logging.DEBUG if self._cut_told else logging.INFO)
        self._cut_told = True
        log.log(level, "%s epoch %d: %d of %d %s rows (%.2f%%) left out so that each of the %d "
                "loader slots (ranks x workers) yields %d rows; %d cut so far", self.config.source,
                self.epoch, plan.rows_cut, plan.total_rows, self.config.split, 100 * share,
                len(plan.slots), plan.rows_per_slot, self.rows_cut)

    def batches_per_epoch(self, epoch: int | None = None) -> int:
        plan = self.plan(self.epoch if epoch is None else epoch)
        return plan.rows_per_slot // self.config.batch_size * self.config.slots_per_rank

    def batches_before(self) -> int:
        """This rank's micro-batches in the epochs before the current one."""
        return sum(self.batches_per_epoch(e) for e in range(self.epoch))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:
            plan = self.plan(self.epoch)
            self._report_cut(plan)
            dataset = _EpochDataset(self.config, plan, self.epoch, self.batch_in_epoch,
                                    self.batches_before())
            # Its own generator: drawing the workers' base seed from the global RNG would shift
            # the model's dropout masks whenever an epoch starts (and break exact resume).
            generator = torch.Generator().manual_seed(self.config.seed * 1000 + self.epoch)
            loader = DataLoader(dataset, batch_size=None, num_workers=self.config.num_workers,
                                prefetch_factor=4 if self.config.num_workers else None,
                                generator=generator, pin_memory=self.config.pin_memory)
            try:
                for batch in loader:
                    self.batch_in_epoch += 1
                    yield batch
            except (ValueError, FileNotFoundError) as e:  # our checks, raised in a worker
                clean = _without_worker_traceback(e)
                if clean is e:
                    raise
                raise clean from e
            self._next_epoch()

    def _next_epoch(self) -> None:
        self.rows_cut_before += self.plan(self.epoch).rows_cut
        self.epoch += 1
        self.batch_in_epoch = 0

    def state_dict(self) -> dict:
        c = self.config
        return {"epoch": self.epoch, "batch_in_epoch": self.batch_in_epoch,
                "rows_consumed_in_epoch": self.batch_in_epoch * c.batch_size,
                "world_size": c.world_size, "slots_per_rank": c.slots_per_rank,
                "batch_size": c.batch_size, "seed": c.seed, "source": c.source,
                "rows_cut_before": self.rows_cut_before}

    def load_state_dict(self, state: dict) -> None:
        """Continue where `state` stopped; on a different rank/worker count, approximately."""
        c = self.config
        self.epoch = int(state["epoch"])
        # Older checkpoints lack the count: recount with this run's slots.
        self.rows_cut_before = int(state.get("rows_cut_before", sum(
            self.plan(e).rows_cut for e in range(self.epoch))))
        same = (state["world_size"], state["slots_per_rank"], state["batch_size"]) == \
            (c.world_size, c.slots_per_rank, c.batch_size)
        if same:
            self.batch_in_epoch = int(state["batch_in_epoch"])
        else:
            # Another split of the same epoch: skip as many rows in total as were consumed
            # (same epoch, same share of it; the row order differs from the interrupted run).
            consumed = int(state["rows_consumed_in_epoch"]) * int(state["world_size"])
            self.batch_in_epoch = consumed // (c.batch_size * c.world_size)
        if self.batch_in_epoch >= self.batches_per_epoch():
            self._next_epoch()


_TRACEBACK_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')


def _without_worker_traceback(error: Exception) -> Exception:
    """The error one of our checks raised in a DataLoader worker, with its own message again:
    torch re-raises it with the worker's whole traceback as the message (so a bad shard would
    not read as the one line our checks write). An error raised inside a library (the worker
    traceback's innermost frame not in our packages) is returned as it is: it is a bug, and
    its traceback is what shows where."""
    from common.errors import is_our_file

    lines = str(error).splitlines()
    frames = [i for i, line in enumerate(lines) if _TRACEBACK_FRAME.match(line)]
    if not frames or not is_our_file(_TRACEBACK_FRAME.match(lines[frames[-1]]).group(1)):
        return error
    exception_line = re.compile(rf"^([\w.]+\.)?{re.escape(type(error).__name__)}: ")
    for i in range(frames[-1] + 1, len(lines)):
        if found := exception_line.match(lines[i]):
            try:
                return type(error)("\n".join([lines[i][found.end():], *lines[i + 1:]]).strip())
            except TypeError:  # an exception class that takes other arguments
                return error
    return error


def validation_batches(config: LoaderConfig, max_batches: int) -> Iterator[dict[str, torch.Tensor]]:
    """Up to `max_batches` micro-batches of held-out rows, in shard order; every rank gets the
    same number (rank r takes rows r, r + world, ...), so ZeRO-3's collectives stay matched."""
    shards, _ = list_shards(config.source, config.split)
    per_rank = sum(s.num_rows for s in shards) // config.world_size
    count = min(max_batches, per_rank // config.batch_size)
    if count == 0:
        raise ValueError(f"{config.source}: {config.split} shards hold fewer than "
                         f"{config.world_size} x {config.batch_size} rows")
    flat = dataclasses.replace(config, shuffle_buffer=0, remasker=None)
    rows = slot_rows(flat, shards, 0, 0, 0, None)
    mine = itertools.islice(rows, config.rank, None, config.world_size)
    for _ in range(count):
        yield collate(list(itertools.islice(mine, config.batch_size)),
                      max_seq_length=config.max_seq_length, attention_plan=config.attention_plan,
                      static=config.static_shapes, batch_size=config.batch_size)
