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

Static shapes (`LoaderConfig.static_shapes`, `StaticShapes`): every batch of a phase is
[batch_size, max_seq_length] with the same masked positions and instances per row, padded with
`IGNORE_INDEX` labels, so a compiled step is captured once rather than once per shape. A slot
yields whole micro-batches only (`plan_epoch`), and a batch of fewer rows would be padded to
`batch_size` all the same, so neither the end of an epoch nor validation changes the shape.

Trust: a shard is read whole before any of its rows enters a slot's stream, hashed against the
manifest's sha256 and its tar members listed (`check_shard_bytes`): a corrupt shard, or one with
a `../`, absolute-path or link member, stops the loader with one line naming the shard and the
member, before an optimizer step uses it. training/pretrain.py runs the same check on every
local shard before the first step (`verify_shard_files`, up to `FULL_CHECK_MAX_BYTES`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import itertools
import json
import logging
import os
import random
import re
import tarfile
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from common import shard_format
from common.masking import (
    MaskingConfig,
    num_to_predict,
    replace_tokens,
    take_word_groups,
    word_groups,
)
from common.shard_format import Row
from common.storage import MANIFEST_NAME, sha256_file
from model.attention import PADDING_SEQUENCE_ID, BatchLayout, batch_layout, instance_ids
from model.heads import IGNORE_INDEX

log = logging.getLogger(__name__)

CUT_WARN_FRACTION = 0.01
"""Above this share of an epoch's rows cut to equalise the slots, the loader warns."""


# ---------------------------------------------------------------- shard list

@dataclass(frozen=True)
class ShardInfo:
    """One shard file as the manifest describes it."""
    name: str
    """File name, e.g. `train-000003.tar`."""
    url: str
    """Where to open it (local path or a URL `webdataset.gopen` understands)."""
    num_rows: int
    """Rows in the shard (from the manifest)."""
    index: int
    """Position in the manifest's shard list (stable identity for seeds)."""
    num_bytes: int | None = None
    """File size the manifest records (None in manifests without `bytes`)."""
    sha256: str | None = None
    """sha256 of the file the manifest records (None in manifests without one)."""


def _location(source: str, name: str) -> str:
    if "{name}" in source:
        return source.replace("{name}", name)
    if "://" in source and not source.startswith("file://"):
        return source.rstrip("/") + "/" + name
    return os.path.join(source.removeprefix("file://"), name)


def read_shard_manifest(source: str) -> dict:
    """The `manifest.json` of a shard location (local, URL or `{name}` template)."""
    url = _location(source, MANIFEST_NAME)
    try:
        if os.path.exists(url):
            with open(url, "rb") as f:
                data = f.read()
        else:
            import webdataset as wds
            with wds.gopen(url, "rb") as f:
                data = f.read()
        return json.loads(data)
    except (OSError, ValueError) as e:
        raise FileNotFoundError(f"{url}: cannot read the shard manifest ({e}); a shard folder is "
                                "complete only when make_shards has written manifest.json") from e


def _manifest_entries(manifest: dict, url: str) -> list[dict]:
    shards = manifest.get("shards")
    if isinstance(shards, dict):  # {name: {num_rows: ...}}
        shards = [{"name": k, **v} for k, v in shards.items()]
    if not isinstance(shards, list):
        raise ValueError(f"{url}: manifest has no 'shards' list")  # noqa: TRY004 (a bad file)
    entries = []
    for i, entry in enumerate(shards):
        name = entry.get("name") or entry.get("file") or entry.get("path")
        if not name or "num_rows" not in entry:
            raise ValueError(f"{url}: shard entry {i} lacks 'name' or 'num_rows': {entry}")
        entries.append({**entry, "name": os.path.basename(str(name))})
    return entries


def list_shards(source: str, split: str = "train") -> tuple[list[ShardInfo], dict]:
    """The `split` shards of a location with their row counts, and the manifest."""
    manifest = read_shard_manifest(source)
    entries = [e for e in _manifest_entries(manifest, _location(source, MANIFEST_NAME))
               if e["name"].startswith(f"{split}-") and e["name"].endswith(".tar")]
    if not entries:
        raise FileNotFoundError(f"{_location(source, MANIFEST_NAME)}: no {split}-*.tar shards listed")
    shards = [ShardInfo(e["name"], _location(source, e["name"]), int(e["num_rows"]), i,
                        int(e["bytes"]) if "bytes" in e else None, e.get("sha256") or None)
              for i, e in enumerate(sorted(entries, key=lambda e: e["name"]))]
    return shards, manifest


VERIFY_HINT = "check the folder with `python -m pipelines.verify_shards <folder>`"


def check_shard_files(shards: Sequence[ShardInfo]) -> None:
    """Local shards exist and have the sizes their manifest records: a truncated or replaced
    shard fails here, before training, rather than in a loader worker hours into the run.
    (Remote shards are checked as they are read.)"""
    for shard in shards:
        path = shard.url.removeprefix("file://")
        if "://" in path:
            continue
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: shard listed in the manifest is missing")
        size = os.path.getsize(path)
        if shard.num_bytes is not None and size != shard.num_bytes:
            raise ValueError(f"{path}: {size} bytes, the manifest records {shard.num_bytes}: "
                             f"truncated or replaced; {VERIFY_HINT}")


class UnreadableShard(ValueError):
    """A shard that cannot be read as a tar file (truncated, corrupt), named by its URL.
    (One message argument, so that DataLoader workers can re-raise it in the main process.)"""
    url: str | None = None
    cause: BaseException | None = None


def _unreadable_shard(exn: Exception) -> bool:
    """webdataset's error hook while it opens and reads tar files: name the shard and stop
    (never skip). webdataset calls it up to twice: from inside the tar reader (no URL yet; it
    tags the message " @ <stream>"), then from the opener (appends the URL) or the expander
    (appends the stream and the URL)."""
    args = exn.args
    inner = bool(args) and isinstance(args[0], str) and " @ <" in args[0]
    url = args[-1] if not inner and len(args) >= 2 and isinstance(args[-1], str) else None
    opening = url is not None and isinstance(args[-2], (str, int))  # the opener adds the URL only
    cause = exn
    if isinstance(exn, UnreadableShard):  # raised by the inner reader, now with its URL
        url, cause, opening = url or exn.url, exn.cause, False
    detail = getattr(cause, "strerror", None) or (cause.args[0] if cause.args else "")
    detail = str(detail).split(" @ <")[0]
    what = "cannot open the shard" if opening else "cannot read the shard"
    hint = "" if opening else "it is truncated or corrupt: "
    error = UnreadableShard(f"{url or 'a shard'}: {what} ({type(cause).__name__}: {detail}); "
                            f"{hint}{VERIFY_HINT}")
    error.url, error.cause = url, cause
    raise error from cause


# ---------------------------------------------------------------- trust

FULL_CHECK_MAX_BYTES = 64 << 30
"""Local shards of a phase up to this size (all of them together) are checked before the first
step (`verify_shard_files`); above it, each is checked only as the loader reads it (still
before any of its rows is used). Measured here on a 500 MiB shard from the page cache, one
core: sha256 1014 MiB/s, member listing 2528 MiB/s, the whole check 670 MiB/s; so the limit
costs about 100 s on a node of one rank, and its share on each where a node's ranks split the
shards (as fast as the disk allows). The check as the loader reads (read whole, hash, list)
ran at 538 MiB/s, 7% over reading the rows alone."""


def member_problem(info: tarfile.TarInfo) -> str | None:
    """Why a tar member has no place in a shard, or None: a shard holds regular files with
    relative names only. webdataset extracts nothing, but it reads the rows of a member named
    `../x.rows.npz` or `/tmp/x.rows.npz` like any other and skips links without a word."""
    if info.issym() or info.islnk():
        return f"is a {'symbolic' if info.issym() else 'hard'} link to {info.linkname!r}"
    if not info.isfile():
        return "is not a regular file"
    name = info.name.replace("\\", "/")
    if name.startswith("/"):
        return "has an absolute name"
    if ".." in name.split("/"):
        return "has a '..' in its name"
    return None


def check_members(tar: tarfile.TarFile, where: str) -> None:
    """Refuse a shard (ValueError naming it and the member) with a member `member_problem`
    finds."""
    for info in tar:
        if (problem := member_problem(info)) is not None:
            raise ValueError(f"{where}: member {info.name!r} {problem}: refused (a shard holds "
                             f"regular files with relative names only); {VERIFY_HINT}")


def _member_key(info: tarfile.TarInfo) -> str:
    return info.name.removesuffix("." + shard_format.MEMBER_SUFFIX)


def corruption(data: bytes, where: str, expected_sha256: str) -> ValueError:
    """The error for a shard whose bytes do not hash to the manifest's sha256, naming the first
    member found broken: one that does not decode (its npz's CRCs), a tar read that fails, or
    a tar header broken mid-file (which `tarfile` takes for the end of the archive)."""
    got = hashlib.sha256(data).hexdigest()
    changed = (f"sha256 {got[:12]}, the manifest records {expected_sha256[:12]}: the shard "
               f"changed since it was written; {VERIFY_HINT}")
    last, at = None, ""  # the last member read whole; the member being read
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                if (problem := member_problem(info)) is not None:
                    return ValueError(f"{where}: member {info.name!r} {problem}: refused; {changed}")
                at = f", in member {_member_key(info)}"
                member = tar.extractfile(info).read()
                at = ""
                if info.name.endswith("." + shard_format.MEMBER_SUFFIX):
                    try:
                        shard_format.decode_block(member)
                    except Exception as e:  # noqa: BLE001 (any failure to decode is the finding)
                        return ValueError(f"{where}: member {_member_key(info)}: cannot decode "
                                          f"rows ({type(e).__name__}: {e}); {changed}")
                last = _member_key(info)
            end = tar.offset
    except tarfile.TarError as e:
        after = at or (f", after member {last}" if last else "")
        return UnreadableShard(f"{where}: cannot read the shard ({type(e).__name__}: {e}{after}); "
                               f"it is truncated or corrupt: {VERIFY_HINT}")
    tail = data[end:]
    if len(tail) < 2 * tarfile.BLOCKSIZE or tail.count(0) != len(tail):
        what = "a broken tar header" if tail.count(0) != len(tail) else "no end-of-archive blocks"
        after = f", after member {last}" if last else ""
        return UnreadableShard(f"{where}: cannot read the shard (ReadError: {what} at byte {end}"
                               f"{after}); it is truncated or corrupt: {VERIFY_HINT}")
    return ValueError(f"{where}: every member decodes, but {changed}")


def check_shard_bytes(data: bytes, shard: ShardInfo, where: str) -> None:
    """A shard's whole bytes against its manifest entry: sha256 (when recorded), then its
    members (`check_members`). Raises a one-line ValueError naming the shard (and member)."""
    if shard.sha256 and hashlib.sha256(data).hexdigest() != shard.sha256:
        raise corruption(data, where, shard.sha256)
    check_tar(where, fileobj=io.BytesIO(data))


def check_tar(where: str, **source: object) -> None:
    """`check_members` of the tar at `source` (tarfile.open's `name` or `fileobj`); one that
    cannot be read is an UnreadableShard naming `where`."""
    try:
        with tarfile.open(mode="r:", **source) as tar:
            check_members(tar, where)
    except tarfile.TarError as e:
        raise UnreadableShard(f"{where}: cannot read the shard ({type(e).__name__}: {e}); it "
                              f"is truncated or corrupt: {VERIFY_HINT}") from None


def verify_shard_file(shard: ShardInfo) -> None:
    """One local shard against its manifest entry, read from disk (`check_shard_bytes`); the
    file is read into memory only to name what is broken."""
    path = shard.url.removeprefix("file://")
    if shard.sha256 and sha256_file(path) != shard.sha256:
        with open(path, "rb") as f:
            raise corruption(f.read(), path, shard.sha256)
    check_tar(path, name=path)


def local_part() -> tuple[int, int]:
    """(this rank's index, ranks) on this node, from the launcher's environment (torchrun sets
    LOCAL_WORLD_SIZE, the deepspeed launcher LOCAL_SIZE); (0, 1) without them."""
    index = int(os.environ.get("LOCAL_RANK") or 0)
    count = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or 1)
    return (index, count) if 0 <= index < count else (0, 1)


