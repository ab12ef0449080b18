"""Pre-training's checks of its inputs: validation at phase start, every phase's shards before the
first step, broken shards named, one-line errors, the same checks on every rank."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from common import settings
from tests.support.shard_fixtures import write_shards
from tests.training.pretrain_runs import (
    REPO,
    make_config,
    pretrain_rows,
    subprocess_env,
    timeless_metrics,
)
from training import pretrain
from training.loader import LoaderConfig


def test_validation_is_checked_at_phase_start_and_never_costs_the_checkpoint(data, tmp_path,
                                                                             monkeypatch):
    """Too few validation rows for one micro-batch per rank fail before the first step; an
    evaluation that fails (a corrupt validation shard of a shard set too large to hash before
    training, which the loader checks as it reads) comes after the step's checkpoint."""
    rows = list(pretrain_rows(data))
    vocab_size = len((data["vocab"] / "vocab.txt").read_text().split())
    small = tmp_path / "small"
    write_shards(rows, small, {"train": [20, 20], "validation": [3]}, vocab_size, 128, 16)
    config = make_config(data, tmp_path / "run_small", steps=2, data={"num_workers": 0})
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(small)),))
    with pytest.raises(ValueError, match=r"the validation shards hold 3 rows, fewer than one "
                                         r"micro-batch per rank \(1 ranks x phase1\."
                                         r"micro_batch_size 4 = 4\)"):
        pretrain.run(config)
    assert not list((tmp_path / "run_small" / "checkpoints").glob("*"))  # no checkpoint
    # The same shards as a second phase: checked before the first phase takes a step too.
    good = make_config(data, tmp_path / "run_two", steps=2, data={"num_workers": 0}).phases[0]
    two = dataclasses.replace(config, output_dir=str(tmp_path / "run_two"), phases=(
        good, dataclasses.replace(good, name="phase2", train_shards=str(small))))
    with pytest.raises(ValueError, match=r"the validation shards hold 3 rows"):
        pretrain.run(two)
    assert not list((tmp_path / "run_two" / "checkpoints").glob("*"))

    corrupt = tmp_path / "corrupt"
    write_shards(rows, corrupt, {"train": [20, 20], "validation": [16]}, vocab_size, 128, 16)
    with tarfile.open(corrupt / "validation-000000.tar", "w") as tar:
        info = tarfile.TarInfo("000000-000000.rows.npz")
        info.size = 5
        tar.addfile(info, fileobj=io.BytesIO(b"notnp"))
    config = dataclasses.replace(config, output_dir=str(tmp_path / "run_corrupt"), phases=(
        dataclasses.replace(config.phases[0], train_shards=str(corrupt)),))
    from training import shard_trust
    whole = shard_trust.verify_shard_files
    monkeypatch.setattr(shard_trust, "verify_shard_files",  # above the limit: no check up front
                        lambda shards, part=None, max_bytes=0: whole(shards, part, 0))
    with pytest.raises(ValueError, match=r"validation-000000\.tar: member 000000-000000: cannot"):
        pretrain.run(config)
    monkeypatch.setattr(shard_trust, "verify_shard_files", whole)
    latest = tmp_path / "run_corrupt" / "checkpoints" / "latest"
    assert latest.read_text() == "00-phase1-step00000002"
    assert (latest.parent / "00-phase1-step00000002" / "training_state.json").exists()

    # Good validation shards: the resumed run redoes the evaluation the failure skipped (the
    # phase's last step, so there is nothing left to train); it equals an uninterrupted run's.
    repaired = tmp_path / "repaired"
    write_shards(rows, repaired, {"train": [20, 20], "validation": [16]}, vocab_size, 128, 16)
    config = dataclasses.replace(config, phases=(
        dataclasses.replace(config.phases[0], validation_shards=str(repaired)),))
    assert "validation" not in {r["split"] for r in pretrain.read_metrics(config.output_dir)}
    pretrain.run(config)
    clean = dataclasses.replace(config, output_dir=str(tmp_path / "run_clean"))
    pretrain.run(clean)
    for run in (config, clean):
        assert [(r["split"], r["step"]) for r in pretrain.read_metrics(run.output_dir)] == [
            ("train", 1), ("train", 2), ("validation", 2)]
    assert timeless_metrics(config.output_dir) == timeless_metrics(clean.output_dir)


