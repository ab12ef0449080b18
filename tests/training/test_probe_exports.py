"""Probe exports (`probe_every`, training/probes.py) on a real DeepSpeed run of two phases:
the folders at exactly the global steps due, each loadable by transformers, the last one equal
to the final export, and a resumed run writing the export its killed run never wrote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.training.pretrain_runs import make_config
from training import pretrain
from training.config import PhaseConfig, PretrainConfig
from training.probes import is_probe_step, write_probe_export


def two_phase_config(data, output, **changes) -> PretrainConfig:
    """4 + 2 steps; probe_every=3: probes at global steps 3 (phase 1) and 6 (phase 2's last).
    ZeRO-3: the weights are partitioned, so the exports take the final export's consolidation
    of the checkpoint's shards."""
    phases = tuple(PhaseConfig(name=name, train_shards=str(data["uneven"]), max_seq_length=128,
                               micro_batch_size=4, global_batch_size=8, steps=steps,
                               warmup_steps=1, learning_rate=2e-3)
                   for name, steps in (("phase1", 4), ("phase2", 2)))
    return make_config(data, output, phases=phases, data={"num_workers": 0},
                       cadence={"probe_every": 3, "export_hf": True},
                       engine={"zero_stage": 3}, **changes)


def test_probe_steps_count_across_phases():
    assert [s for s in range(13) if is_probe_step(3, s)] == [3, 6, 9, 12]
    assert not any(is_probe_step(0, s) for s in range(13))


def test_a_negative_probe_every_is_refused_naming_the_flag(data, tmp_path):
    with pytest.raises(ValueError, match="probe_every"):
        make_config(data, tmp_path, cadence={"probe_every": -1})


def test_probe_exports_at_the_due_steps_load_and_the_last_equals_the_final_export(data,
                                                                                   tmp_path):
    import transformers

    config = two_phase_config(data, tmp_path)
    # stopped at step 3 (a preemption), its probe export lost (killed between the checkpoint
    # and the export): the resumed run writes it before it trains on
    first = pretrain.run(config, stop_after_steps=3)
    assert not first["complete"]
    assert sorted(p.name for p in (tmp_path / "probes").iterdir()) == ["step-0000003"]
    shutil.rmtree(tmp_path / "probes" / "step-0000003")
    result = pretrain.run(config)
    assert result["complete"]

    probes = tmp_path / "probes"
    assert sorted(p.name for p in probes.iterdir()) == ["step-0000003", "step-0000006"]
    manifests = {p.name: json.loads((p / "manifest.json").read_text()) for p in probes.iterdir()}
    assert {n: (m["global_step"], m["checkpoint"]) for n, m in manifests.items()} == {
        "step-0000003": (3, "00-phase1-step00000003"),
        "step-0000006": (6, "01-phase2-step00000002")}
    print("probe export seconds:", {n: m["seconds"] for n, m in manifests.items()})
    for name in manifests:
        model = transformers.BertForPreTraining.from_pretrained(probes / name / "hf")
        assert model.config.vocab_size == 2000
    last = load_file(probes / "step-0000006" / "hf" / "model.safetensors")
    final = load_file(tmp_path / "hf" / "model.safetensors")
    assert last.keys() == final.keys()
    assert all(torch.equal(last[k], final[k]) for k in final)
    earlier = load_file(probes / "step-0000003" / "hf" / "model.safetensors")
    assert not torch.equal(earlier["bert.embeddings.word_embeddings.weight"],
                           final["bert.embeddings.word_embeddings.weight"])


def test_a_failed_probe_export_is_logged_and_training_goes_on(data, tmp_path, caplog):
    """Probes are a view of the run: an export that cannot be written (here the probes folder's
    name is taken by a file) is one warning, and the run trains to its end and exports."""
    phases = (PhaseConfig(name="phase1", train_shards=str(data["uneven"]), max_seq_length=128,
                          micro_batch_size=4, global_batch_size=4, steps=3, warmup_steps=1,
                          learning_rate=2e-3),)
    config = make_config(data, tmp_path, phases=phases, data={"num_workers": 0},
                         cadence={"probe_every": 2, "export_hf": True})
    (tmp_path / "probes").write_text("not a folder")
    caplog.set_level("WARNING", logger="training.pretrain")
    result = pretrain.run(config)
    assert result["complete"] and (tmp_path / "hf" / "model.safetensors").is_file()
    (warning,) = [r.getMessage() for r in caplog.records if "probe export" in r.getMessage()]
    assert warning.startswith("probe export of step 2 failed, training goes on without it: ")
    assert (tmp_path / "probes").read_text() == "not a folder"


def test_an_export_that_fails_leaves_no_partial_folder(tmp_path):
    """The run goes on after a failed probe export, so its temporary folder must not stay
    (BERT-large: 1.3 GB a try), whatever the error."""
    def export(out: str) -> None:
        (Path(out) / "model.safetensors").parent.mkdir(parents=True)
        (Path(out) / "model.safetensors").write_bytes(b"partial")
        raise RuntimeError("consolidation failed")

    with pytest.raises(RuntimeError, match="consolidation failed"):
        write_probe_export(str(tmp_path), 5, "00-phase1-step00000005", export)
    assert list((tmp_path / "probes").iterdir()) == []