def verify_shard_files(shards: Sequence[ShardInfo], part: tuple[int, int] | None = None,
                       max_bytes: int = FULL_CHECK_MAX_BYTES) -> None:
    """Hash every local shard and list its members before training (`verify_shard_file`), so a
    corrupt or hostile shard stops the run before its first step. Each node checks its own
    copy, its ranks taking every `count`-th shard from their `index` (`part`, else
    `local_part()`); the caller makes the ranks agree (`pretrain.on_all_ranks`). Above
    `max_bytes` in all, and for remote shards, the loader's check as it reads (`slot_rows`)
    is the only one."""
    local = [s for s in shards if "://" not in s.url.removeprefix("file://")]
    index, count = part or local_part()
    total = sum(os.path.getsize(s.url.removeprefix("file://")) for s in local)
    if total > max_bytes:
        if index == 0:
            log.info("%d shards, %.1f GiB: more than %.0f GiB to hash before training, so each "
                     "is verified as the loader reads it, before its rows are used", len(local),
                     total / 2**30, max_bytes / 2**30)
        return
    for shard in local[index::count]:
        verify_shard_file(shard)


def shard_set_digest(manifest: dict, url: str, split: str = "train") -> str:
    """A hash of the `split` shards a manifest lists (names, row counts, sha256): the identity of
    a shard set wherever it is stored."""
    from common import storage
    entries = [(e["name"], int(e["num_rows"]), e.get("sha256", ""))
               for e in _manifest_entries(manifest, url)
               if e["name"].startswith(f"{split}-") and e["name"].endswith(".tar")]
    return storage.config_hash(sorted(entries))


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

