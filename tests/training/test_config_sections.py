"""Pre-training's config in sections (training/config.py): each section's settings through
`bert-pretrain --set`, a config file and the flow; the flat names of before failing in one line
that names the new one; a run's flat saved config.json still loading; the optimizer fields
declared once for pre-training and fine-tuning (common/optimizer.py)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flows import config as flows
from tests.training.pretrain_runs import REPO, subprocess_env
from training import checkpoint, pretrain
from training import config as cfg
from training.config import PhaseConfig

FLAT_CONFIG = Path(__file__).parent / "data" / "flat_config.json"
"""A run's config.json as the flat layout saved it (written by training/config.py at 26e2009,
every field away from its default)."""

SETTINGS = {
    "model": {"preset": "bert_mini", "num_hidden_layers": 3, "hidden_size": 96,
              "num_attention_heads": 4, "intermediate_size": 200, "dropout": 0.05},
    "objective": {"name": "mlm_nsp", "next_sentence": True},
    "optimizer": {"name": "adamw", "adam_beta1": 0.8, "adam_beta2": 0.99, "adam_epsilon": 1e-8,
                  "weight_decay": 0.02, "max_grad_norm": 0.5},
    "engine": {"zero_stage": 1, "precision": "bf16", "device": "cuda", "compile": True,
               "static_shapes": "on"},
    "data": {"vocab_dir": "/v", "dynamic_masking": True, "dynamic_masked_lm_prob": 0.2,
             "mask_fraction": 0.7, "same_fraction": 0.2, "random_fraction": 0.1,
             "do_whole_word_mask": True, "shuffle_buffer": 100, "num_workers": 3},
    "cadence": {"log_every": 5, "eval_every": 50, "eval_batches": 6, "checkpoint_every": 70,
                "keep_checkpoints": 4, "export_hf": False},
}
"""Each section's settings, every one away from the tiny preset's value (the flat config's)."""
ADDED = {"cadence": {"probe_every": 30, "report_to": ("none",)},
         "model": {"arch": "bert", "max_position_embeddings": 256},
         "optimizer": {"schedule": "wsd", "decay_shape": "cosine"},
         "data": {"dynamic_masked_lm_prob_end": 0.1}}
"""Settings the flat layout never had, away from the tiny preset's value."""
NEW_NAMES = {
    **{name: f"{section}.{name}" for section, fields in SETTINGS.items() for name in fields
       if name not in ("preset", "name", "dynamic_masked_lm_prob")},
    "init_from": "model.init_from", "model": "model.preset", "objective": "objective.name",
    "optimizer": "optimizer.name", "masked_lm_prob": "data.dynamic_masked_lm_prob"}
"""Each flat setting of the old layout -> its name in the sections."""
OLD_NAMES = sorted(set(json.loads(FLAT_CONFIG.read_text())) - {"phases", "output_dir", "seed"})


def _text(value) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


def _given(section: str) -> dict:
    return {**SETTINGS[section], **ADDED.get(section, {})}


def _expected(section: str) -> cfg.PretrainConfig:
    tiny = cfg.tiny()
    return dataclasses.replace(tiny, **{section: dataclasses.replace(getattr(tiny, section),
                                                                     **_given(section))})


@pytest.mark.parametrize("section", list(SETTINGS))
def test_each_sections_settings_resolve_through_set_and_a_config_file(section, tmp_path):
    given = _given(section)
    assert {f.name for f in dataclasses.fields(cfg.SECTIONS[section])} - set(given) <= \
        {"init_from"}  # every setting of the section (init_from: below)
    dotted = [f"{section}.{name}={_text(value)}" for name, value in given.items()]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({section: {k: list(v) if isinstance(v, tuple) else v
                                              for k, v in given.items()}}))
    expected = _expected(section)
    assert cfg.resolve("tiny", None, dotted) == expected
    assert cfg.resolve("tiny", str(path)) == expected
    assert getattr(expected, section) != getattr(cfg.tiny(), section)
    # the flow's pretrain.<section>.<setting>, dotted and nested (data.vocab_dir is the flow's)
    own = {k: v for k, v in given.items() if f"pretrain.{section}.{k}" not in flows.FLOW_SET}
    flow_dotted = flows.resolve("tiny", flows.parse_set_flags(
        [f"pretrain.{section}.{k}={_text(v)}" for k, v in own.items()]))
    flow_nested = flows.resolve("tiny", {"pretrain": {section: own}})
    for flow in (flow_dotted, flow_nested):
        assert getattr(flow.pretrain, section) == dataclasses.replace(
            getattr(cfg.tiny(), section), **own)


def test_init_from_alone_gives_the_shape_to_the_checkpoint():
    run = cfg.resolve("tiny", None, ["model.init_from=/ckpt"])
    assert (run.model.preset, run.model.init_from) == ("", "/ckpt")
    flow = flows.resolve("tiny", {"pretrain": {"model": {"init_from": "/ckpt"}}})
    assert (flow.pretrain.model.preset, flow.pretrain.model.init_from) == ("", "/ckpt")


