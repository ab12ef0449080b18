"""Pre-training checkpoints: writing them, finding the one to resume, loading, converting
(universal, fp32) them, and refusing a file that would run code when loaded.

Layout: `<output_dir>/checkpoints/<tag>/` holds DeepSpeed's files (`mp_rank_00_model_states.pt`,
per-rank `*optim_states.pt`), `training_state.json`, per-rank `rng_rank*.pt`, `config.json` and
`checksums.json`; `checkpoints/latest` names the newest tag. A checkpoint is written to
`checkpoints/.tmp-<tag>`, renamed to `<tag>` when every rank is done, and only then is `latest`
replaced (atomically); the oldest beyond `keep_checkpoints` are deleted. A write that fails on any
rank (a full disk: one line naming the folder, the space the previous checkpoint took and what is
left) fails every rank, removes the temporary folder and leaves `latest` naming the previous
checkpoint. `engine.save_checkpoint` ends with a barrier; a rank whose write failed joins it
before the ranks compare outcomes. (A failure before DeepSpeed's first barrier, or in its tag
check, is not paired so; a full disk does not fail there.)

Trust. DeepSpeed reads its files with `torch.load(..., weights_only=False)`: a pickle planted in
a checkpoint folder (a shared volume, a checkpoint copied from elsewhere) would run its code on
resume, on conversion to a universal checkpoint and on the fp32 export. So before any of those
reads (resume, `to_universal`, `consolidated_state_dict`, hence phase 2's start and the export):
- every `.pt` file of the folder is loaded with `weights_only=True` (memory-mapped: only the
  pickle is read, not the tensor data), allowing tensors, plain data and the few DeepSpeed classes
  its files hold (`deepspeed_globals`, found on checkpoints of ZeRO stages 0-3 in fp32 and bf16);
- the files must match `checksums.json` (sha256 and size of every file, written by rank 0 after
  every rank has saved and before the rename; the universal folder gets its own after
  conversion). A checkpoint without one (written by code without checksums) relies on the scan alone.
  Cost, measured here: 0.02 s to write and 0.03 s to verify the tiny ZeRO-1 checkpoint (12 MB);
  hashing runs at ~350 MB/s on one busy core (0.54 s for a 200 MB file), the scan takes under
  10 ms a file, so a 6 GB BERT-large checkpoint costs ~20 s on rank 0 at each save and resume.
A file that fails either is refused with one line naming it (a ValueError: exit 2). And DeepSpeed's
reads themselves run under `weights_only_loads` (`TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` and the same
allow-list, also in the ds_to_universal subprocess), so a file replaced between the check and the
read (the check-to-use window) still cannot run code: it fails to load, naming the folder. What
this does not stop: someone who can write the folder can replace weights with other tensors
and rewrite checksums.json to match; the checksums catch corruption and careless copies, not an
attacker with write access, against whom only the folder's permissions help.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import pickletools
import random
import re
import shutil
import subprocess
import sys
import warnings
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from common import logs, storage
from common.errors import DiskFullError, disk_full, free_bytes
from training import config as cfg
from training.config import PhaseConfig, PretrainConfig
from training.loader import ShardLoader
from training.ranks import Dist, on_all_ranks

log = logging.getLogger("training.checkpoint")
CHECKPOINTS = "checkpoints"
LATEST = "latest"
STATE_FILE = "training_state.json"
CHECKSUMS = "checksums.json"
FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
REFUSED = 3
"""The exit status of `python -m training.checkpoint` refusing a file (argparse takes 2)."""
FULL_BELOW = 1 << 20
"""Free bytes under which a failed torch write counts as a full disk: torch's zip writer reports
ENOSPC as a RuntimeError without the errno, after filling the device to its last blocks."""


class UntrustedCheckpointError(ValueError):
    """A checkpoint file refused before loading: it could run code, or differs from the
    checksums written with it. One line naming the file."""


@dataclass(frozen=True)
class CheckpointState:
    """What `training_state.json` in a checkpoint records."""
    tag: str
    phase_index: int
    phase: str
    step: int
    world_size: int
    zero_stage: int
    loader: dict
    train_shards: str = ""
    """`loader.shard_set_digest` of the phase's train shards; empty where a checkpoint does not
    record it, and then not checked."""


TAG = re.compile(r"\d{2}-[^/\\\x00]+-step\d{8}")
"""What `checkpoint_tag` writes: one folder name below the checkpoints folder."""


def checkpoint_tag(phase_index: int, phase: PhaseConfig, step: int) -> str:
    return f"{phase_index:02d}-{phase.name}-step{step:08d}"


def phase_index_of(tag: str) -> int:
    """The phase index a `checkpoint_tag` names ("01-phase2-step00000060" -> 1)."""
    return int(tag.split("-", 1)[0])


def latest_tag(ckpt_dir: str) -> str | None:
    """The tag `latest` names, or None for a fresh run; nothing in the checkpoint is read."""
    latest = os.path.join(ckpt_dir, LATEST)
    if not os.path.exists(latest):
        return None
    with open(latest, encoding="utf-8") as f:
        tag = f.read().strip()
    if not TAG.fullmatch(tag):  # a planted `latest` must not lead outside the folder
        raise UntrustedCheckpointError(f"{latest}: refused: {tag[:80]!r} is no checkpoint tag "
                                       "of this run (NN-<phase>-stepNNNNNNNN)")
    return tag


def read_state(ckpt_dir: str, tag: str) -> CheckpointState:
    """What `training_state.json` of `tag` records; call it once the folder is verified."""
    with open(os.path.join(ckpt_dir, tag, STATE_FILE), encoding="utf-8") as f:
        state = json.load(f)
    return CheckpointState(tag=tag, **state)


def read_latest(ckpt_dir: str) -> CheckpointState | None:
    """The state of the checkpoint `latest` names, its folder verified first
    (`verify_once`), or None for a fresh run."""
    tag = latest_tag(ckpt_dir)
    if tag is None:
        return None
    verify_once(os.path.join(ckpt_dir, tag))
    return read_state(ckpt_dir, tag)


# ---------------------------------------------------------------- writing

def save_checkpoint(engine, config: PretrainConfig, phase_index: int, phase: PhaseConfig,
                    step: int, loader: ShardLoader, dist: Dist) -> str:
    """Write checkpoint `<tag>` atomically (temp dir, checksums, rename, then `latest`); keep
    the last K. Fails on every rank, `latest` untouched and the temp dir removed, if a write
    fails on any."""
    ckpt_dir = os.path.join(config.output_dir, CHECKPOINTS)
    tag = checkpoint_tag(phase_index, phase, step)
    tmp = os.path.join(ckpt_dir, f".tmp-{tag}")
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed attempt
    torch.distributed.barrier()
    state = {"phase_index": phase_index, "phase": phase.name, "step": step,
             "world_size": dist.world_size, "zero_stage": config.engine.zero_stage,
             "loader": loader.state_dict(), "train_shards": loader.shard_set_digest()}

    def finish() -> None:  # rank 0, once every rank's files are in
        if dist.is_main:
            storage.atomic_write_json(os.path.join(tmp, STATE_FILE), state)
            cfg.save(config, os.path.join(tmp, "config.json"))
            write_checksums(tmp)
            final = os.path.join(ckpt_dir, tag)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(tmp, final)
            storage.atomic_write_text(os.path.join(ckpt_dir, LATEST), tag)

    try:
        on_all_ranks(dist, lambda: write_rank_files(engine, ckpt_dir, tag, state, dist))
        on_all_ranks(dist, finish)
    except BaseException:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dist.is_main:
        prune_checkpoints(ckpt_dir, config.cadence.keep_checkpoints, keep=tag)
    torch.distributed.barrier()
    return tag


STALE = re.compile(r"\.tmp-.+|\.fp32-.+\.pt|\.(latest|\.fp32-.+\.pt)\..+\.tmp")
"""What a killed run leaves in the checkpoints folder: a checkpoint's temporary folder
(`.tmp-<tag>`, `.tmp-<tag>-universal`), a consolidation's file (`.fp32-<tag>.pt`), and the
temporary files of the atomic writes of `latest` and of that file (`storage.atomic_open`:
`.latest.<random>.tmp`, `..fp32-<tag>.pt.<random>.tmp`)."""


def remove_stale_files(ckpt_dir: str) -> list[str]:
    """Remove what a killed run left in `ckpt_dir` (rank 0, before the run writes): the names
    `STALE` matches, nothing else. Returns the names removed."""
    if not os.path.isdir(ckpt_dir):
        return []
    stale = sorted(name for name in os.listdir(ckpt_dir) if STALE.fullmatch(name))
    for name in stale:
        path = os.path.join(ckpt_dir, name)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
        log.info("removed %s, left by a killed run", path)
    return stale


def write_rank_files(engine, ckpt_dir: str, tag: str, state: dict, dist: Dist) -> None:
    """This rank's DeepSpeed files and RNG state, into `.tmp-<tag>`."""
    tmp = os.path.join(ckpt_dir, f".tmp-{tag}")
    try:
        engine.save_checkpoint(ckpt_dir, tag=f".tmp-{tag}",
                               client_state={**state, **universal_info()}, save_latest=False)
    except Exception as e:
        torch.distributed.barrier()  # the one save_checkpoint ends with, where the others wait
        raise_if_disk_full(e, os.path.join(ckpt_dir, tag), ckpt_dir)
        raise
    try:
        torch.save(rng_state(), os.path.join(tmp, f"rng_rank{dist.rank:03d}.pt"))
    except Exception as e:
        raise_if_disk_full(e, os.path.join(ckpt_dir, tag), ckpt_dir)
        raise