@dataclass(frozen=True)
class KeyedRow:
    """A row with its identity in the data set (seeds the dynamic masks)."""
    row: Row
    shard: str
    key: str
    index: int


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


@dataclass(frozen=True)
class Remasker:
    """Dynamic masking (RoBERTa section 4.1): new masks for every row each epoch, drawn with
    `common.masking` (the MASK/SAME/RND split and whole-word groups make_shards uses).

    Candidates are all non-special tokens. Each row keeps its number of predicted positions,
    unless `recount` is set: then each instance of the row gets
    `common.masking.num_to_predict` of its own tokens.
    """
    mask_id: int
    """Id of `[MASK]`."""
    vocab_size: int
    """Random replacements are drawn from [0, vocab_size)."""
    special_ids: tuple[int, ...]
    """Ids never masked ([CLS], [SEP], [PAD])."""
    seed: int = 0
    """Seed; a row's masks depend only on (seed, epoch, row identity), not on the rank split."""
    masking: MaskingConfig = dataclasses.field(default_factory=MaskingConfig)
    """The split, whole-word masking and (with `recount`) the rate and cap."""
    recount: bool = False
    """True: `masking.masked_lm_prob` decides each instance's count; False: keep the row's."""
    subword_ids: tuple[int, ...] = ()
    """Ids of pieces that continue a word (WordPiece's `##`, a BPE piece without the space
    prefix: `common.tokenization.is_continuation`); whole-word masking joins them to the word
    before."""

    @classmethod
    def from_vocab(cls, vocab_dir: str, seed: int, masking: MaskingConfig | None = None,
                   recount: bool = False) -> Remasker:
        from common.tokenization import (
            CLS,
            MASK,
            PAD,
            SEP,
            continuation_flags,
            read_vocab,
            vocab_kind,
        )
        tokens = read_vocab(vocab_dir)
        ids = {t: i for i, t in enumerate(tokens)}
        masking = masking or MaskingConfig()
        flags = continuation_flags(tokens, vocab_kind(vocab_dir)) \
            if masking.do_whole_word_mask else []
        subwords = tuple(i for i, continues in enumerate(flags) if continues)
        return cls(ids[MASK], len(tokens), (ids[CLS], ids[SEP], ids[PAD]), seed, masking,
                   recount, subwords)

    def __call__(self, item: KeyedRow, epoch: int, rate: float | None = None) -> Row:
        """The row with new masks; `rate`: the share to predict in force (`MaskSchedule`),
        else `masking.masked_lm_prob` (with `recount`) or the row's own count."""
        row = item.row
        original = np.array(row.input_ids, dtype=np.int64)
        original[np.asarray(row.masked_lm_positions, np.int64)] = row.masked_lm_ids
        rng = np.random.default_rng([self.seed, epoch, zlib.crc32(item.shard.encode()),
                                     zlib.crc32(item.key.encode()), item.index])
        candidates = np.flatnonzero(~np.isin(original, self.special_ids))
        count = min(self._count(row, rate), len(candidates))
        if self.masking.do_whole_word_mask:
            positions = self._whole_words(original, candidates, count, rng)
        else:
            positions = np.sort(rng.choice(candidates, size=count, replace=False))
        ids = original.copy()
        replace_tokens(ids, positions, rng.random(len(positions)), self.masking, self.mask_id,
                       self.replacement_ids)
        return Row(ids, row.segment_ids, row.sequence_ids, positions, original[positions],
                   row.next_sentence_labels)

    @functools.cached_property
    def replacement_ids(self) -> np.ndarray:
        """(vocab_size,) every id: random replacements draw from the whole vocabulary."""
        return np.arange(self.vocab_size)

    @functools.cached_property
    def is_subword(self) -> np.ndarray:
        """(vocab_size,) bool: the id continues a word (`subword_ids`)."""
        flags = np.zeros(self.vocab_size, dtype=bool)
        flags[list(self.subword_ids)] = True
        return flags

    def _count(self, row: Row, rate: float | None = None) -> int:
        """Positions to predict in the row: the shards' count, or the rate's per instance."""
        if not self.recount:
            return len(row.masked_lm_positions)
        masking = self.masking if rate is None else dataclasses.replace(self.masking,
                                                                        masked_lm_prob=rate)
        lengths = np.bincount(np.asarray(row.sequence_ids, np.int64))  # (K,) tokens per instance
        return int(num_to_predict(lengths[lengths > 0], masking).sum())

    def _whole_words(self, original: np.ndarray, candidates: np.ndarray, count: int,
                     rng: np.random.Generator) -> np.ndarray:
        """Whole words in a random order, each taken unless it would exceed `count`."""
        group = word_groups(original[candidates], self.is_subword)  # (C,)
        sizes = np.bincount(group)
        chosen = take_word_groups(sizes, np.argsort(rng.random(len(sizes)), kind="stable"), count)
        return candidates[np.isin(group, chosen)]  # ascending