def test_the_table_names_every_flat_setting_of_before():
    """The 35 flat settings of the old layout (its fields beside phases, output_dir, seed)."""
    assert len(OLD_NAMES) == 35 and sorted(NEW_NAMES) == OLD_NAMES
    assert cfg.RENAMED_SETTINGS == NEW_NAMES
    assert flows.RENAMED_SETTINGS["pretrain.zero_stage"] == "pretrain.engine.zero_stage"


@pytest.mark.parametrize("old", OLD_NAMES)
def test_a_flat_name_fails_naming_its_new_one(old, tmp_path, capsys):
    new = NEW_NAMES[old]
    with pytest.raises(SystemExit) as stopped:
        pretrain.main(["--set", f"{old}=1"])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "Traceback" not in err
    assert err.splitlines()[-1] == f"bert-pretrain: error: setting {old} was renamed: it is now {new}"
    path = tmp_path / "run.yaml"
    path.write_text(f"{old}: 1\n")
    with pytest.raises(ValueError) as error:
        cfg.resolve("tiny", str(path))
    assert str(error.value) == f"{path}: setting {old} was renamed: it is now {new}"
    expected = (f"setting pretrain.{old}: the flow sets it (the vocab stage's folder)"
                if old == "vocab_dir" else
                f"setting pretrain.{old} was renamed: it is now pretrain.{new}")
    for overrides in (flows.parse_set_flags([f"pretrain.{old}=1"]), {"pretrain": {old: 1}}):
        with pytest.raises(ValueError) as error:
            flows.resolve("tiny", overrides)
        assert str(error.value) == expected


