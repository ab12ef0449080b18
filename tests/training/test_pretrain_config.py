"""Pre-training settings: the DeepSpeed config and parameter groups, precision, warmup, overrides
(`--set`, config files) and their errors."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
import torch

from tests.training.pretrain_runs import (
    REPO,
    make_config,
)
from training import checkpoint, pretrain
from training import config as cfg
from training.ds_config import build_ds_config
from training.optim import LinearWarmupDecay, param_groups


def test_lamb_with_zero_is_refused_with_a_clear_message(data, tmp_path):
    with pytest.raises(ValueError, match="optimizer.name=lamb cannot be combined with "
                                         "engine.zero_stage=2: ZeRO partitions parameters"):
        make_config(data, tmp_path, optimizer={"name": "lamb"}, engine={"zero_stage": 2})
    with pytest.raises(ValueError, match="lamb cannot be combined with engine.zero_stage=1"):
        cfg.resolve("tiny", None, ["engine.zero_stage=1", "optimizer.name=lamb"])
    lamb = make_config(data, tmp_path, optimizer={"name": "lamb"}, engine={"zero_stage": 0})
    ds = build_ds_config(lamb, lamb.phases[0], world_size=2, on_gpu=True)
    assert ds["optimizer"]["type"] == "Lamb" and ds["zero_optimization"] == {"stage": 0}
    with pytest.raises(ValueError, match="FusedLamb, a CUDA op"):
        build_ds_config(lamb, lamb.phases[0], world_size=1, on_gpu=False)


def test_deepspeed_config_and_param_groups(data, tmp_path):
    config = make_config(data, tmp_path, engine={"zero_stage": 2, "precision": "bf16"})
    phase = dataclasses.replace(config.phases[0], global_batch_size=256, micro_batch_size=16,
                                steps=1000, warmup_steps=100, learning_rate=1e-4)
    ds = build_ds_config(config, phase, world_size=4, on_gpu=False)
    assert ds["gradient_accumulation_steps"] == 4 and ds["train_batch_size"] == 256
    assert ds["optimizer"] == {"type": "AdamW", "params": {
        "lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-6, "weight_decay": 0.01,
        "torch_adam": True, "adam_w_mode": True}}
    assert "scheduler" not in ds  # ours, LinearWarmupDecay, is passed to deepspeed.initialize
    schedule = LinearWarmupDecay(torch.optim.SGD([torch.zeros(1)], lr=1.0), phase.learning_rate,
                                 phase.warmup_steps, phase.steps)
    assert [schedule.lr_at(s) for s in (0, 50, 100, 550, 1000)] == \
        pytest.approx([0.0, 5e-5, 1e-4, 5e-5, 0.0], rel=1e-12, abs=0)
    schedule.load_state_dict({"last_batch_iteration": 549})  # DeepSpeed WarmupDecayLR's state
    assert schedule.state_dict() == {"steps_taken": 550}
    assert schedule.get_lr() == pytest.approx([5e-5], rel=1e-12, abs=0)
    assert ds["gradient_clipping"] == 1.0 and ds["bf16"] == {"enabled": True}
    assert ds["zero_optimization"]["stage"] == 2
    with pytest.raises(ValueError, match="precision=fp16 needs a GPU"):
        fp16 = dataclasses.replace(config.engine, precision="fp16")
        build_ds_config(dataclasses.replace(config, engine=fp16), phase, 1, on_gpu=False)
    with pytest.raises(ValueError, match="not a multiple of micro_batch_size x ranks = 48"):
        build_ds_config(config, phase, world_size=3, on_gpu=False)
    model = pretrain.build_model(config, {"nsp": True})
    decay, no_decay = param_groups(model, 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[id(p)] for p in no_decay["params"]} == {
        n for n, _ in model.named_parameters() if n.endswith(("bias", "norm.weight"))}
    assert "bert.embeddings.word.weight" in {names[id(p)] for p in decay["params"]}
    assert no_decay["weight_decay"] == 0.0 and decay["weight_decay"] == 0.01
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == \
        sum(p.numel() for p in model.parameters())


def test_config_overrides_file_and_validation(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("engine: {zero_stage: 1}\nphases:\n  - {name: phase1, steps: 20, warmup_steps: 2, learning_rate: 3e-4}\n")
    config = cfg.resolve("base", str(path), ["phase1.micro_batch_size=8", "engine.precision=fp32"])
    assert (config.engine.zero_stage, config.engine.precision, len(config.phases)) == \
        (1, "fp32", 1)
    p = config.phases[0]
    assert (p.steps, p.learning_rate, p.micro_batch_size, p.max_seq_length) == (20, 3e-4, 8, 128)
    base = cfg.base()
    assert [(q.max_seq_length, q.steps, q.global_batch_size) for q in base.phases] == \
        [(128, 900_000, 256), (512, 100_000, 256)]
    assert cfg.from_dict(cfg.to_dict(base)) == base
    with pytest.raises(ValueError, match="--set phase1.warmup_steps: must be in"):
        cfg.apply_overrides(config, ["phase1.warmup_steps=50"])
    with pytest.raises(ValueError,
                       match="--set engine.zero_stage='4': must be one of 0, 1, 2 or 3$"):
        cfg.apply_overrides(config, ["engine.zero_stage=4"])
    with pytest.raises(ValueError, match="unknown field"):
        cfg.apply_overrides(config, ["learning_rate=1"])
    with pytest.raises(ValueError, match=r"--set model.preset: must be one of \['bert_base', "):
        cfg.apply_overrides(config, ["model.preset=bert_huge"])  # at once, not at the build
    # Validated after all overrides: a shorter phase and its warmup in either order.
    short = cfg.apply_overrides(cfg.tiny(), ["phase1.steps=3", "phase1.warmup_steps=1"])
    assert (short.phases[0].steps, short.phases[0].warmup_steps) == (3, 1)


def test_auto_precision_is_bf16_only_where_fast_and_allowed():
    auto = cfg.PretrainConfig(engine=cfg.EngineConfig(precision="auto", zero_stage=1))
    assert (auto.concrete_precision(True), auto.concrete_precision(False)) == ("bf16", "fp32")
    # bf16 needs ZeRO >= 1 and AdamW (LOW_PRECISION_ZERO0_MESSAGE, LAMB_LOW_PRECISION_MESSAGE)
    stage0 = cfg.EngineConfig(precision="auto", zero_stage=0)
    for stage0_or_lamb in (dataclasses.replace(auto, engine=stage0),
                           dataclasses.replace(auto, engine=stage0,
                                               optimizer=cfg.OptimizerConfig(name="lamb"))):
        assert stage0_or_lamb.concrete_precision(True) == "fp32"
    bf16 = cfg.PretrainConfig(engine=cfg.EngineConfig(precision="bf16", zero_stage=1))
    assert bf16.concrete_precision(False) == "bf16"


def test_gpu_example_config_bert_large_on_8_gpus():
    config = cfg.resolve("large", str(REPO / "training" / "configs" / "bert_large_8gpu.yaml"))
    assert (config.model.preset, config.engine.precision, config.engine.zero_stage) == \
        ("bert_large", "bf16", 2)
    ds = [build_ds_config(config, phase, world_size=8, on_gpu=True) for phase in config.phases]
    assert [(d["train_micro_batch_size_per_gpu"], d["gradient_accumulation_steps"],
             d["train_batch_size"]) for d in ds] == [(32, 1, 256), (32, 1, 256)]
    assert ds[0]["optimizer"]["params"]["torch_adam"] is False  # FusedAdam on GPUs
    assert ds[0]["bf16"] == {"enabled": True}
    assert [p.steps for p in config.phases] == [900_000, 100_000]


def _engine(config):
    """A real DeepSpeed engine and loader for the config's first phase, as run_phase builds them."""
    dist = pretrain.init_distributed()
    phase = config.phases[0]
    torch.manual_seed(config.seed)
    model = pretrain.build_model(config, pretrain.shard_manifest(phase))
    engine = pretrain.build_engine(config, phase, model, dist)
    return engine, pretrain.ShardLoader(pretrain.build_loader(config, phase, dist)), dist