def test_every_phases_inputs_are_checked_before_the_first_step(data, tmp_path):
    """Another vocabulary of the same size, phase-2 shards of the wrong length, a truncated
    shard: each stops the run at its start, naming the phase and the file, with no checkpoint."""
    learn = make_config(data, tmp_path / "run", shards="learn", steps=2, data={"num_workers": 0})
    other_vocab = tmp_path / "other_vocab"
    shutil.copytree(data["vocab"], other_vocab)
    tokens = (other_vocab / "vocab.txt").read_text().split("\n")
    tokens[-3], tokens[-2] = tokens[-2], tokens[-3]  # same size, two ids swapped
    (other_vocab / "vocab.txt").write_text("\n".join(tokens))
    wrong_length = dataclasses.replace(learn.phases[0], name="phase2", max_seq_length=512)
    truncated = tmp_path / "truncated"
    shutil.copytree(data["learn"], truncated)
    shard = max(truncated.glob("train-*.tar"))
    shard.write_bytes(shard.read_bytes()[:10_000])
    cases = [
        (settings.apply(learn, {"data": {"vocab_dir": str(other_vocab)}}),
         (r"phase1\.train_shards=.*: shards made with the vocabulary .*vocab\.txt "
          r"\(sha256 \w{12}\), but data\.vocab_dir=.*other_vocab holds another")),
        (dataclasses.replace(learn, phases=(learn.phases[0], wrong_length)),
         (r"phase2\.train_shards=.*: shards of max_seq_length 128, but "
          r"phase2\.max_seq_length is 512")),
        (dataclasses.replace(learn, phases=(dataclasses.replace(
            learn.phases[0], train_shards=str(truncated)),)),
         (rf"{shard.name}: 10000 bytes, the manifest records \d+: truncated or replaced; "
          r"check the folder with `python -m pipelines.verify_shards <folder>`")),
    ]
    for i, (config, message) in enumerate(cases):
        config = dataclasses.replace(config, output_dir=str(tmp_path / f"run{i}"))
        with pytest.raises(ValueError, match=message):
            pretrain.run(config)
        assert not (tmp_path / f"run{i}" / "checkpoints").exists()


def test_a_shard_that_breaks_while_read_is_named(data, tmp_path):
    """A shard whose size the manifest does not record (or a remote one) truncated: the loader
    names it when webdataset cannot read it, never skips it."""
    rows = list(pretrain_rows(data))
    vocab_size = len((data["vocab"] / "vocab.txt").read_text().split())
    folder = tmp_path / "shards"
    write_shards(rows, folder, {"train": [40, 40]}, vocab_size, 128, 8)
    shard = folder / "train-000001.tar"
    shard.write_bytes(shard.read_bytes()[:5_000])
    for workers in (0, 1):  # in a loader worker too, where torch wraps the message
        loader = pretrain.ShardLoader(LoaderConfig(str(folder), 8, 128, shuffle_buffer=0,
                                                   num_workers=workers))
        with pytest.raises(ValueError) as error:
            for _ in zip(range(20), iter(loader)):
                pass
        assert re.fullmatch(r".*/train-000001\.tar: cannot read the shard \(\w+Error: .*\); it "
                            r"is truncated or corrupt: check the folder with `python -m "
                            r"pipelines\.verify_shards <folder>`", str(error.value)), workers
    # A shard the manifest lists but that is gone: "cannot open", not "truncated".
    (folder / "train-000001.tar").unlink()
    loader = pretrain.ShardLoader(LoaderConfig(str(folder), 8, 128, shuffle_buffer=0))
    with pytest.raises(ValueError) as error:
        for _ in zip(range(20), iter(loader)):
            pass
    assert re.fullmatch(r".*/train-000001\.tar: cannot open the shard \(FileNotFoundError: No "
                        r"such file or directory\); check the folder .*", str(error.value))


def test_bad_settings_and_inputs_are_one_line_errors_not_tracebacks(tmp_path):
    """`bert-pretrain` with a bad value or a missing shard folder: exit 2 and the message
    naming the setting or folder, no traceback (BERT_DEBUG=1 would show it)."""
    command = [sys.executable, "-m", "training.pretrain", "--preset", "tiny",
               "--set", f"output_dir={tmp_path / 'run'}", "--set", "cadence.export_hf=false"]
    cases = [
        (["--set", "engine.zero_stage=4"],
         "bert-pretrain: error: --set engine.zero_stage='4': must be one of 0, 1, 2 or 3"),
        (["--set", f"phase1.train_shards={tmp_path / 'nowhere'}"],
         (f"bert-pretrain: error: {tmp_path / 'nowhere' / 'manifest.json'}: cannot read the "
          "shard manifest")),
    ]
    for extra, message in cases:
        done = subprocess.run(command + extra, capture_output=True, text=True, timeout=300,
                              cwd=REPO, env=subprocess_env(), check=False)
        assert done.returncode == 2, done.stderr[-2000:]
        assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]