def raise_if_disk_full(error: Exception, folder: str, ckpt_dir: str) -> None:
    """A DiskFullError naming `folder`, the checkpoint being written (its temporary folder is
    removed), with the previous checkpoint's size as the space needed, if `error` is a full disk: ENOSPC anywhere in its chain, or torch's errno-less
    write error with the device's last megabyte gone."""
    left = free_bytes(folder)
    if disk_full(error) is not None or (isinstance(error, RuntimeError) and left is not None
                                        and left < FULL_BELOW):
        raise DiskFullError(folder, previous_size(ckpt_dir)) from error


def previous_size(ckpt_dir: str) -> int | None:
    """Bytes of the checkpoint `latest` names (a new one of the same run is as large)."""
    try:
        with open(os.path.join(ckpt_dir, LATEST), encoding="utf-8") as f:
            folder = os.path.join(ckpt_dir, f.read().strip())
        return sum(os.path.getsize(os.path.join(root, name))
                   for root, _, names in os.walk(folder) for name in names) or None
    except OSError:
        return None


def universal_info() -> dict:
    """What ds_to_universal needs to find in a checkpoint: data parallelism only, so no tensor-
    or pipeline-parallel merge patterns, just the format version."""
    from deepspeed.checkpoint.constants import (
        UNIVERSAL_CHECKPOINT_INFO,
        UNIVERSAL_CHECKPOINT_VERSION_KEY,
        UNIVERSAL_CHECKPOINT_VERSION_VALUE,
    )
    return {UNIVERSAL_CHECKPOINT_INFO: {
        UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}}


