"""No code runs from a planted checkpoint file, and a checkpoint that cannot be written leaves
nothing that looks complete (training/checkpoint.py). One small ZeRO-1 run (stopped at step 2
of 4) is trained once and copied by each test."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.disks import small_tmpfs
from tests.training.pretrain_runs import REPO, make_config, subprocess_env
from training import checkpoint, pretrain
from training import config as cfg

TAG = "00-phase1-step00000002"
RUN = {"engine": {"zero_stage": 1}, "steps": 4, "data": {"num_workers": 0},
       "cadence": {"checkpoint_every": 1, "keep_checkpoints": 1}}
REFUSAL = ("refused: this checkpoint file holds objects other than tensors and plain data "
           "(global exec); it may have been planted, and loading it could run code. Resume from a "
           "checkpoint you trust, or start a new output_dir")


class Plant:
    """A pickle that writes `marker` when loaded with weights_only=False."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trust") / "run"
    pretrain.run(make_config(data, out, **RUN), stop_after_steps=2)
    return out


@pytest.fixture
def run_copy(trained, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def resume_in_subprocess(data, out: Path, **env: str) -> subprocess.CompletedProcess:
    path = out.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg.to_dict(make_config(data, out, **RUN))))
    return subprocess.run([sys.executable, "-m", "training.pretrain", "--config", str(path)],
                          cwd=REPO, env={**subprocess_env(), **env}, capture_output=True,
                          text=True, timeout=600, check=False)


def error_lines(stderr: str) -> list[str]:
    """`<command>: error: ...` lines, from where they start (a progress bar may precede one),
    and any other line that says error."""
    return re.findall(r"[\w-]+: error: .*|^(?!.*: error: ).*error.*", stderr,
                      flags=re.IGNORECASE | re.MULTILINE)


def test_a_planted_model_states_pickle_runs_no_code_on_resume(data, run_copy, tmp_path):
    """`bert-pretrain` resuming a checkpoint whose model-states file is a planted pickle: the
    pickle's code never runs, exit 2, one line naming the file."""
    marker = tmp_path / "marker"
    planted = run_copy / "checkpoints" / TAG / "mp_rank_00_model_states.pt"
    torch.save({"module": Plant(marker)}, planted)
    done = resume_in_subprocess(data, run_copy)
    assert not marker.exists()
    assert done.returncode == 2, done.stderr[-3000:]
    assert error_lines(done.stderr) == [f"bert-pretrain: error: {planted}: {REFUSAL}"]
    assert "Traceback" not in done.stderr
    assert (run_copy / "checkpoints" / "latest").read_text() == TAG


def test_an_edited_checkpoint_config_imports_nothing_on_resume(data, run_copy, tmp_path):
    """A checkpoint's config.json edited to name an importable module as its objective: the
    checksums refuse the file before anything in the checkpoint is read, so the module is never
    imported; exit 2, one line naming the file."""
    marker = tmp_path / "marker"
    (tmp_path / "planted_objective.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n")
    saved = run_copy / "checkpoints" / TAG / "config.json"
    config = json.loads(saved.read_text())
    config["objective"]["name"] = "planted_objective:OBJECTIVE"
    saved.write_text(json.dumps(config))
    done = resume_in_subprocess(data, run_copy, PYTHONPATH=str(tmp_path))
    assert not marker.exists()
    assert done.returncode == 2, done.stderr[-3000:]
    assert error_lines(done.stderr) == [(
        f"bert-pretrain: error: {saved}: refused: its size or sha256 differs from "
        f"{saved.parent}/checksums.json, recorded when the checkpoint was written: changed "
        "since (it may have been planted). Resume from a checkpoint you trust")]
    assert "Traceback" not in done.stderr