def _lrs_of_steps(engine, loader, count: int) -> list[float]:
    """The learning rate each of the next `count` optimizer steps runs at."""
    batches, lrs = iter(loader), []
    for _ in range(count):
        lrs.append(engine.optimizer.param_groups[0]["lr"])
        pretrain.train_step(engine, batches)
    return lrs


def test_warmup_of_0_and_1_steps_is_what_the_config_says(data, tmp_path):
    """DeepSpeed's WarmupDecayLR turned warmup 1 into 2 (and started a step late); ours runs
    step s at lr * s / warmup, then decays linearly to 0 at `steps` (here 4, peak 1e-3)."""
    expected = {0: [1e-3, 7.5e-4, 5e-4, 2.5e-4], 1: [0.0, 1e-3, 2e-3 / 3, 1e-3 / 3],
                2: [0.0, 5e-4, 1e-3, 5e-4]}
    for warmup, lrs in expected.items():
        config = make_config(data, tmp_path / f"w{warmup}", steps=4, data={"num_workers": 0})
        config = dataclasses.replace(config, phases=(dataclasses.replace(
            config.phases[0], warmup_steps=warmup, learning_rate=1e-3),))
        engine, loader, _ = _engine(config)
        assert _lrs_of_steps(engine, loader, 4) == pytest.approx(lrs, rel=1e-12, abs=0), warmup
        engine.destroy()