def prune_checkpoints(ckpt_dir: str, count: int, keep: str) -> None:
    tags = sorted(t for t in os.listdir(ckpt_dir)
                  if not t.startswith(".") and os.path.isfile(os.path.join(ckpt_dir, t, STATE_FILE)))
    for tag in tags[:-count]:
        if tag != keep:
            shutil.rmtree(os.path.join(ckpt_dir, tag), ignore_errors=True)
            shutil.rmtree(os.path.join(ckpt_dir, f"{tag}-universal"), ignore_errors=True)


# ---------------------------------------------------------------- trust

def folder_files(folder: str) -> list[str]:
    """Paths of every file under `folder`, relative to it, sorted."""
    return sorted(os.path.relpath(os.path.join(root, name), folder)
                  for root, _, names in os.walk(folder) for name in names)


def write_checksums(folder: str) -> None:
    """`<folder>/checksums.json`: sha256 and size of every other file in it (atomically)."""
    files = {rel: {"sha256": storage.sha256_file(os.path.join(folder, rel)),
                   "size": os.path.getsize(os.path.join(folder, rel))}
             for rel in folder_files(folder) if rel != CHECKSUMS}
    storage.atomic_write_json(os.path.join(folder, CHECKSUMS), {"files": files})


def verify_checkpoint(folder: str) -> None:
    """Refuse (a one-line ValueError naming the file) a checkpoint folder with a `.pt` file
    that holds objects other than tensors and plain data, or files that differ from its
    checksums.json."""
    for rel in folder_files(folder):
        if rel.endswith(".pt"):
            check_pickle(os.path.join(folder, rel))
    check_checksums(folder)