def test_the_export_refuses_a_planted_optimizer_state_file(run_copy, tmp_path):
    """The fp32 consolidation (export, phase 2's start) of a ZeRO-1 checkpoint, its optimizer
    states planted, in a checkpoint without checksums.json: the scan alone refuses it."""
    marker = tmp_path / "marker"
    folder = run_copy / "checkpoints" / TAG
    (folder / "checksums.json").unlink()
    planted = folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    torch.save({"optimizer_state_dict": Plant(marker)}, planted)
    with pytest.raises(ValueError) as error:
        checkpoint.consolidated_state_dict(str(run_copy / "checkpoints"), TAG)
    assert str(error.value) == f"{planted}: {REFUSAL}"
    assert not marker.exists()


def test_deepspeeds_own_loads_run_no_code_even_unchecked(run_copy, tmp_path):
    """A file swapped after the check (or never checked): DeepSpeed's zero_to_fp32 and the
    ds_to_universal subprocess load it under `weights_only_loads`, and refuse it."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    marker = tmp_path / "marker"
    folder = run_copy / "checkpoints" / TAG
    torch.save({"optimizer_state_dict": Plant(marker)},
               folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(ValueError) as error, checkpoint.weights_only_loads(str(folder)):
        get_fp32_state_dict_from_zero_checkpoint(str(run_copy / "checkpoints"), tag=TAG)
    assert str(error.value) == f"{folder}: {REFUSAL}"
    done = subprocess.run([sys.executable, "-m", "training.checkpoint", "--input_folder",
                           str(folder), "--output_folder", str(tmp_path / "universal")],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, check=False)
    assert done.returncode == checkpoint.REFUSED, done.stderr[-3000:]
    assert error_lines(done.stderr) == [f"ds_to_universal: error: {folder}: {REFUSAL}"]
    assert not marker.exists()


def test_checksums_refuse_a_changed_unlisted_or_missing_file(run_copy):
    """Tensors only, so the scan passes, but not the files the checkpoint was written with."""
    folder = run_copy / "checkpoints" / TAG
    listed = json.loads((folder / "checksums.json").read_text())["files"]
    assert sorted(listed) == ["config.json", "mp_rank_00_model_states.pt", "rng_rank000.pt",
                              "training_state.json",
                              "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
    rng = folder / "rng_rank000.pt"
    original = rng.read_bytes()
    torch.save({"torch": torch.zeros(3, dtype=torch.uint8)}, rng)
    checks = f"{folder}/checksums.json"
    with pytest.raises(ValueError) as error:
        checkpoint.verify_checkpoint(str(folder))
    assert str(error.value) == (
        f"{rng}: refused: its size or sha256 differs from {checks}, recorded when the checkpoint "
        "was written: changed since (it may have been planted). Resume from a checkpoint you "
        "trust")
    rng.write_bytes(original)
    checkpoint.verify_checkpoint(str(folder))
    extra = folder / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    torch.save({}, extra)
    with pytest.raises(ValueError, match=rf"^{extra}: refused: not in {checks}, which lists"):
        checkpoint.verify_checkpoint(str(folder))
    extra.unlink()
    rng.unlink()
    with pytest.raises(ValueError, match=rf"^{rng}: missing, but listed in {checks}"):
        checkpoint.verify_checkpoint(str(folder))


def test_a_checkpoint_written_here_verifies_converts_and_resumes(data, run_copy, tmp_path):
    """Our own checkpoints pass: the universal conversion (its loads forced weights_only) gets
    checksums of its own, and the run resumes to its end."""
    ckpt = run_copy / "checkpoints"
    checkpoint.verify_checkpoint(str(ckpt / TAG))
    done = subprocess.run([sys.executable, "-m", "training.checkpoint", "--input_folder",
                           str(ckpt / TAG), "--output_folder", str(tmp_path / "universal")],
                          cwd=REPO, env=subprocess_env(), capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoint.write_checksums(str(tmp_path / "universal"))
    checkpoint.verify_checkpoint(str(tmp_path / "universal"))
    result = pretrain.run(make_config(data, run_copy, **RUN))
    assert result["complete"] and result["last_checkpoint"] == "00-phase1-step00000004"
    checkpoint.verify_checkpoint(str(ckpt / "00-phase1-step00000004"))


@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs: room for one checkpoint of the tiny ZeRO-1 run (12 MB), not two."""
    with small_tmpfs(tmp_path, "16m") as folder:
        yield folder


