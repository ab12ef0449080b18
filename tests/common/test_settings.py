"""One settings mechanism for every entry point: stage configs, their generated job flags, the
flow's config composed of them (common/settings.py, flows/config.py)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from common import settings
from flows.config import parse_set_flags, resolve
from pipelines import jobs, make_shards, train_vocab
from pipelines.shards import config as shards_config
from pipelines.shards.config import ShardsConfig
from pipelines.vocab.wordpiece import VocabConfig
from training import config as training


def _shards(argv: list[str]) -> ShardsConfig:
    args, beam_args = make_shards.build_parser().parse_known_args(
        ["--input", "in", "--output", "out", "--vocab", "v", *argv])
    assert beam_args == [a for a in argv if a.startswith("--direct")]
    return jobs.config_from_args(args, ShardsConfig())


def test_make_shards_keeps_every_flag_it_had():
    config = _shards(["--max_seq_length", "512", "--max_predictions_per_seq", "76",
                      "--masked_lm_prob", "0.2", "--short_seq_prob", "0", "--dupe_factor", "3",
                      "--random_seed", "7", "--do_whole_word_mask", "--do_lower_case=false",
                      "--no_next_sentence", "--mode", "reference", "--pack",
                      "--target_shard_mb", "2", "--num_shards", "4", "--rows_per_block", "16",
                      "--validation_fraction", "0.1", "--join_buckets", "5",
                      "--read_part_kb", "64", "--instances_per_pack_bucket", "99",
                      "--direct_num_workers=2"])
    assert config == ShardsConfig(
        max_seq_length=512, max_predictions_per_seq=76, masked_lm_prob=0.2, short_seq_prob=0.0,
        dupe_factor=3, random_seed=7, do_whole_word_mask=True, do_lower_case=False,
        next_sentence=False, mode="reference", pack=True, target_shard_mb=2.0, num_shards=4,
        rows_per_block=16, validation_fraction=0.1, join_buckets=5, read_part_kb=64,
        instances_per_pack_bucket=99)
    assert _shards([]) == ShardsConfig()  # no flag: the config's defaults
    assert _shards(["--format", "jsonl"]).format == "jsonl"
    assert _shards(["--pack=false"]).pack is False


def test_job_flags_take_their_help_from_the_field_docstrings():
    text = make_shards.build_parser().format_help()
    assert "Probability that a document pass uses a random shorter target length." in \
        " ".join(text.split())
    assert "--no_next_sentence" in text and "--config FILE" in text
    vocab_help = " ".join(train_vocab.build_parser().format_help().split())
    assert "A pair of pieces seen fewer times than this is never merged." in vocab_help


def test_job_settings_file_then_set_then_flags(tmp_path):
    path = tmp_path / "shards.json"
    path.write_text(json.dumps({"dupe_factor": 4, "max_seq_length": 256, "pack": True}))
    config = _shards(["--config", str(path), "--set", "dupe_factor=5", "--set", "random_seed=3",
                      "--random_seed", "9"])
    assert (config.dupe_factor, config.max_seq_length, config.pack, config.random_seed) == \
        (5, 256, True, 9)
    path.write_text(json.dumps({"dupe_facter": 4}))
    with pytest.raises(ValueError, match=r"shards\.json: config key dupe_facter: unknown field"):
        _shards(["--config", str(path)])


def test_a_job_flags_error_names_the_flag_and_the_flow_names_the_setting():
    with pytest.raises(ValueError) as job:
        _shards(["--max_seq_length", "4"])
    assert str(job.value) == "--max_seq_length: must be in [5, 65535], got 4"
    with pytest.raises(ValueError) as typed:
        _shards(["--dupe_factor", "two"])
    assert str(typed.value) == "--dupe_factor='two': 'two' is not an int"
    with pytest.raises(ValueError) as flow:
        resolve("tiny", parse_set_flags(["shards.phase2.max_seq_length=4"]))
    assert str(flow.value) == "setting shards.phase2.max_seq_length: must be in [5, 65535], got 4"
    with pytest.raises(ValueError) as direct:
        ShardsConfig(max_seq_length=4)
    assert str(direct.value) == "--max_seq_length must be in [5, 65535], got 4"


def test_a_literal_setting_takes_only_its_choices_and_its_flag_lists_them():
    """`Literal[...]` fields: the flag's help shows the choices, every entry point refuses
    another value with the same list, and an int choice converts from text
    (`engine.zero_stage=2`)."""
    help_text = make_shards.build_parser().format_help()
    assert "--mode {scalable,reference}" in help_text
    assert "--format {shards,jsonl}" in help_text
    assert _shards(["--mode", "reference"]).mode == "reference"
    with pytest.raises(ValueError) as flag:
        _shards(["--mode", "fast"])
    assert str(flag.value) == "--mode='fast': must be one of scalable or reference"
    with pytest.raises(ValueError) as direct:
        ShardsConfig(format="parquet")
    assert str(direct.value) == "--format must be one of shards or jsonl, got 'parquet'"
    with pytest.raises(ValueError) as flow:
        resolve("tiny", parse_set_flags(["shards.phase1.mode=fast"]))
    assert str(flow.value) == "setting shards.phase1.mode='fast': must be one of scalable or reference"

    tiny = training.tiny()
    assert training.apply_overrides(tiny, ["engine.zero_stage=2"]).engine.zero_stage == 2
    with pytest.raises(ValueError) as stage:
        training.apply_overrides(tiny, ["engine.zero_stage=4"])
    assert str(stage.value) == "--set engine.zero_stage='4': must be one of 0, 1, 2 or 3"
    with pytest.raises(ValueError) as built:
        dataclasses.replace(tiny.engine, precision="fp8")
    assert str(built.value) == "--set precision: must be one of fp32, bf16, fp16 or auto, got 'fp8'"


def test_train_vocab_flags():
    args, _ = train_vocab.build_parser().parse_known_args(
        ["--input", "i", "--output", "o", "--vocab_size", "8000", "--cased",
         "--num_unused_tokens", "120", "--no_progress"])
    assert jobs.config_from_args(args, VocabConfig()) == VocabConfig(
        vocab_size=8000, do_lower_case=False, num_unused_tokens=120)
    assert args.no_progress


@pytest.mark.parametrize(("section", "config_class", "path"), [
    ("shards.phase1", ShardsConfig, ("shards", "phase1")),
    ("shards.phase2", ShardsConfig, ("shards", "phase2")),
    ("vocab", VocabConfig, ("vocab",)),
    ("pretrain", training.PretrainConfig, ("pretrain",)),
    *[(f"pretrain.{name}", cls, ("pretrain", name)) for name, cls in training.SECTIONS.items()],
])
def test_every_field_of_a_stage_config_is_a_flow_setting(section, config_class, path):
    """The flow's sections are the stages' classes: each field is settable by its name, with
    no list of settings kept anywhere else (the flow-filled links aside)."""
    flow_set = {"vocab_dir", "output_dir", "phases"}
    current = resolve("tiny")
    for part in path:
        current = getattr(current, part)
    assert type(current) is config_class
    for f in dataclasses.fields(config_class):
        value = getattr(current, f.name)
        if f.name in flow_set or dataclasses.is_dataclass(value):  # a section: its own case
            continue
        text = "" if value is None else ",".join(map(str, value)) \
            if isinstance(value, tuple) else str(value)
        if value is None:
            continue  # unset: nothing to give as text
        got = resolve("tiny", parse_set_flags([f"{section}.{f.name}={text}"]))
        for part in path:
            got = getattr(got, part)
        assert getattr(got, f.name) == value, f.name


def test_shards_setting_for_both_phases_and_phase_by_name_or_index():
    cfg = resolve("tiny", {"shards": {"dupe_factor": 3, "phase2": {"dupe_factor": 4}},
                           "pretrain": {"phase1": {"steps": 100, "warmup_steps": 10},
                                        "phases": {"1": {"steps": 20, "warmup_steps": 2}}}})
    assert (cfg.shards.phase1.dupe_factor, cfg.shards.phase2.dupe_factor) == (3, 4)
    assert [(p.steps, p.warmup_steps) for p in cfg.pretrain.phases] == [(100, 10), (20, 2)]
    # checked once all of a phase's changes are in: a shorter phase and its warmup together
    short = settings.apply(training.tiny(), {"phase1": {"warmup_steps": 1, "steps": 3}})
    assert (short.phases[0].steps, short.phases[0].warmup_steps) == (3, 1)


def test_the_flows_tiny_preset_is_made_of_the_stages_tiny_presets():
    from pipelines.vocab import wordpiece

    cfg = resolve("tiny")
    assert cfg.vocab == wordpiece.tiny() and cfg.vocab.vocab_size == 4000
    assert (cfg.shards.phase1, cfg.shards.phase2) == (shards_config.tiny(1), shards_config.tiny(2))
    # the flow adds what only a flow runs on top of the stage: probes at steps 200, 400, 600
    assert cfg.pretrain == dataclasses.replace(training.tiny(), cadence=dataclasses.replace(
        training.tiny().cadence, probe_every=200))
    assert [(p.steps, p.warmup_steps, p.max_seq_length, p.global_batch_size)
            for p in cfg.pretrain.phases] == [(600, 60, 128, 32), (60, 6, 256, 16)]
    assert (cfg.shards.phase2.max_predictions_per_seq, cfg.shards.phase1.dupe_factor) == (40, 2)


def test_bert_dag_takes_a_settings_file_under_its_set_flags(tmp_path):
    from flows.cli import build_parser, overrides_from_args

    path = tmp_path / "run.yaml"
    path.write_text("pretrain:\n  phase1: {steps: 100, warmup_steps: 10}\n"
                    "shards: {dupe_factor: 1}\n")
    args = build_parser().parse_args(["--config", str(path), "--set", "pretrain.phase1.steps=90",
                                      "--output", str(tmp_path / "run")])
    cfg = resolve("tiny", overrides_from_args(args))
    assert [p.steps for p in cfg.pretrain.phases] == [90, 60]
    assert (cfg.shards.phase1.dupe_factor, cfg.output) == (1, str(tmp_path / "run"))


def test_a_set_flag_changes_a_settings_files_list_item_by_name(tmp_path):
    """`--set decays.general.steps=2` over a file's `decays` list (and `data.sources`, by name
    or index) changes that item; the list's other items and fields stay the file's."""
    from flows.cli import build_parser, overrides_from_args

    path = tmp_path / "run.yaml"
    path.write_text("pretrain: {optimizer: {schedule: wsd}}\ndecays:\n"
                    "  - {name: general, from_step: 600, steps: 60}\n"
                    "  - {name: legal, from_step: 400, steps: 60}\n")

    def resolved(*sets: str):
        args = build_parser().parse_args(["--config", str(path), "--output", str(tmp_path),
                                          *(a for s in sets for a in ("--set", s))])
        return resolve("tiny", overrides_from_args(args))

    assert [(d.name, d.from_step, d.steps) for d in resolved(
        "decays.general.steps=2", "decays.1.from_step=4").decays] == [
        ("general", 600, 2), ("legal", 4, 60)]
    assert resolved("decays=").decays == ()
    with pytest.raises(ValueError) as refused:
        resolved("decays.other.steps=2")
    assert str(refused.value) == ("setting decays.other: no such item (items: ['general', "
                                  "'legal'])")
    assert settings.merge({"data": {"sources": [{"name": "poems", "weight": 1}]}},
                          {"data": {"sources": {"poems": {"weight": "2"}}}}) == {
        "data": {"sources": [{"name": "poems", "weight": "2"}]}}


def test_init_from_without_model_takes_the_checkpoints_shape_in_every_entry_point(tmp_path):
    """One rule (training.config.checkpoint_decides_shape), applied before validation: a shape
    setting beside init_from is the checkpoint's business (tiny's 128 hidden units would refuse
    12 heads), in `bert-pretrain --set`, its `--config` file and the flow's `pretrain.*`."""
    start = str(tmp_path)
    run = training.resolve("tiny", assignments=[f"model.init_from={start}",
                                                 "model.num_attention_heads=12"])
    assert (run.model.preset, run.model.init_from, run.model.num_attention_heads) == \
        ("", start, 12)
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps({"model": {"init_from": start, "num_attention_heads": 12}}))
    assert training.resolve("tiny", config_file=str(run_file)).model.preset == ""
    flow = resolve("tiny", {"pretrain": {"model": {"init_from": start,
                                                   "num_attention_heads": "12"}}})
    assert (flow.pretrain.model.preset, flow.pretrain.model.num_attention_heads) == ("", 12)
    with pytest.raises(ValueError, match="hidden_size"):  # a named preset keeps its shape check
        training.resolve("tiny", assignments=[f"model.init_from={start}",
                                               "model.preset=bert_tiny",
                                               "model.num_attention_heads=12"])
    assert training.resolve("tiny").model.preset == "bert_tiny"