def check_pickle(path: str) -> None:
    """Load `path` with weights_only=True (memory-mapped: the pickle is read, not the data)."""
    try:
        with torch.serialization.safe_globals(deepspeed_globals()), warnings.catch_warnings():
            # a raw pickle's protocol warning would stand above the refusal's one line
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            torch.load(path, map_location="cpu", weights_only=True, mmap=zipfile.is_zipfile(path))
    except pickle.UnpicklingError as e:
        raise UntrustedCheckpointError(f"{path}: refused: {untrusted(e)}") from None
    except (RuntimeError, OSError, EOFError) as e:
        raise UntrustedCheckpointError(f"{path}: refused: not a readable torch file "
                         f"({first_line(e)})") from None


def untrusted(error: BaseException) -> str:
    """Why torch's weights_only unpickler refused a file, in one line. Torch's own message
    opens with the advice to load it again with weights_only=False, which would run whatever
    the file holds: only the reason it names is kept."""
    found = re.search(r"GLOBAL ([\w.]+)", str(error))
    what = (f"holds objects other than tensors and plain data (global {found.group(1)})"
            if found else
            f"is not a torch.save file of tensors and plain data ({unsupported(error)})")
    return (f"this checkpoint file {what}; it may have been planted, and loading it could run "
            "code. Resume from a checkpoint you trust, or start a new output_dir")


def unsupported(error: BaseException) -> str:
    """The reason torch's weights_only unpickler gives below its advice, e.g. `pickle opcode
    FRAME, ...` for a raw pickle of protocol 4 or later (torch.save writes protocol 2)."""
    text = str(error)
    operand = re.search(r"Unsupported operand (\d+)", text)
    if operand:
        code = int(operand.group(1))
        opcode = pickletools.code2op.get(chr(code)) if code < 256 else None
        name = opcode.name if opcode else str(code)
        return f"pickle opcode {name}, which torch's weights-only loader does not read"
    reason = re.search(r"WeightsUnpickler error:\s*(\S[^\n]*)", text)
    return reason.group(1).strip() if reason else "refused by torch's weights-only loader"


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def check_checksums(folder: str) -> None:
    """Every file in `folder` listed in its checksums.json with the same size and sha256, and
    every listed file present; nothing to check where the checkpoint has no checksums.json."""
    path = os.path.join(folder, CHECKSUMS)
    if not os.path.exists(path):
        return
    try:
        listed = storage.read_json(path)["files"]
    except (ValueError, KeyError, TypeError) as e:
        raise UntrustedCheckpointError(f"{path}: refused: not a checksum list ({first_line(e)})") from None
    present = [rel for rel in folder_files(folder) if rel != CHECKSUMS]
    for rel in present:
        file = os.path.join(folder, rel)
        entry = listed.get(rel)
        if entry is None:
            raise UntrustedCheckpointError(f"{file}: refused: not in {path}, which lists the files written "
                             "with the checkpoint; it may have been planted")
        if os.path.getsize(file) != entry.get("size") or \
                storage.sha256_file(file) != entry.get("sha256"):
            raise UntrustedCheckpointError(f"{file}: refused: its size or sha256 differs from {path}, "
                             "recorded when the checkpoint was written: changed since (it may "
                             "have been planted). Resume from a checkpoint you trust")
    missing = sorted(set(listed) - set(present))
    if missing:
        raise UntrustedCheckpointError(f"{os.path.join(folder, missing[0])}: missing, but listed in {path}: "
                         "the checkpoint is incomplete")


