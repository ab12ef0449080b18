"""Pre-training objectives as a seam (training/objectives.py): an objective defined in this file,
with its own head, loss and metric keys, trains through `bert-pretrain` with no line added
anywhere else; the registered ones resolve by the NSP rule; the training modules import
without a circle."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
from torch import Tensor, nn

from model.bert import BertConfig, BertModel
from model.heads import BertForNextToken, masked_mean_loss
from tests.training.pretrain_runs import REPO, final_weights, make_config
from training import config as cfg
from training import metrics, objectives, pretrain
from training.objectives import LTR, MLM, MLM_NSP, Objective


@dataclass
class SegmentOutput:
    loss: Tensor
    segment_loss: Tensor
    segment_correct: Tensor
    segment_count: Tensor


class SegmentModel(nn.Module):
    """The encoder and one Linear(H, 2) guessing each real token's segment (A or B)."""

    def __init__(self, config: BertConfig, next_sentence: bool):
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.segment = nn.Linear(config.hidden_size, 2)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, attention_mask: Tensor,
                sequence_ids: Tensor | None = None, position_ids: Tensor | None = None,
                layout=None, **labels: Tensor) -> SegmentOutput:
        hidden = self.bert(input_ids, token_type_ids, attention_mask, sequence_ids,
                           position_ids, layout=layout)  # (B, T, H)
        targets = token_type_ids.masked_fill(attention_mask == 0, -100)  # (B, T)
        loss, correct, count = masked_mean_loss(self.segment(hidden).flatten(0, 1),
                                                targets.flatten())
        return SegmentOutput(loss, loss, correct, count)


SEGMENT = Objective(name="segment", heads=("segment",), model=SegmentModel,
                    metric_keys=("loss", "segment_loss", "segment_correct", "segment_count"))


