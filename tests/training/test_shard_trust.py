"""Shards that cannot be trusted are refused before any of their rows is trained on: a shard
whose bytes no longer hash to the manifest's sha256 (4 KB flipped), and a shard with a `../`,
absolute-path or symlink member (its sha256 the manifest's). One line names the shard and the
member; `bert-pretrain` stops before its first step."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import logging
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from common import shard_format
from tests.training.loader_shards import SEQ, _row_key, _shards
from tests.training.pretrain_runs import REPO, make_config, subprocess_env
from training import config as cfg
from training import pretrain
from training.loader import LoaderConfig, ShardLoader

HINT = "check the folder with `python -m pipelines.verify_shards <folder>`"


def _flip(path: Path, start: int, size: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    data[start:start + size] = bytes(b ^ 0xFF for b in data[start:start + size])
    path.write_bytes(bytes(data))


def _member_at(path: Path, offset: int) -> tarfile.TarInfo:
    """The member whose header or data holds byte `offset` of a tar file."""
    with tarfile.open(path) as tar:
        return next(m for m in tar.getmembers() if m.offset <= offset < m.offset_data + m.size)


def _flip_middle(path: Path) -> str:
    """Flip 4 KB in the middle of a shard, inside one member's data; that member's key."""
    member = _member_at(path, path.stat().st_size // 2)
    start = max(member.offset_data, path.stat().st_size // 2 - 2048)
    assert start + 4096 <= member.offset_data + member.size, "the member is under 4 KB"
    _flip(path, start)
    return member.name.removesuffix(".rows.npz")


def _changed(path: Path, manifest_sha256: str) -> str:
    """The tail of the message for a shard that no longer hashes to its manifest's sha256."""
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    return (f"sha256 {got[:12]}, the manifest records {manifest_sha256[:12]}: the shard changed "
            f"since it was written; {HINT}")


def _sha256_in_manifest(folder: Path, name: str) -> str:
    manifest = json.loads((folder / "manifest.json").read_text())
    return next(e["sha256"] for e in manifest["shards"] if (e.get("name") or e["file"]) == name)


def _error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("bert-pretrain: error")]


def _bert_pretrain(config: cfg.PretrainConfig, path: Path) -> subprocess.CompletedProcess:
    path.write_text(yaml.safe_dump(cfg.to_dict(config)))
    return subprocess.run([sys.executable, "-m", "training.pretrain", "--config", str(path)],
                          capture_output=True, text=True, timeout=600, cwd=REPO,
                          env=subprocess_env(), check=False)


def test_a_corrupt_shard_stops_bert_pretrain_before_its_first_step(data, tmp_path):
    """4 KB flipped in the middle of a shard the loader reads late (last of its slot): the run
    exits 2 before step 1 with one line naming the shard and the member that no longer
    decodes; nothing is trained or written."""
    shards = tmp_path / "shards"
    shutil.copytree(data["learn"], shards)
    out = tmp_path / "run"
    config = make_config(data, out, shards="learn", steps=2)
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(shards)),))
    plan = ShardLoader(pretrain.build_loader(config, config.phases[0],
                                             pretrain.Dist(0, 1, on_gpu=False))).plan(0)
    late = Path(plan.slots[0][-1].url)
    assert len(plan.slots[0]) == 2 and late.name != plan.slots[0][0].name
    key = _flip_middle(late)
    done = _bert_pretrain(config, tmp_path / "run.yaml")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = _error_lines(done.stderr)
    assert len(lines) == 1, done.stderr[-3000:]
    assert re.fullmatch(
        rf"bert-pretrain: error: {re.escape(str(late))}: member {key}: cannot decode rows "
        rf"\(\w+: .+\); {re.escape(_changed(late, _sha256_in_manifest(shards, late.name)))}",
        lines[0]), lines[0]
    assert not (out / "metrics.jsonl").exists()
    assert not (out / "checkpoints").exists()