@pytest.mark.parametrize("old", ["zero_stage", "model"])
def test_bert_pretrain_refuses_a_flat_name_in_one_line_and_exit_2(old, tmp_path):
    """A real `bert-pretrain` process: a flat name, one that is a section's name too (`model`),
    and a config file's top-level key (every flat name goes through `main` in-process above)."""
    command = [sys.executable, "-m", "training.pretrain", "--set", f"{old}=bert_base"]
    done = subprocess.run(command, cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.splitlines()[-1] == (
        f"bert-pretrain: error: setting {old} was renamed: it is now {NEW_NAMES[old]}")
    if old == "zero_stage":
        path = tmp_path / "run.yaml"
        path.write_text("zero_stage: 2\n")
        done = subprocess.run([sys.executable, "-m", "training.pretrain", "--config", str(path)],
                              cwd=REPO, env=subprocess_env(), capture_output=True, text=True,
                              timeout=300, check=False)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.splitlines()[-1] == (
            f"bert-pretrain: error: {path}: setting zero_stage was renamed: it is now "
            "engine.zero_stage")


def flat_as_sections() -> cfg.PretrainConfig:
    """What FLAT_CONFIG holds, in the sections."""
    return cfg.PretrainConfig(
        model=cfg.ModelConfig(**SETTINGS["model"]),
        objective=cfg.ObjectiveConfig(**SETTINGS["objective"]),
        optimizer=cfg.OptimizerConfig(**SETTINGS["optimizer"]),
        engine=cfg.EngineConfig(**SETTINGS["engine"]),
        data=cfg.PretrainDataConfig(**SETTINGS["data"]),
        cadence=cfg.CadenceConfig(**SETTINGS["cadence"]),
        phases=(PhaseConfig(name="phase1", train_shards="/s/128", max_seq_length=128,
                            micro_batch_size=32, global_batch_size=32, steps=40, warmup_steps=4,
                            learning_rate=1e-3),
                PhaseConfig(name="phase2", train_shards="/s/256", validation_shards="/s/v",
                            max_seq_length=256, micro_batch_size=16, global_batch_size=16,
                            steps=60, warmup_steps=6, learning_rate=1e-3)),
        output_dir="/o", seed=3)


def test_a_flat_saved_config_loads_as_its_sections_and_resumes(tmp_path):
    expected = flat_as_sections()
    assert cfg.load_saved(str(FLAT_CONFIG)) == expected
    saved = tmp_path / "config.json"  # saved again: the sections' layout, the same values
    cfg.save(expected, str(saved))
    assert json.loads(saved.read_text())["engine"]["zero_stage"] == 1
    assert cfg.load_saved(str(saved)) == expected
    # a checkpoint of an older run, its config.json flat: resumable with the same settings
    ckpt = tmp_path / "checkpoints"
    (ckpt / "step-10").mkdir(parents=True)
    (ckpt / "step-10" / "config.json").write_text(FLAT_CONFIG.read_text())
    state = checkpoint.CheckpointState("step-10", 0, "phase1", 10, 1, 1, {})
    pretrain.check_resume(expected, str(ckpt), state)
    changed = cfg.apply_overrides(expected, ["engine.zero_stage=2", "model.dropout=0.1"])
    with pytest.raises(ValueError) as error:
        pretrain.check_resume(changed, str(ckpt), state)
    assert [line.strip() for line in str(error.value).splitlines()[1:3]] == [
        "model.dropout: 0.05 -> 0.1", "engine.zero_stage: 1 -> 2"]


def test_fine_tuning_and_pre_training_share_the_optimizer_fields(capsys):
    """weight_decay, adam_epsilon and max_grad_norm: one declaration (common/optimizer.py), one
    docstring and one check, in both; fine-tuning's names and defaults as they were."""
    from common import settings
    from common.optimizer import AdamWOptions
    from finetune.cli import CommandConfig, build_parser, command_config
    from finetune.config import TasksConfig
    from finetune.options import FinetuneConfig, LoopOptions

    shared = ("weight_decay", "adam_epsilon", "max_grad_norm")
    docs = settings.field_docs(AdamWOptions)
    for cls in (LoopOptions, TasksConfig, FinetuneConfig, cfg.OptimizerConfig):
        for name in shared:
            assert cls.__dataclass_fields__[name] is AdamWOptions.__dataclass_fields__[name]
            assert settings.field_docs(cls)[name] == docs[name]
    for cls in (LoopOptions, cfg.OptimizerConfig):
        assert not set(shared) & set(cls.__annotations__)  # declared in neither
    defaults = (0.01, 1e-6, 1.0)
    for config in (LoopOptions(), TasksConfig(), cfg.OptimizerConfig(), cfg.tiny().optimizer):
        assert tuple(getattr(config, name) for name in shared) == defaults
    # fine-tuning's setting names: `--weight_decay`, `finetune.weight_decay`
    args = build_parser().parse_args(["--model", "m", "--data", "d", "--output", "o", "--tasks",
                                      "rte", "--weight_decay", "0.02", "--max_grad_norm", "0"])
    assert (command_config(args, CommandConfig()).weight_decay,
            command_config(args, CommandConfig()).max_grad_norm) == (0.02, 0.0)
    flow = flows.resolve("tiny", flows.parse_set_flags(["finetune.weight_decay=0.02"]))
    assert flow.finetune.weight_decay == 0.02
    # the one check, named where each entry point takes the setting
    with pytest.raises(settings.SettingError) as error:
        LoopOptions(adam_epsilon=0.0)
    assert str(error.value) == "--adam_epsilon must be > 0, got 0.0"
    with pytest.raises(ValueError) as error:
        cfg.apply_overrides(cfg.tiny(), ["optimizer.adam_epsilon=0"])
    assert str(error.value) == "--set optimizer.adam_epsilon: must be > 0, got 0.0"
    with pytest.raises(ValueError) as error:
        flows.resolve("tiny", flows.parse_set_flags(["finetune.weight_decay=-1"]))
    assert str(error.value) == "setting finetune.weight_decay: must be >= 0, got -1.0"
    help_text = build_parser().format_help()
    loop_group = help_text.split("training loop (every task):")[1]
    assert "--weight_decay" in loop_group and "--adam_epsilon" in loop_group


def test_dynamic_maskings_share_has_its_own_name_and_the_old_one_names_it(tmp_path, capsys):
    """make_shards' `masked_lm_prob` (flow `shards.*`, 0.15) and dynamic masking's share
    (`data.dynamic_masked_lm_prob`, 0 = the shards' count) are two settings with two names;
    the old `data.masked_lm_prob` fails in one line naming the new one everywhere, and a run
    saved under it still loads (and keeps its flow folder)."""
    new = "data.dynamic_masked_lm_prob"
    run = cfg.resolve("tiny", None, ["data.dynamic_masking=true", f"{new}=0.2"])
    assert run.data.dynamic_masked_lm_prob == 0.2 and run.data.masking(20).masked_lm_prob == 0.2
    message = f"setting data.masked_lm_prob was renamed: it is now {new}"
    with pytest.raises(SystemExit) as stopped:
        pretrain.main(["--set", "data.masked_lm_prob=0.2"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == f"bert-pretrain: error: {message}"
    path = tmp_path / "run.yaml"
    path.write_text("data:\n  masked_lm_prob: 0.2\n")
    with pytest.raises(ValueError) as error:
        cfg.resolve("tiny", str(path))
    assert str(error.value) == f"{path}: {message}"
    for overrides in (flows.parse_set_flags(["pretrain.data.masked_lm_prob=0.2"]),
                      {"pretrain": {"data": {"masked_lm_prob": 0.2}}}):
        with pytest.raises(ValueError) as error:
            flows.resolve("tiny", overrides)
        assert str(error.value) == f"setting pretrain.{message.removeprefix('setting ')}" \
            .replace(f"now {new}", f"now pretrain.{new}")
    # a run's config.json saved under the old name loads, its value under the new one
    saved = cfg.to_dict(run)
    saved["data"]["masked_lm_prob"] = saved["data"].pop("dynamic_masked_lm_prob")
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert cfg.load_saved(str(tmp_path / "config.json")) == run
    # the flow's pretrain folder is keyed under the name it had: finished runs are reused
    from flows import steps

    flow = flows.resolve("tiny", flows.parse_set_flags(["pretrain.data.dynamic_masking=true",
                                                        f"pretrain.{new}=0.2"]))
    assert steps.pretrain_key(flow)["pretrain"]["data"]["masked_lm_prob"] == 0.2
    assert "dynamic_masked_lm_prob" not in steps.pretrain_key(flow)["pretrain"]["data"]