def test_bf16_needs_zero_1_and_exports_the_fp32_masters_with_a_cased_vocab(data, tmp_path):
    """bf16 at ZeRO stage 0 is refused (its fp32 masters would not reach the export); at stage 1
    the exported weights are the optimizer's fp32 master weights, not their bf16 rounding, and a
    cased vocabulary exports a tokenizer that keeps case."""
    from deepspeed.utils import safe_get_full_fp32_param
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    from common.tokenization import read_vocab, save_tokenizer_folder
    from model.bert_hf import state_to_hf

    with pytest.raises(ValueError, match="engine.precision=bf16 cannot be combined with "
                                         "engine.zero_stage=0"):
        make_config(data, tmp_path, engine={"precision": "bf16", "zero_stage": 0})
    with pytest.raises(ValueError, match="engine.precision=bf16 cannot be combined with "
                                         "engine.zero_stage=0"):
        cfg.resolve("base", None, ["engine.zero_stage=0"])
    assert (cfg.base().engine.precision, cfg.base().engine.zero_stage) == ("bf16", 2)

    cased = tmp_path / "cased_vocab"  # the same tokens, as train_vocab --cased writes them
    save_tokenizer_folder(read_vocab(str(data["vocab"])), str(cased), do_lower_case=False)
    config = make_config(data, tmp_path / "run", steps=3,
                         engine={"precision": "bf16", "zero_stage": 1},
                         data={"num_workers": 0, "vocab_dir": str(cased)},
                         cadence={"export_hf": True})
    engine, loader, dist = _engine(config)
    batches = iter(loader)
    for _ in range(3):
        pretrain.train_step(engine, batches)
    tag = checkpoint.save_checkpoint(engine, config, 0, config.phases[0], 3, loader, dist)
    masters = {name: safe_get_full_fp32_param(p).detach().clone()
               for name, p in engine.module.named_parameters()}
    engine.destroy()
    assert any(not torch.equal(m, m.bfloat16().float()) for m in masters.values())
    out = pretrain.export(config, str(tmp_path / "run" / "checkpoints"), tag)
    exported = load_file(str(Path(out) / "model.safetensors"))
    expected = state_to_hf(masters)
    word = "bert.embeddings.word_embeddings.weight"  # trained with rows padded to a multiple
    expected[word] = expected[word][:len(read_vocab(str(cased)))]  # of 64; exported: the vocab's
    assert exported.keys() == expected.keys()
    for key, value in expected.items():
        assert torch.equal(exported[key], value), key

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.tokenize("Emma Woodhouse, handsome") == \
        ["[UNK]", "[UNK]", ",", "hands", "##ome"]  # the vocabulary has no capitals
    assert tokenizer.tokenize("emma woodhouse, handsome") == \
        ["emma", "woodhouse", ",", "hands", "##ome"]


def test_export_takes_casing_from_the_shards_then_the_vocabulary(tmp_path):
    """A bare cased vocab.txt (no tokenizer_config.json) with shards made by make_shards
    --do_lower_case=false exports a tokenizer that keeps case; a contradiction is refused."""
    bare, uncased = tmp_path / "bare", tmp_path / "uncased"
    for folder in (bare, uncased):
        folder.mkdir()
        (folder / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    (uncased / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))

    def manifest(lower):
        return {"options": {"job": {"do_lower_case": lower}}}
    assert pretrain.export_do_lower_case(manifest(False), str(bare)) is False
    assert pretrain.export_do_lower_case(manifest(True), str(uncased)) is True
    assert pretrain.export_do_lower_case({}, str(bare)) is True  # BERT's uncased default
    with pytest.raises(ValueError, match="made with do_lower_case=False but .*uncased/"
                                         "tokenizer_config.json says do_lower_case=True"):
        pretrain.export_do_lower_case(manifest(False), str(uncased))


@pytest.mark.parametrize(("assignment", "field", "expected"), [
    ("learning_rate=1e-4", None, None),  # unknown at the top level: a phase field
    ("optimizer.adam_epsilon=1e-8", "optimizer.adam_epsilon", 1e-8),
    ("data.dynamic_masking=yes", "data.dynamic_masking", True),
    ("cadence.export_hf=false", "cadence.export_hf", False),
    ("output_dir=2024", "output_dir", "2024"),  # text as given, not YAML's int
    ("data.vocab_dir=~", "data.vocab_dir", "~"),  # not YAML's null
    ("seed=7", "seed", 7),
])
def test_set_converts_text_with_the_flows_converter(assignment, field, expected):
    """One converter for `bert-pretrain --set` and the flow's `--set` (common.settings)."""
    if field is None:
        with pytest.raises(ValueError, match="unknown field"):
            cfg.apply_overrides(cfg.tiny(), [assignment])
        return
    value = cfg.apply_overrides(cfg.tiny(), [assignment])
    for part in field.split("."):
        value = getattr(value, part)
    assert value == expected and type(value) is type(expected)


