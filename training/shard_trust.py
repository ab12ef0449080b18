"""The shard files a manifest lists, and the checks that they are the files it lists.

A shard folder's `manifest.json` (written last by `pipelines/make_shards.py`) names every
`{split}-NNNNNN.tar` with its row count, size and sha256 (`list_shards`, `ShardInfo`).

Trust: the loader reads a shard whole before any of its rows enters a slot's stream, hashes it
against the manifest's sha256 and lists its tar members (`check_shard_bytes`): a corrupt shard,
or one with a `../`, absolute-path or link member, stops the loader with one line naming the
shard and the member, before an optimizer step uses it. training/pretrain.py runs the same
check on every local shard before the first step (`verify_shard_files`, up to
`FULL_CHECK_MAX_BYTES`).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

from common import shard_format
from common.manifest import ShardRecord
from common.storage import MANIFEST_NAME, sha256_file

log = logging.getLogger(__name__)


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


def shard_location(source: str, name: str) -> str:
    """Where file `name` of a shard location is (a path, URL or filled-in template)."""
    if "{name}" in source:
        return source.replace("{name}", name)
    if "://" in source and not source.startswith("file://"):
        return source.rstrip("/") + "/" + name
    return os.path.join(source.removeprefix("file://"), name)


def read_shard_manifest(source: str) -> dict:
    """The `manifest.json` of a shard location (local, URL or `{name}` template)."""
    url = shard_location(source, MANIFEST_NAME)
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


def _split_records(manifest: dict, url: str, split: str) -> list[ShardRecord]:
    """The `split` shards a manifest lists (`{split}-*.tar`), each with its row count, by name."""
    shards = manifest.get("shards")
    if isinstance(shards, dict):  # {name: {num_rows: ...}}
        shards = [{"name": k, **v} for k, v in shards.items()]
    if not isinstance(shards, list):
        raise ValueError(f"{url}: manifest has no 'shards' list")  # noqa: TRY004 (a bad file)
    records = []
    for i, entry in enumerate(shards):
        if not (entry.get("name") or entry.get("file") or entry.get("path")) \
                or "num_rows" not in entry:
            raise ValueError(f"{url}: shard entry {i} lacks 'name' or 'num_rows': {entry}")
        records.append(ShardRecord.from_json(entry))
    return sorted((r for r in records
                   if r.name.startswith(f"{split}-") and r.name.endswith(".tar")),
                  key=lambda r: r.name)


def list_shards(source: str, split: str = "train") -> tuple[list[ShardInfo], dict]:
    """The `split` shards of a location with their row counts, and the manifest."""
    manifest = read_shard_manifest(source)
    records = _split_records(manifest, shard_location(source, MANIFEST_NAME), split)
    if not records:
        raise FileNotFoundError(f"{shard_location(source, MANIFEST_NAME)}: no {split}-*.tar shards listed")
    shards = [ShardInfo(r.name, shard_location(source, r.name), r.num_rows, i, r.num_bytes,
                        r.sha256) for i, r in enumerate(records)]
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


def unreadable_shard(exn: Exception) -> bool:
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
    `max_bytes` in all, and for remote shards, the loader's check as it reads
    (`training.loader.slot_items`) is the only one."""
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
    entries = [(r.name, r.num_rows, r.sha256 or "") for r in _split_records(manifest, url, split)]
    return storage.config_hash(sorted(entries))