def test_a_full_disk_during_a_checkpoint_leaves_latest_on_the_previous_one(data, trained,
                                                                         small_disk):
    """The step-3 checkpoint does not fit: one line naming the folder being written and the
    space, `latest` still step 2's (complete, verified), no `.tmp-` folder left."""
    out = small_disk / "run"
    shutil.copytree(trained, out)
    done = resume_in_subprocess(data, out)
    ckpt = out / "checkpoints"
    assert done.returncode == 2, done.stderr[-3000:]
    [line] = error_lines(done.stderr)
    assert line.startswith(f"bert-pretrain: error: no space left on the device writing "
                           f"{ckpt}/00-phase1-step00000003: it needs 12.2 MB, ")
    assert line.endswith(" left there") and "Traceback" not in done.stderr
    assert (ckpt / "latest").read_text() == TAG
    assert sorted(p.name for p in ckpt.iterdir() if p.is_dir()) == [TAG]
    checkpoint.verify_checkpoint(str(ckpt / TAG))


def test_a_planted_latest_cannot_lead_outside_the_checkpoints_folder(tmp_path):
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (tmp_path / "elsewhere").mkdir()
    for planted in ("/etc", "../elsewhere", "00-x/../../elsewhere-step00000001"):
        (ckpt / "latest").write_text(planted)
        with pytest.raises(checkpoint.UntrustedCheckpointError,
                           match=r"latest: refused: .* is no checkpoint tag of this run"):
            checkpoint.read_latest(str(ckpt))


def test_a_killed_runs_temporaries_are_removed_and_nothing_else(tmp_path):
    ckpt = tmp_path / "checkpoints"
    for folder in (".tmp-00-phase1-step00000003", ".tmp-00-phase1-step00000002-universal",
                   "00-phase1-step00000002", ".cache"):
        (ckpt / folder).mkdir(parents=True)
        (ckpt / folder / "x.pt").write_bytes(b"x")
    # `.latest.*.tmp` and `..fp32-*.pt.*.tmp`: the atomic writes' temporary files (a kill
    # between their write and their rename)
    for name in (".fp32-00-phase1-step00000002.pt", "latest", ".fp32-notes.txt",
                 ".latest.k3x9_q1.tmp", "..fp32-00-phase1-step00000002.pt.a8d2kq.tmp",
                 ".notes.a8d2kq.tmp"):
        (ckpt / name).write_text("x")
    assert checkpoint.remove_stale_files(str(ckpt)) == [
        "..fp32-00-phase1-step00000002.pt.a8d2kq.tmp", ".fp32-00-phase1-step00000002.pt",
        ".latest.k3x9_q1.tmp", ".tmp-00-phase1-step00000002-universal",
        ".tmp-00-phase1-step00000003"]
    assert sorted(p.name for p in ckpt.iterdir()) == [
        ".cache", ".fp32-notes.txt", ".notes.a8d2kq.tmp", "00-phase1-step00000002", "latest"]
    assert checkpoint.remove_stale_files(str(tmp_path / "none")) == []


def test_a_raw_pickle_is_refused_without_advising_weights_only_false(tmp_path):
    """A file `pickle.dump` wrote (protocol 4: torch's weights-only loader stops at its FRAME
    opcode, before any global): refused in one line that names why, and never torch's own
    advice to re-run with weights_only=False, which would run the planted code."""
    import pickle

    marker = tmp_path / "marker"
    planted = tmp_path / "mp_rank_00_model_states.pt"
    with open(planted, "wb") as f:
        pickle.dump({"module": Plant(marker)}, f, protocol=4)
    with pytest.raises(ValueError) as error:
        checkpoint.check_pickle(str(planted))
    assert str(error.value) == (
        f"{planted}: refused: this checkpoint file is not a torch.save file of tensors and "
        "plain data (pickle opcode FRAME, which torch's weights-only loader does not read); it "
        "may have been planted, and loading it could run code. Resume from a checkpoint you "
        "trust, or start a new output_dir")
    assert not marker.exists()
