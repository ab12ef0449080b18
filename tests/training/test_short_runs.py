"""A preset cut short: its warmup shrinks with the phase, and a conflicting warmup set beside it
is refused naming the setting as the user wrote it, with both values."""
import logging

import pytest

from common.settings import SettingError
from flows import config as flow_config
from training import config as cfg


def test_bert_pretrain_short_phase_scales_warmup(caplog):
    assert (cfg.tiny().phases[0].steps, cfg.tiny().phases[0].warmup_steps) == (600, 60)
    with caplog.at_level(logging.INFO, logger="training.config"):
        config = cfg.resolve("tiny", assignments=["phase1.steps=30"])
    assert [(p.steps, p.warmup_steps) for p in config.phases] == [(30, 3), (60, 6)]
    assert "phase1.steps=30: warmup_steps scaled with it, 60 -> 3" in caplog.text
    # by index and for phase 2 (60 / 6 -> 7 steps: round(0.7) = 1)
    config = cfg.resolve("tiny", assignments=["phases.1.steps=7", "phases.0.steps=599"])
    assert [(p.steps, p.warmup_steps) for p in config.phases] == [(599, 60), (7, 1)]


def test_given_warmup_is_kept_and_longer_phases_keep_theirs():
    config = cfg.resolve("tiny", assignments=["phase1.steps=30", "phase1.warmup_steps=10"])
    assert (config.phases[0].steps, config.phases[0].warmup_steps) == (30, 10)
    config = cfg.resolve("tiny", assignments=["phase1.steps=1200"])
    assert (config.phases[0].steps, config.phases[0].warmup_steps) == (1200, 60)


def test_config_file_short_phase_scales_warmup(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("phases:\n  - {name: phase1, steps: 30}\n  - {name: phase2, steps: 6}\n")
    config = cfg.resolve("tiny", str(path))
    assert [(p.steps, p.warmup_steps) for p in config.phases] == [(30, 3), (6, 1)]


def test_conflicting_warmup_names_the_setting_as_written():
    with pytest.raises(SettingError) as error:
        cfg.resolve("tiny", assignments=["phase1.steps=30", "phase1.warmup_steps=60"])
    assert str(error.value) == "--set phase1.warmup_steps: must be in [0, steps=30], got 60"
    with pytest.raises(SettingError) as error:
        cfg.resolve("tiny", assignments=["phases.phase2.warmup_steps=61"])
    assert str(error.value) == "--set phases.phase2.warmup_steps: must be in [0, steps=60], got 61"


def test_flow_short_phase_scales_warmup_and_names_conflicts():
    dag = flow_config.resolve("tiny", {"pretrain": {"phase1": {"steps": 30}}}, data_only=True)
    assert [(p.steps, p.warmup_steps) for p in dag.pretrain.phases] == [(30, 3), (60, 6)]
    with pytest.raises(SettingError) as error:
        flow_config.resolve("tiny", {"pretrain": {"phase1": {"steps": 30, "warmup_steps": 60}}},
                            data_only=True)
    assert str(error.value) == ("setting pretrain.phase1.warmup_steps: must be in [0, steps=30], "
                                "got 60")