@dataclass(frozen=True)
class MaskSchedule:
    """Dynamic masking's share as a schedule over a phase's optimizer steps (mmBERT's 30% ->
    5%, EuroBERT's 50% -> 10%): `start` at the first step, linearly to `end` at the last."""
    start: float
    end: float
    steps: int
    """Optimizer steps of the phase."""
    micro_batches_per_step: int
    """Micro-batches of one rank per optimizer step (gradient accumulation)."""

    def rate(self, step: int) -> float:
        """The share in force at optimizer step `step` (0-based) of the phase."""
        return self.start + (self.end - self.start) * min(1.0, step / max(1, self.steps - 1))

    def rate_of_batch(self, micro_batch: int) -> float:
        """The share of the phase's micro-batch `micro_batch` (0-based, this rank's)."""
        return self.rate(micro_batch // self.micro_batches_per_step)


# ---------------------------------------------------------------- collate

def collate(rows: Sequence[Row], pad_to_multiple_of: int = 8,
            max_seq_length: int | None = None, attention_plan: bool = True,
            static: StaticShapes | None = None,
            batch_size: int | None = None) -> dict[str, torch.Tensor | BatchLayout]:
    """Rows -> the padded batch `model.heads.BertForPreTraining` takes (see its docstring),
    with its `layout` (`model.attention.BatchLayout`) worked out here on the host, with the
    per-instance attention plan if `attention_plan` (`LoaderConfig.attention_plan`).

    T = longest row rounded up to `pad_to_multiple_of` (at most `max_seq_length`); M = most
    masked positions; K = most instances per row. `next_sentence_label` is (B,) for unpacked rows,
    else (B, K) with `cls_positions` (B, K).

    `static` (`StaticShapes`): B = `batch_size` (rows past the given ones are padding: no
    token, no label), T = `max_seq_length`, M and K from `static.fit`, and the layout always
    masked, so every batch of a phase has one shape and one graph.
    """
    b = len(rows)
    longest = max(len(r.input_ids) for r in rows)
    t = -(-longest // pad_to_multiple_of) * pad_to_multiple_of
    t = min(t, max_seq_length) if max_seq_length else t
    m = max(1, max(len(r.masked_lm_positions) for r in rows))
    k = max(len(r.next_sentence_labels) for r in rows)
    if static is not None:
        if not max_seq_length or not batch_size or batch_size < b:
            raise ValueError(f"static shapes need max_seq_length and a batch_size >= the {b} "
                             f"rows, got {max_seq_length} and {batch_size}")
        b, t, (m, k) = batch_size, max_seq_length, static.fit(m, k)
    input_ids = np.zeros((b, t), np.int64)
    token_type_ids = np.zeros((b, t), np.int64)
    attention_mask = np.zeros((b, t), np.int64)
    sequence_ids = np.full((b, t), PADDING_SEQUENCE_ID, np.int64)
    position_ids = np.zeros((b, t), np.int64)
    positions = np.zeros((b, m), np.int64)
    labels = np.full((b, m), IGNORE_INDEX, np.int64)
    nsp = np.full((b, k), IGNORE_INDEX, np.int64)
    cls_positions = np.zeros((b, k), np.int64)
    for i, r in enumerate(rows):
        n, nm, nk = len(r.input_ids), len(r.masked_lm_positions), len(r.next_sentence_labels)
        input_ids[i, :n] = r.input_ids
        token_type_ids[i, :n] = r.segment_ids
        attention_mask[i, :n] = 1
        sequence_ids[i, :n] = r.sequence_ids
        position_ids[i, :n] = shard_format.position_ids(r.sequence_ids)
        positions[i, :nm] = r.masked_lm_positions
        labels[i, :nm] = r.masked_lm_ids
        nsp[i, :nk] = r.next_sentence_labels
        cls_positions[i, :nk] = np.flatnonzero(position_ids[i, :n] == 0)[:nk]
    batch = {
        "input_ids": input_ids, "token_type_ids": token_type_ids,
        "attention_mask": attention_mask, "sequence_ids": sequence_ids,
        "position_ids": position_ids, "masked_lm_positions": positions, "masked_lm_ids": labels,
    }
    if k == 1:
        batch["next_sentence_label"] = nsp[:, 0]
    else:
        batch["next_sentence_label"] = nsp
        batch["cls_positions"] = cls_positions
    tensors = {name: torch.from_numpy(a) for name, a in batch.items()}
    # The attention plan is host work: done here, in the loader's workers, not in the forward.
    layout = batch_layout(instance_ids(
        tensors["attention_mask"], tensors["sequence_ids"], tensors["input_ids"]),
        plan=attention_plan)
    # static: always masked, or a batch without padding would take a second, unmasked graph
    tensors["layout"] = BatchLayout(layout.plan, masked=True) if static is not None else layout
    return tensors


@dataclass(frozen=True)
class StaticShapes:
    """The sizes that make every batch of a phase one shape [B, T] (B = the loader's
    `batch_size`, T = its `max_seq_length`), so that a compiled step is captured once
    (`model.bert.compile_model`). Padding positions have label `IGNORE_INDEX`: the losses
    are those of the unpadded batch."""
    predictions: int
    """M: masked positions per row (`masked_lm_positions` (B, M), padding at position 0)."""
    instances: int
    """K: instances per row; 1 = unpacked rows (`next_sentence_label` (B,)), else (B, K) with
    `cls_positions` (B, K)."""

    def __post_init__(self):
        if self.predictions < 1 or self.instances < 1:
            raise ValueError(f"static shapes need predictions and instances >= 1, got "
                             f"{self.predictions} and {self.instances}")

    def fit(self, predictions: int, instances: int) -> tuple[int, int]:
        """(M, K) for a batch whose rows need up to `predictions` and `instances`: the static
        sizes; a batch past them (a packed row of unusually many short instances) takes the
        next multiple of 8 masked positions / of `instances`, which a compiled step compiles
        once more, rather than losing a label or stopping the run."""
        m, k = self.predictions, self.instances
        if predictions > m:
            m = -(-predictions // 8) * 8
        if instances > k:
            k = -(-instances // k) * k
        if (m, k) != (self.predictions, self.instances):
            log.warning("a batch needs %d masked positions and %d instances per row, past the "
                        "static shapes' %d and %d: it takes M=%d, K=%d (a compiled step "
                        "compiles once more)", predictions, instances, self.predictions,
                        self.instances, m, k)
        return m, k


STATIC_INSTANCE_TOKENS = 32
"""Packed rows under static shapes hold up to max_seq_length / this instances (16 at 512 tokens;
the books' packed shards hold at most 11 in a row, Wikipedia's 1.15 on average). Each unused
slot costs one more query through the last layer and the NSP head: little."""


def static_shapes_for(manifest: dict, max_seq_length: int) -> StaticShapes:
    """The `StaticShapes` of a phase's shards, from their manifest. Unpacked rows (`packed`:
    false) hold one instance with at most `max_predictions_per_seq` masked positions. A packed
    row's instances each round their share of it up, by at most one position each, so
    M = max_predictions_per_seq + K covers them (the books' packed rows at 512 tokens reach 78
    with max_predictions_per_seq 76)."""
    from training.memory import max_predictions

    predictions = int(manifest.get("max_predictions_per_seq") or max_predictions(max_seq_length))
    if manifest.get("packed") is False:
        return StaticShapes(predictions, 1)
    instances = max(2, max_seq_length // STATIC_INSTANCE_TOKENS)
    return StaticShapes(predictions + instances, instances)


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

    streams = tariterators.url_opener(sources, handler=_unreadable_shard)
    files = tariterators.tar_file_expander(verified(streams), handler=_unreadable_shard)
    return tariterators.group_by_keys(files, handler=_unreadable_shard)


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
            raise ValueError(f"{_location(config.source, MANIFEST_NAME)}: shards have max_seq_length "
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
        return shard_set_digest(self.manifest, _location(self.config.source, MANIFEST_NAME),
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