def test_an_objective_defined_here_trains_three_steps_through_bert_pretrain(data, tmp_path):
    """`--set objective.name=module:attribute` and nothing else: three real DeepSpeed steps and the
    phase-end validation, the objective's metric keys in metrics.jsonl (no MLM or NSP ones),
    its head in the checkpoint."""
    out = tmp_path / "run"
    config_file = tmp_path / "run.json"
    cfg.save(make_config(data, out, steps=3, data={"num_workers": 0}), str(config_file))
    pretrain.main(["--config", str(config_file),
                   "--set", "objective.name=tests.training.test_objectives:SEGMENT"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(r["split"], r["step"]) for r in records] == [
        ("train", 1), ("train", 2), ("train", 3), ("validation", 3)]
    for r in records:
        assert {k for k in r if k.endswith(("_loss", "_accuracy"))} == {
            "segment_loss", "segment_accuracy"}
        assert r["loss"] == r["segment_loss"]
        assert 0.0 <= r["segment_accuracy"] <= 1.0
    weights = final_weights(out)
    assert tuple(weights["segment.weight"].shape) == (2, 128)
    assert not [k for k in weights if k.startswith(("mlm.", "nsp."))]
    saved = json.loads((out / "config.json").read_text())
    assert saved["objective"]["name"] == "tests.training.test_objectives:SEGMENT"


def test_the_nsp_rule_picks_the_registered_objective():
    nsp, plain, old = {"nsp": True}, {"nsp": False}, {}
    assert objectives.for_shards("mlm", True, nsp) is MLM_NSP
    assert objectives.for_shards("mlm", True, old) is MLM_NSP  # a manifest before MLM-only shards
    assert objectives.for_shards("mlm", False, nsp) is MLM
    assert objectives.for_shards("mlm", True, plain) is MLM
    assert objectives.for_shards("ltr", True, nsp) is LTR
    assert objectives.for_shards("mlm_nsp", True, nsp) is MLM_NSP
    with pytest.raises(ValueError, match=r"^s/manifest.json: shards made without next-sentence "
                                         r"labels \(--no_next_sentence\), but objective.name=mlm_nsp "
                                         r"trains NSP; use objective.name=mlm"):
        objectives.for_shards("mlm_nsp", True, plain).check_shards(plain, "s/manifest.json")
    assert (MLM.causal, LTR.causal, MLM_NSP.next_sentence, MLM.next_sentence) == (
        False, True, True, False)


def test_unknown_or_contradictory_objectives_are_refused_in_one_line():
    with pytest.raises(ValueError) as error:
        cfg.apply_overrides(cfg.tiny(), ["objective.name=rtl"])
    assert str(error.value) == ("--set objective.name: must be one of mlm_nsp, mlm or ltr, or "
                                "module:attribute naming an Objective, got 'rtl'")
    with pytest.raises(ValueError, match=r"^--set objective\.name: must be one of .* got "
                                         r"'tests.training.test_objectives:NOPE' "
                                         r"\(tests.training.test_objectives has no NOPE\)$"):
        cfg.apply_overrides(cfg.tiny(), ["objective.name=tests.training.test_objectives:NOPE"])
    with pytest.raises(ValueError, match=r"^--set objective\.name: .* \(tests.training."
                                         r"test_objectives:SegmentModel is a type\)$"):
        cfg.apply_overrides(cfg.tiny(),
                            ["objective.name=tests.training.test_objectives:SegmentModel"])
    with pytest.raises(ValueError, match=r"^--set objective\.name: mlm_nsp trains next-sentence "
                                         r"prediction, which objective\.next_sentence=false "
                                         r"turns off"):
        cfg.apply_overrides(cfg.tiny(), ["objective.name=mlm_nsp", "objective.next_sentence=false"])
    assert cfg.apply_overrides(cfg.tiny(), ["objective.name=mlm_nsp"]).objective.name == "mlm_nsp"
    with pytest.raises(ValueError, match=r"^--set objective\.name: segment trains a model "
                                         r"model/hf.py cannot export to Hugging Face .* set "
                                         r"cadence\.export_hf=false$"):
        cfg.apply_overrides(cfg.tiny(), ["objective.name=tests.training.test_objectives:SEGMENT"])
    assert cfg.apply_overrides(cfg.tiny(), [
        "objective.name=tests.training.test_objectives:SEGMENT",
        "cadence.export_hf=false"]).cadence.export_hf is False


def test_a_causal_objective_refuses_an_encoder_without_causal_attention():
    """ModernBERT attends both ways only: `ltr` on it is refused when the config is read (its
    preset), and when a model is built (a checkpoint's encoder, `init_from`)."""
    sets = ["objective.name=ltr", "data.dynamic_masking=false"]
    message = ("ltr trains left-to-right (causal) attention, which model.arch=modernbert does "
               "not have; use objective.name=mlm or model.arch=bert")
    with pytest.raises(ValueError) as error:
        cfg.apply_overrides(cfg.tiny(), [*sets, "model.arch=modernbert"])
    assert str(error.value) == f"--set objective.name: {message}"
    modern = cfg.apply_overrides(cfg.tiny(), ["model.arch=modernbert"]).model.build(100)
    with pytest.raises(ValueError) as error:
        LTR.build_model(modern)
    assert str(error.value) == f"objective.name={message}"
    assert MLM.build_model(modern).config == modern
    assert cfg.apply_overrides(cfg.tiny(), sets).objective.name == "ltr"  # BERT has one


def test_the_objective_builds_its_model_with_the_attention_it_asks_for():
    config = cfg.tiny().model.build(vocab_size=100)
    assert not config.is_decoder  # the run's shape; the objective adds the attention
    ltr = LTR.build_model(config)
    assert ltr.config.is_decoder and isinstance(ltr, BertForNextToken)
    assert not hasattr(ltr, "nsp")
    assert MLM_NSP.build_model(config).nsp is not None
    assert MLM.build_model(config.replace(is_decoder=True)).config.is_decoder is False
    segment = SEGMENT.build_model(config)
    assert isinstance(segment, SegmentModel) and not segment.config.is_decoder


def test_metrics_follow_the_objectives_keys_and_heads():
    out = SegmentOutput(torch.tensor(0.5), torch.tensor(0.5), torch.tensor(3), torch.tensor(4))
    batch = {"attention_mask": torch.ones(2, 5, dtype=torch.long),
             "input_ids": torch.zeros(2, 5, dtype=torch.long)}
    keys = metrics.metric_keys(SEGMENT.metric_keys)
    sums = dict(zip(keys, (metrics.metric_sums(out, batch, keys) * 2).tolist()))
    assert sums == {"loss": 1.0, "segment_loss": 1.0, "segment_correct": 6.0,
                    "segment_count": 8.0, "tokens": 20.0, "samples": 4.0, "micro_batches": 2.0}
    assert metrics.summarize(sums, 2.0, SEGMENT.heads) == {
        "loss": 0.5, "segment_loss": 0.5, "segment_accuracy": 0.75, "tokens_per_s": 10.0,
        "samples_per_s": 2.0}
    no_nsp = {**dict.fromkeys(metrics.METRIC_KEYS, 0.0), "loss": 2.0, "mlm_loss": 2.0,
              "mlm_correct": 1.0, "mlm_count": 4.0, "micro_batches": 1.0}
    assert metrics.summarize(no_nsp, None, MLM_NSP.heads) == {
        "loss": 2.0, "mlm_loss": 2.0, "mlm_accuracy": 0.25}


def test_training_modules_import_without_a_circle():
    """The launch helpers (and their GPU check) never import the entry point, which imports
    them; the entry point's parts (metrics, preflight, objectives) import no entry point."""
    script = (
        "import sys\n"
        "import training.launch, training.metrics, training.preflight, training.objectives\n"
        "assert training.launch.main(['check-gpus', '--', '--preset', 'tiny']) == 0\n"
        "print(sorted(m for m in sys.modules if m in ('training.pretrain', 'flows.steps')))\n")
    found = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                           text=True, check=True)
    assert found.stdout.strip() == "[]"


def test_a_custom_objective_keeps_the_resume_check(data, tmp_path):
    """The objective spec is a field like any other: changing it refuses to resume."""
    saved = make_config(data, tmp_path,
                        objective={"name": "tests.training.test_objectives:SEGMENT"})
    mlm = dataclasses.replace(saved, objective=cfg.ObjectiveConfig(name="mlm"))
    assert cfg.resume_conflicts(saved, mlm) == [
        "objective.name: 'tests.training.test_objectives:SEGMENT' -> 'mlm'"]