def test_extract_books_and_build_corpus_flags_come_from_their_configs(tmp_path):
    from pipelines import build_corpus, extract_books

    def books(*argv):
        args, _ = extract_books.build_parser().parse_known_args(["--input", "in", "--output",
                                                                 "out", *argv])
        return jobs.config_from_args(args, extract_books.ExtractBooksConfig(
            input=args.input, output=args.output))

    settings_file = tmp_path / "books.json"
    settings_file.write_text(json.dumps({"num_shards": 4, "max_passage_chars": 700}))
    assert books("--exclude", "*.md, NOTES*", "--max_passage_chars", "900", "--config",
                 str(settings_file), "--set", "num_shards=3") == extract_books.ExtractBooksConfig(
        input="in", output="out", exclude=("*.md", "NOTES*"), max_passage_chars=900,
        num_shards=3)
    assert books("--exclude", "").exclude == ()
    assert books().exclude == ("README*", "LICENSE*", "LICENCE*", "COPYING*", "*.md", "*.json",
                               "*.parquet")
    with pytest.raises(ValueError, match=r"^--max_control_fraction: must be in \[0, 1\], got 2.0$"):
        books("--max_control_fraction", "2")

    def corpus(*argv):
        args, _ = build_corpus.build_parser().parse_known_args(["--input", "in", "--output",
                                                                "out", *argv])
        return jobs.config_from_args(args, build_corpus.BuildCorpusConfig(input=args.input,
                                                                          output=args.output))

    assert corpus("--text_output", "--num_shards", "2") == build_corpus.BuildCorpusConfig(
        input="in", output="out", num_shards=2, text_output=True)
    assert corpus("--text_output=false").text_output is False
    with pytest.raises(ValueError, match=r"^--num_shards: must be >= 0 \(0 = automatic\), got -1$"):
        corpus("--num_shards", "-1")
