"""The modern encoder through DeepSpeed pre-training for real: `model.preset=modernbert_tiny`
trains MLM-only on the books' shards (128 tokens, then 512), stops and resumes bit for bit,
and exports a folder transformers loads as `ModernBertForMaskedLM` with our logits."""

from __future__ import annotations

import dataclasses
import json
import math

import torch

from model.modernbert import ModernBertConfig
from tests.training.pretrain_runs import checkpoint_dirs, final_weights, make_config, train_losses
from training import pretrain
from training.config import PhaseConfig


def _config(data, output, **changes):
    phases = (
        PhaseConfig(name="phase1", train_shards=str(data["uneven"]), max_seq_length=128,
                    micro_batch_size=4, global_batch_size=8, steps=10, warmup_steps=2,
                    learning_rate=2e-3),
        PhaseConfig(name="phase2", train_shards=str(data["long"]), max_seq_length=512,
                    micro_batch_size=2, global_batch_size=4, steps=2, warmup_steps=0,
                    learning_rate=1e-3),
    )
    return make_config(data, output, phases=phases,
                       model={"preset": "modernbert_tiny", "dropout": 0.0},
                       objective={"next_sentence": False},
                       cadence={"checkpoint_every": 4, "keep_checkpoints": 2, "export_hf": True},
                       **changes)


def test_modernbert_pretrains_resumes_and_exports(data, tmp_path):
    full, parts = tmp_path / "full", tmp_path / "parts"
    result = pretrain.run(_config(data, full))
    assert result == {"last_checkpoint": "01-phase2-step00000002",
                      "export_dir": str(full / "hf"), "complete": True}
    saved = json.loads((full / "checkpoints" / "01-phase2-step00000002" / "config.json")
                       .read_text())
    assert saved["model"]["preset"] == "modernbert_tiny"
    losses = train_losses(full)
    print("modernbert_tiny losses", [round(x, 3) for x in losses])
    assert len(losses) == 12 and losses[9] < losses[0] - 0.5  # phase 1 learns
    assert "nsp_loss" not in pretrain.read_metrics(str(full))[-1]

    first = pretrain.run(_config(data, parts), stop_after_steps=6)
    assert (first["complete"], checkpoint_dirs(parts)) == (
        False, ["00-phase1-step00000004", "00-phase1-step00000006"])
    pretrain.run(_config(data, parts))
    assert train_losses(parts) == losses  # bit-exact
    weights = final_weights(full)
    for key, value in final_weights(parts).items():
        assert torch.equal(value, weights[key]), key

    _check_export(data, full, weights)
    _decay_from_a_kept_checkpoint(data, full, tmp_path)


def _decay_from_a_kept_checkpoint(data, run, tmp_path):
    """A stable phase's kept checkpoint, exported, starts a WSD decay run: its weights are the
    checkpoint's, and its rate falls from the peak to 0 over its steps."""
    from training import export_checkpoint
    from training.checkpoint import consolidated_state_dict

    tag = "00-phase1-step00000010"  # phase 1's last: kept beside phase 2's
    assert export_checkpoint.main([str(run), tag, str(tmp_path / "stable")]) == 0
    decay = make_config(data, tmp_path / "decay", steps=3, optimizer={"schedule": "wsd"},
                        model={"preset": "", "init_from": str(tmp_path / "stable")},
                        objective={"next_sentence": False})
    decay = dataclasses.replace(decay, phases=(dataclasses.replace(
        decay.phases[0], warmup_steps=0, decay_steps=3),))
    model = pretrain.build_model(decay, {"nsp": False}, initial=True)
    kept = consolidated_state_dict(str(run / "checkpoints"), tag)
    rows = model.config.vocab_size  # past it: padding rows, never looked up, fresh
    for key, value in model.state_dict().items():
        # transformers' masked LM keeps one `head` (the MLM transform): the MLM-only run's
        # unused pooler does not travel through the export
        if key != "mlm.decoder.weight" and not key.startswith("bert.pooler."):
            assert torch.equal(value[:rows], kept[key][:rows]), key
    pretrain.run(decay)
    rates = [r["lr"] for r in pretrain.read_metrics(str(tmp_path / "decay"))
             if r["split"] == "train"]
    # the rate logged after step s is step s's next: 1-sqrt over the 3 steps from the peak
    assert rates == [2e-3 * (1 - math.sqrt(1 / 3)), 2e-3 * (1 - math.sqrt(2 / 3)), 0.0]


def _check_export(data, output, weights):
    import transformers

    ours = pretrain.build_model(_config(data, output), {"nsp": False}, weights).eval()
    assert isinstance(ours.bert.config, ModernBertConfig) and ours.nsp is None
    hf = transformers.AutoModelForMaskedLM.from_pretrained(str(output / "hf")).eval()
    assert type(hf).__name__ == "ModernBertForMaskedLM"
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(output / "hf"))
    enc = tokenizer(["It is a truth universally acknowledged.", "Call me Ishmael."],
                    return_tensors="pt", padding=True)
    positions = torch.arange(enc["input_ids"].shape[1]).expand(2, -1)
    with torch.no_grad():
        theirs = hf(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"]).logits
        mine = ours(enc["input_ids"], positions, attention_mask=enc["attention_mask"]).mlm_logits
    mask = enc["attention_mask"].bool()
    torch.testing.assert_close(mine[mask], theirs[mask])
