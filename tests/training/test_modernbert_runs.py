"""The modern encoder through DeepSpeed pre-training for real: `model.preset=modernbert_tiny`
trains MLM-only on the books' shards (128 tokens, then 512), stops and resumes bit for bit,
and exports a folder transformers loads as `ModernBertForMaskedLM` with our logits."""

from __future__ import annotations

import json

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