@pytest.mark.parametrize(("assignment", "message"), [
    ("seed=1.5", "--set seed='1.5': '1.5' is not an int"),
    ("cadence.export_hf=maybe", "--set cadence.export_hf='maybe': 'maybe' is not a bool"),
    ("phase1.learning_rate=fast", "--set phase1.learning_rate='fast': 'fast' is not a number"),
    ("phase1.steps=inf", "--set phase1.steps='inf': 'inf' is not an int"),
    ("seed=7.0", "--set seed='7.0': '7.0' is not an int"),
])
def test_set_rejects_values_of_the_wrong_type_naming_them(assignment, message):
    with pytest.raises(ValueError) as error:
        cfg.apply_overrides(cfg.tiny(), [assignment])
    assert message in str(error.value)


def test_a_config_files_phases_merge_into_the_presets_phases_by_name(tmp_path, caplog):
    """`{name: phase2, ...}` alone keeps phase 2's 512 tokens and learning rate (phases merge
    by name, not by position), and leaving phase 1 out is said, not silent."""
    path = tmp_path / "run.yaml"
    path.write_text("phases:\n  - {name: phase2, steps: 50, warmup_steps: 5}\n")
    base = cfg.base()
    with caplog.at_level(logging.WARNING, logger="training.config"):
        config = cfg.resolve("base", str(path))
    (phase,) = config.phases
    assert (phase.name, phase.steps, phase.warmup_steps) == ("phase2", 50, 5)
    assert (phase.max_seq_length, phase.learning_rate, phase.micro_batch_size) == (
        base.phases[1].max_seq_length, base.phases[1].learning_rate,
        base.phases[1].micro_batch_size) == (512, 1e-4, 32)
    assert "the config file's phases ['phase2'] leave out the preset's ['phase1']: not run" \
        in caplog.text
    # Unnamed entries still merge by position; a new name starts from the defaults.
    path.write_text("phases:\n  - {steps: 7, warmup_steps: 0}\n  - {name: extra, steps: 3, "
                    "warmup_steps: 0, max_seq_length: 256}\n")
    first, extra = cfg.resolve("base", str(path)).phases
    assert (first.name, first.steps, first.max_seq_length) == ("phase1", 7, 128)
    assert (extra.name, extra.steps, extra.max_seq_length, extra.learning_rate) == (
        "extra", 3, 256, cfg.PhaseConfig().learning_rate)
    # A run's saved config (read on every resume) is no user file: no warning there.
    caplog.clear()
    saved = tmp_path / "config.json"
    cfg.save(config, str(saved))
    with caplog.at_level(logging.WARNING, logger="training.config"):
        assert cfg.load_saved(str(saved)) == config
    assert "leave out" not in caplog.text


def test_a_config_file_typo_is_named_as_the_files_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("lerning_rate: 1e-4\n")
    with pytest.raises(ValueError, match=r"run\.yaml: config key lerning_rate: unknown field"):
        cfg.resolve("tiny", str(path))
    path.write_text("phases:\n  - {name: phase1, warm_up_steps: 5}\n")
    with pytest.raises(ValueError, match=r"run\.yaml: config key phases\.0\.warm_up_steps: "
                                         r"unknown field"):
        cfg.resolve("tiny", str(path))


def test_metric_counts_stay_exact_with_a_bf16_loss():
    """bf16 holds integers exactly only up to 256: counts are summed in float64 instead."""
    from types import SimpleNamespace

    loss = torch.tensor(2.5, dtype=torch.bfloat16)
    out = SimpleNamespace(loss=loss, mlm_loss=loss, mlm_correct=torch.tensor(1001),
                          mlm_count=torch.tensor(3001), nsp_loss=None)
    batch = {"attention_mask": torch.ones(300, 128, dtype=torch.long),
             "input_ids": torch.zeros(300, 128, dtype=torch.long)}
    sums = dict(zip(pretrain.METRIC_KEYS, pretrain.metric_sums(out, batch).tolist()))
    assert sums == {"loss": 2.5, "mlm_loss": 2.5, "mlm_correct": 1001.0, "mlm_count": 3001.0,
                    "nsp_loss": 0.0, "nsp_correct": 0.0, "nsp_count": 0.0,
                    "tokens": 38400.0, "samples": 300.0, "micro_batches": 1.0}


def test_a_config_file_that_does_not_parse_is_named(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"engine": {"zero_stage": 1,}}')
    with pytest.raises(ValueError, match=r"run\.json: not valid JSON \(Expecting property name"):
        cfg.resolve("tiny", str(path))
    path = tmp_path / "run.yaml"
    path.write_text("phases: [unclosed\n")
    with pytest.raises(ValueError, match=r"run\.yaml: not valid YAML"):
        cfg.resolve("tiny", str(path))
