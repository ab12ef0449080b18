"""Each command's `--help` lists every setting it takes (names derived from the config
dataclasses, so a new field shows up or fails here), and its examples print as written."""
import dataclasses

from finetune.cli import build_parser as finetune_parser
from flows.cli import build_parser as dag_parser
from flows.config import PRESETS as DAG_PRESETS
from training import config as cfg
from training.pretrain import build_parser as pretrain_parser


def _setting_names(config, prefix=""):
    """Every leaf setting of `config` as `--set` names it (phases by name)."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from _setting_names(value, f"{prefix}{f.name}.")
        elif isinstance(value, tuple) and value and dataclasses.is_dataclass(value[0]):
            for item in value:
                yield from _setting_names(item, f"{prefix}{item.name}.")
        else:
            yield prefix + f.name


def test_bert_pretrain_help_lists_every_setting_with_default_and_doc():
    text = pretrain_parser().format_help()
    names = list(_setting_names(cfg.tiny()))
    assert {"phase1.warmup_steps", "phase2.steps", "engine.zero_stage",
            "model.preset"} <= set(names)
    indent = {n: "  " if "." in n and n.split(".")[0] in cfg.SECTIONS else "" for n in names}
    missing = [n for n in names if f"\n{indent[n]}{n} = " not in text]
    assert missing == []
    assert "\nphase1.steps = 600\n    Optimizer steps in this phase.\n" in text
    assert "\nmodel:\n  model.arch = ''\n      Encoder architecture (model/encoders.py)" in text
    assert "\n  model.preset = 'bert_tiny'\n      Model preset (bert_tiny, bert_mini," in text


def test_bert_dag_help_lists_settings_by_section():
    text = dag_parser().format_help()
    names = list(_setting_names(DAG_PRESETS["tiny"]()))
    assert {"pretrain.phase1.warmup_steps", "shards.phase2.dupe_factor", "launch.launcher",
            "finetune.tasks", "vocab.vocab_size", "data.wikipedia"} <= set(names)
    missing = [n for n in names if f"{n} = " not in text]
    assert missing == []
    for section in ("data", "vocab", "shards", "pretrain", "launch", "finetune"):
        assert f"\n{section}:\n" in text
    assert "\n  pretrain.phase1.steps = 600  (Optimizer steps in this phase)\n" in text


def test_bert_finetune_help_example_continues_its_lines():
    text = finetune_parser().format_help()
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "bert-finetune --model" in line)
    assert lines[start].endswith(" \\")
    assert lines[start + 1].strip() == "--tasks squad1,squad2,swag,conll2003,rte --output runs/finetune"