def test_a_corrupt_validation_shard_stops_the_run_before_its_first_step(data, tmp_path):
    """4 KB flipped in the validation shard of a run that checkpoints at step 1 and evaluates
    at step 2: the run stops before step 1, naming the shard and its broken member, with no
    checkpoint, metrics or config written (not at its first evaluation, after checkpoints)."""
    shards = tmp_path / "shards"
    shutil.copytree(data["uneven"], shards)
    bad = shards / "validation-000000.tar"
    key = _flip_middle(bad)
    out = tmp_path / "run"
    config = make_config(data, out, steps=2, cadence={"checkpoint_every": 1})
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(shards)),))
    with pytest.raises(ValueError) as error:
        pretrain.run(config)
    assert re.fullmatch(
        rf"{re.escape(str(bad))}: member {key}: cannot decode rows \(\w+: .+\); "
        rf"{re.escape(_changed(bad, _sha256_in_manifest(shards, bad.name)))}",
        str(error.value)), str(error.value)
    assert not out.exists() or list(out.iterdir()) == []


@pytest.mark.parametrize("where", ["data", "header"])
@pytest.mark.parametrize("num_workers", [0, 1])
def test_the_loader_yields_no_row_of_a_corrupt_shard(books, tmp_path, where, num_workers):
    """Without the check before training (a remote shard, or more bytes than
    FULL_CHECK_MAX_BYTES), the loader checks each shard as it reads it: the rows of the shard
    before it, then one line naming the corrupt shard and the broken member; none of its rows.
    4 KB flipped in a member's data (its npz no longer decodes) or over a member's tar header
    (which tarfile alone would take for the end of the shard, dropping its rows silently)."""
    _, rows = books
    folder = _shards(books, tmp_path / "s", [48, 48, 48])
    bad = folder / "train-000001.tar"
    manifest_sha256 = _sha256_in_manifest(folder, bad.name)
    if where == "data":
        key = _flip_middle(bad)
        message = (rf"{re.escape(str(bad))}: member {key}: cannot decode rows \(\w+: .+\); "
                   + re.escape(_changed(bad, manifest_sha256)))
    else:
        with tarfile.open(bad) as tar:
            first, second = tar.getmembers()[:2]
        _flip(bad, second.offset)
        message = re.escape(f"{bad}: cannot read the shard (ReadError: a broken tar header at "
                             f"byte {second.offset}, after member "
                             f"{first.name.removesuffix('.rows.npz')}); it is truncated or "
                             f"corrupt: {HINT}")
    loader = ShardLoader(LoaderConfig(str(folder), 4, SEQ, shuffle_buffer=0,
                                      num_workers=num_workers))
    seen = []
    with pytest.raises(ValueError) as error:
        for batch in loader:
            seen += [_row_key(batch, i) for i in range(batch["input_ids"].shape[0])]
    assert re.fullmatch(message, str(error.value)), str(error.value)
    assert seen == [tuple(r.input_ids.tolist()) for r in rows[:48]]  # shard 0's, in order


def test_shards_are_checked_before_training_split_between_a_nodes_ranks(books, tmp_path,
                                                                        caplog):
    """`verify_shard_files`: rank i of n on a node checks every n-th shard from i (a corrupt
    shard 1 is found by the rank of index 1 of 2, not by index 0); above `max_bytes` in all,
    none is hashed up front and a line says the loader checks them as it reads them."""
    from training.shard_trust import list_shards, verify_shard_files

    folder = _shards(books, tmp_path / "s", [48, 48, 48])
    bad = folder / "train-000001.tar"
    key = _flip_middle(bad)
    shards, _ = list_shards(str(folder))
    verify_shard_files(shards, part=(0, 2))
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: member {key}: cannot decode"):
        verify_shard_files(shards, part=(1, 2))
    total = sum(p.stat().st_size for p in folder.glob("train-*.tar"))
    with caplog.at_level(logging.INFO, logger="training.shard_trust"):
        verify_shard_files(shards, part=(0, 1), max_bytes=total - 1)
    assert [r.getMessage() for r in caplog.records] == [
        (f"3 shards, {total / 2**30:.1f} GiB: more than 0 GiB to hash before training, so each "
         "is verified as the loader reads it, before its rows are used")]