def test_phases_must_share_the_vocabulary_and_nsp(data, tmp_path):
    """Without vocab_dir to compare with, the phases are compared with each other."""
    config = make_config(data, tmp_path / "run", shards="learn", steps=2,
                         data={"num_workers": 0, "vocab_dir": ""})
    cases = (("vocab_size", 999, "shards with vocab_size 999, but phase1's have 2000"),
             ("nsp", False, "shards with nsp False, but phase1's have True"))
    for key, value, message in cases:
        other = tmp_path / f"other_{key}"
        shutil.copytree(data["learn"], other)
        manifest = json.loads((other / "manifest.json").read_text())
        manifest[key] = value
        (other / "manifest.json").write_text(json.dumps(manifest))
        two = dataclasses.replace(config, phases=(config.phases[0], dataclasses.replace(
            config.phases[0], name="phase2", train_shards=str(other))))
        with pytest.raises(ValueError, match=rf"phase2\.train_shards=.*: {message}"):
            pretrain.check_phase_inputs(two)


def _checks_on_two_ranks(rank: int, port: int, out_dir: str) -> None:
    """Rank `rank` of 2 (gloo): runs on_all_ranks with checks that fail on rank 1 only."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.distributed.init_process_group("gloo", rank=rank, world_size=2)
    dist = pretrain.Dist(rank, 2, on_gpu=False)
    shard = Path(out_dir) / "train-000000.tar"

    def user_error_on_rank_1():  # our check, on rank 1's own (broken) copy
        from training.shard_trust import ShardInfo, check_shard_files
        check_shard_files([ShardInfo(shard.name, str(shard), 1, 0, 99 if rank else 10)])

    def library_error_on_rank_1():
        return json.loads("{" if rank else "{}")

    seen = {}
    for name, check, agree in (("user", user_error_on_rank_1, None),
                               ("library", library_error_on_rank_1, None),
                               ("disagree", lambda: rank, "the rank's number"),
                               ("agree", lambda: "same", "a constant")):
        try:
            seen[name] = ["ok", pretrain.on_all_ranks(dist, check, agree=agree)]
        except Exception as e:  # noqa: BLE001 (recorded for the test to compare)
            seen[name] = [type(e).__name__, str(e)]
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(seen))
    torch.distributed.destroy_process_group()


def test_start_of_run_checks_fail_on_every_rank_when_one_rank_fails(tmp_path):
    """A check failing on one rank only (its own copy of a file) fails on all ranks, so none
    waits at the next collective: the failing rank with its error, the others naming it."""
    import socket

    (tmp_path / "train-000000.tar").write_bytes(b"x" * 10)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.multiprocessing.spawn(_checks_on_two_ranks, args=(port, str(tmp_path)), nprocs=2)
    rank0, rank1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    shard = tmp_path / "train-000000.tar"
    message = (f"{shard}: 10 bytes, the manifest records 99: truncated or replaced; check the "
               "folder with `python -m pipelines.verify_shards <folder>`")
    assert rank1["user"] == ["ValueError", message]
    assert rank0["user"] == ["OtherRankError", f"on rank 1: {rank1['user'][1]}"]
    assert rank1["library"][0] == "JSONDecodeError"
    assert rank0["library"] == ["RuntimeError",
                                f"on rank 1: JSONDecodeError: {rank1['library'][1]}"]
    disagree = ("the ranks disagree on the rank's number ([0, 1], by rank): give every node the "
                "same files")
    for seen in (rank0, rank1):
        assert seen["disagree"] == ["ValueError", disagree]
        assert seen["agree"] == ["ok", "same"]


def test_a_vocabulary_rewritten_in_place_is_caught_and_a_crlf_copy_is_not(data, tmp_path):
    """The manifest names the vocabulary file it hashed. Rewritten in place since (two ids
    swapped, same size) it no longer matches its hash: refused, although shards and vocab_dir
    name the same file. A copy with CRLF line endings hashes differently but holds the same
    tokens: accepted."""
    vocab = tmp_path / "vocab"
    shutil.copytree(data["vocab"], vocab)
    shards = tmp_path / "shards"
    shutil.copytree(data["learn"], shards)
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["vocab"]["path"] = str(vocab / "vocab.txt")
    (shards / "manifest.json").write_text(json.dumps(manifest))
    config = make_config(data, tmp_path / "run", shards="learn", data={"vocab_dir": str(vocab)})
    config = dataclasses.replace(config, phases=(dataclasses.replace(
        config.phases[0], train_shards=str(shards)),))
    pretrain.check_phase_inputs(config)  # the very file it hashed
    crlf = tmp_path / "crlf"
    shutil.copytree(data["vocab"], crlf)
    text = (crlf / "vocab.txt").read_text()
    (crlf / "vocab.txt").write_bytes(text.replace("\n", "\r\n").encode())
    pretrain.check_phase_inputs(settings.apply(config, {"data": {"vocab_dir": str(crlf)}}))
    tokens = text.split("\n")
    tokens[-3], tokens[-2] = tokens[-2], tokens[-3]
    (vocab / "vocab.txt").write_text("\n".join(tokens))
    with pytest.raises(ValueError, match="shards made with the vocabulary .* holds another"):
        pretrain.check_phase_inputs(config)