def deepspeed_globals() -> list:
    """The classes DeepSpeed 0.19's checkpoint files hold besides tensors and plain data (on
    checkpoints of ZeRO stages 0-3 in fp32 and bf16; the fp16 loss scaler too)."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address
    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


@contextlib.contextmanager
def weights_only_loads(folder: str) -> Iterator[None]:
    """Every `torch.load` in the block, DeepSpeed's `weights_only=False` ones included, loads
    with weights_only=True (torch's TORCH_FORCE_WEIGHTS_ONLY_LOAD), `deepspeed_globals`
    allowed; a refusal is a one-line ValueError naming `folder`."""
    previous = os.environ.get(FORCE_WEIGHTS_ONLY)
    os.environ[FORCE_WEIGHTS_ONLY] = "1"
    try:
        with torch.serialization.safe_globals(deepspeed_globals()):
            yield
    except pickle.UnpicklingError as e:
        raise UntrustedCheckpointError(f"{folder}: refused: {untrusted(e)}") from None
    finally:
        if previous is None:
            os.environ.pop(FORCE_WEIGHTS_ONLY, None)
        else:
            os.environ[FORCE_WEIGHTS_ONLY] = previous


_verified: dict[str, tuple] = {}
"""Folders this process verified, with what `os.stat` said of each file then."""


def file_signature(folder: str) -> tuple:
    """Name, size, mtime and inode of every file under `folder`: a file written or replaced
    since changes it."""
    return tuple((rel, st.st_size, st.st_mtime_ns, st.st_ino) for rel in folder_files(folder)
                 for st in (os.stat(os.path.join(folder, rel)),))


def verify_once(folder: str) -> None:
    """`verify_checkpoint(folder)`, unless this process verified it already and no file in it
    changed since: a resume verifies its checkpoint before reading its state and config, and
    hashing it again to load it would cost as much (~20 s for BERT-large)."""
    signature = file_signature(folder) if os.path.isdir(folder) else None
    if signature is not None and _verified.get(folder) == signature:
        return
    verify_checkpoint(folder)
    if signature is not None:
        _verified[folder] = signature


def verified(folder: str, dist: Dist | None = None) -> None:
    """`verify_once(folder)` on rank 0, its refusal raised on every rank."""
    if dist is None:
        verify_once(folder)
    else:
        on_all_ranks(dist, lambda: verify_once(folder) if dist.is_main else None)


# ---------------------------------------------------------------- reading

def load_checkpoint(engine, config: PretrainConfig, state: CheckpointState, loader: ShardLoader,
                    dist: Dist, universal: bool) -> int:
    """Restore engine (weights, optimizer, scheduler), RNG and loader; returns the step."""
    ckpt_dir = os.path.join(config.output_dir, CHECKPOINTS)
    tag = f"{state.tag}-universal" if universal else state.tag
    folder = os.path.join(ckpt_dir, tag)
    verified(folder, dist)
    with weights_only_loads(folder):
        path, _ = engine.load_checkpoint(ckpt_dir, tag=tag, load_optimizer_states=True,
                                         load_lr_scheduler_states=True)
    if path is None:
        raise FileNotFoundError(f"{ckpt_dir}/{tag}: DeepSpeed found no checkpoint to load")
    loader.load_state_dict(state.loader)
    rng_file = os.path.join(ckpt_dir, state.tag, f"rng_rank{dist.rank:03d}.pt")
    if os.path.exists(rng_file) and state.world_size == dist.world_size:
        set_rng_state(torch.load(rng_file, weights_only=True))
    return state.step


def has_partitioned_state(ckpt_dir: str, tag: str) -> bool:
    """Whether optimizer state is split by rank (ZeRO >= 1: per-rank `*optim_states.pt` files)."""
    return any("optim_states" in name for name in os.listdir(os.path.join(ckpt_dir, tag)))


def to_universal(ckpt_dir: str, tag: str, dist: Dist) -> None:
    """Convert `<tag>` once to `<tag>-universal` with DeepSpeed's ds_to_universal (rank 0, in a
    subprocess that loads under `weights_only_loads`), after verifying `<tag>`; the result gets
    its own checksums.json."""
    out = os.path.join(ckpt_dir, f"{tag}-universal")

    def convert() -> None:
        if not dist.is_main or os.path.isdir(out):
            return
        source = os.path.join(ckpt_dir, tag)
        verify_once(source)
        tmp = os.path.join(ckpt_dir, f".tmp-{tag}-universal")
        shutil.rmtree(tmp, ignore_errors=True)
        done = subprocess.run([sys.executable, "-m", "training.checkpoint", "--input_folder",
                               source, "--output_folder", tmp, "--num_extract_workers", "1",
                               "--num_merge_workers", "1"], stderr=subprocess.PIPE, text=True,
                              check=False)
        if done.returncode == REFUSED:  # the last line is our refusal, naming the folder
            raise UntrustedCheckpointError(done.stderr.strip().splitlines()[-1].split(
                "error: ", 1)[-1])
        sys.stderr.write(done.stderr)
        done.check_returncode()
        write_checksums(tmp)
        os.replace(tmp, out)

    on_all_ranks(dist, convert)


def consolidated_state_dict(ckpt_dir: str, tag: str) -> dict[str, torch.Tensor]:
    """fp32 weights of a checkpoint of any ZeRO stage, in our model's keys (after verifying it)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    folder = os.path.join(ckpt_dir, tag)
    verify_checkpoint(folder)
    zero_files = [f for f in os.listdir(folder) if "optim_states" in f]
    if zero_files:
        with weights_only_loads(folder), logs.quiet_output():  # DeepSpeed prints its steps
            state = get_fp32_state_dict_from_zero_checkpoint(ckpt_dir, tag=tag)
    else:  # zero_stage 0, fp32 only (config.py refuses bf16/fp16 there): full-precision module
        module = torch.load(os.path.join(folder, "mp_rank_00_model_states.pt"),
                            map_location="cpu", weights_only=True)["module"]
        low = sorted({str(v.dtype) for v in module.values()
                      if v.is_floating_point() and v.dtype != torch.float32})
        if low:
            raise ValueError(f"{ckpt_dir}/{tag}: a ZeRO stage-0 checkpoint with {low} weights; "
                             "its fp32 master weights are not in the module states "
                             "(see training/config.py LOW_PRECISION_ZERO0_MESSAGE)")
        state = module
    return {k: v.float().contiguous() for k, v in state.items()}