HOSTILE = {
    # kind: (the member's name, or the link's name and target; what the refusal says)
    "dotdot": ("../evil.rows.npz", "has a '..' in its name"),
    "absolute": ("{outside}/evil.rows.npz", "has an absolute name"),
    "symlink": ("000001-000001.rows.npz", "is a symbolic link to '{outside}/evil.rows.npz'"),
}


def _hostile_shards(books, folder: Path, kind: str, outside: Path) -> str:
    """Shards 0 and 1 of 16 rows, shard 1 rewritten with a `kind` member after its block and a
    manifest entry that matches it (sha256; the rows webdataset reads from it): the refusal
    message expected."""
    vocab_dir, rows = books
    vocab_size = len((vocab_dir / "vocab.txt").read_text().split())
    _shards(books, folder, [16, 16])
    name, problem = (s.format(outside=outside) for s in HOSTILE[kind])
    shard = folder / "train-000001.tar"
    with tarfile.open(shard, "w", format=tarfile.USTAR_FORMAT) as tar:
        block = shard_format.encode_block(list(rows[16:32]), vocab_size)
        info = tarfile.TarInfo("000001-000000.rows.npz")
        info.size = len(block)
        tar.addfile(info, io.BytesIO(block))
        info = tarfile.TarInfo(name)
        if kind == "symlink":
            info.type, info.linkname = tarfile.SYMTYPE, str(outside / "evil.rows.npz")
            tar.addfile(info)
        else:
            evil = shard_format.encode_block(list(rows[32:48]), vocab_size)
            info.size = len(evil)
            tar.addfile(info, io.BytesIO(evil))
    with tarfile.open(shard) as tar:
        assert [m.name for m in tar.getmembers()] == ["000001-000000.rows.npz", name]
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest["shards"][1]
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    entry["num_rows"] = entry["num_instances"] = 16 if kind == "symlink" else 32
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return (f"{shard}: member {name!r} {problem}: refused (a shard holds regular files "
                   f"with relative names only); {HINT}")


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_a_shard_with_a_hostile_member_is_refused_naming_it(books, data, tmp_path, kind):
    """`../`, absolute-path and symlink members (the manifest's sha256 matching): refused before
    training and by the loader, in one line naming the member; no row of the shard is yielded
    and nothing is written outside the shard folder."""
    outside = tmp_path / "outside"
    folder = tmp_path / "work" / "shards"
    message = _hostile_shards(books, folder, kind, outside)
    config = make_config(data, tmp_path / "run", steps=2, data={"num_workers": 0})
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(folder)),))
    with pytest.raises(ValueError) as error:
        pretrain.check_phase_inputs(config)
    assert str(error.value) == message
    for workers in (0, 1):
        loader = ShardLoader(LoaderConfig(str(folder), 4, SEQ, shuffle_buffer=0,
                                          num_workers=workers))
        seen = []
        with pytest.raises(ValueError) as error:
            for _, batch in zip(range(50), loader):
                seen += [_row_key(batch, i) for i in range(batch["input_ids"].shape[0])]
        assert str(error.value) == message
        assert seen == [tuple(r.input_ids.tolist()) for r in books[1][:16]]  # shard 0's
    if kind == "symlink":  # the whole path once: one line from `bert-pretrain`, exit 2
        done = _bert_pretrain(config, tmp_path / "run.yaml")
        assert done.returncode == 2, done.stderr[-3000:]
        assert _error_lines(done.stderr) == [f"bert-pretrain: error: {message}"], done.stderr[-3000:]
        assert "Traceback" not in done.stderr
        assert not (tmp_path / "run" / "metrics.jsonl").exists()
    assert not outside.exists()
    written = (p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert sorted(str(p) for p in written if p.parts[0] not in ("run", "run.yaml")) == [
        "work", "work/shards", "work/shards/manifest.json", "work/shards/train-000000.tar",
        "work/shards/train-000001.tar"]