def shared_consolidated_state_dict(ckpt_dir: str, tag: str, dist: Dist) -> dict[str, Tensor]:
    """`consolidated_state_dict` of `tag` on every rank, consolidated once: rank 0 reads the
    ZeRO shards (all ranks' optimizer-state files: BERT-large's 8 ranks hold ~4.7 GB) and writes
    the fp32 weights to `<ckpt_dir>/.fp32-<tag>.pt` (atomically), every rank loads that file
    (1.3 GB for BERT-large, from the page cache), and rank 0 removes it. Every rank consolidating
    would read all shards once per rank and hold them in host memory at the same time. The
    checkpoint folder is already on storage every node shares (every rank writes its shard into
    it), so the file is too. Errors on rank 0 reach every rank (`on_all_ranks`), so none waits."""
    if dist.world_size == 1:
        return consolidated_state_dict(ckpt_dir, tag)
    path = os.path.join(ckpt_dir, f".fp32-{tag}.pt")

    def consolidate() -> None:
        if dist.is_main:
            log.info("consolidating %s once, on rank 0, for %d ranks", tag, dist.world_size)
            with storage.atomic_open(path, "wb") as f:
                torch.save(consolidated_state_dict(ckpt_dir, tag), f)

    on_all_ranks(dist, consolidate)
    loaded: dict[str, dict[str, Tensor]] = {}

    def load() -> None:
        loaded["state"] = torch.load(path, map_location="cpu", weights_only=True)

    on_all_ranks(dist, load)  # every rank has read the file before rank 0 removes it
    if dist.is_main:
        os.unlink(path)
    return loaded["state"]


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


@contextlib.contextmanager
def rng_untouched() -> Iterator[None]:
    """The block's draws leave the random streams a checkpoint saves (`rng_state`) as they
    were: an export builds (and so initialises) a model between a checkpoint and the next step,
    and a probe must not change what the run trains nor a resumed run differ from one never
    stopped."""
    state = rng_state()
    try:
        yield
    finally:
        set_rng_state(state)


def main(argv: list[str] | None = None) -> None:
    """`python -m training.checkpoint --input_folder ... --output_folder ...`: DeepSpeed's
    ds_to_universal with its loads under `weights_only_loads`; a refusal prints one line and
    exits REFUSED."""
    from deepspeed.checkpoint import ds_to_universal
    sys.argv = [ds_to_universal.__file__, *(sys.argv[1:] if argv is None else argv)]
    args = ds_to_universal.parse_arguments()
    try:
        with weights_only_loads(args.input_folder):
            ds_to_universal.main(args)
    except UntrustedCheckpointError as e:
        print(f"ds_to_universal: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(REFUSED) from None


if __name__ == "__main__":
    main()
