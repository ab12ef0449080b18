"""The pretrain-bert flow's settings: typed overrides, renamed settings, presets, deployments, the
CLI's errors and the launch command, all checked before the first stage."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from flows import finetune_runs, steps
from flows.config import check_inputs_exist, parse_set_flags, resolve, runs_on_dataflow

REPO = Path(__file__).resolve().parents[2]


CLUSTER_DATA = {"data": {"wikipedia": "gs://b/enwiki.xml.bz2", "books": "gs://b/books/",
                         "sources": []},
                "finetune": {"data": "/data/finetune"}}


def test_overrides_are_typed_and_unknown_keys_fail():
    cfg = resolve("tiny", parse_set_flags(["pretrain.phase1.steps=70", "finetune.tasks=rte,mrpc",
                                           "finetune.learning_rates=[1e-4]"]))
    assert cfg.pretrain.phase("phase1").steps == 70
    assert cfg.finetune.tasks == ("rte", "mrpc")
    assert cfg.finetune.learning_rates == (1e-4,)
    with pytest.raises(ValueError, match="pretrain.phase1_stepz"):
        resolve("tiny", {"pretrain": {"phase1_stepz": 1}})
    with pytest.raises(ValueError, match=r"^setting shards.dupe_facter: unknown field"):
        resolve("tiny", {"shards": {"dupe_facter": 1}})
    with pytest.raises(ValueError, match="^setting launch.launcher='mpirun': must be one of python, deepspeed or torchrun$"):
        resolve("tiny", {"launch": {"launcher": "mpirun"}})


@pytest.mark.parametrize(("old", "new"), [
    ("pretrain.phase1_steps=7", "it is now pretrain.phase1.steps"),
    ("pretrain.phase2_micro_batch_size=4", "it is now pretrain.phase2.micro_batch_size"),
    ("shards.phase2_max_predictions=40", "it is now shards.phase2.max_predictions_per_seq"),
    ("pretrain.launcher=torchrun", "it is now launch.launcher"),
    ("vocab.cased=true", "it is now vocab.do_lower_case (the opposite"),
])
def test_a_renamed_setting_fails_naming_its_new_name(old, new):
    with pytest.raises(ValueError) as error:
        resolve("tiny", parse_set_flags([old]))
    assert str(error.value).startswith(f"setting {old.split('=')[0]} was renamed: {new}")


def test_a_stage_configs_field_is_a_flow_setting_and_the_flow_sets_the_stage_paths():
    """The sections are the stages' own configs: any of their fields is a setting."""
    cfg = resolve("tiny", parse_set_flags([
        "shards.phase2.short_seq_prob=0.2", "shards.dupe_factor=3", "vocab.min_frequency=3",
        "pretrain.data.dynamic_masking=true", "pretrain.phase2.learning_rate=5e-4",
        "shards.phase2.max_seq_length=200"]))
    assert (cfg.shards.phase2.short_seq_prob, cfg.shards.phase1.short_seq_prob) == (0.2, 0.1)
    assert (cfg.shards.phase1.dupe_factor, cfg.shards.phase2.dupe_factor) == (3, 3)
    assert (cfg.vocab.min_frequency, cfg.pretrain.data.dynamic_masking) == (3, True)
    assert [p.learning_rate for p in cfg.pretrain.phases] == [1e-3, 5e-4]
    # phase N trains at its shards' length
    assert [p.max_seq_length for p in cfg.pretrain.phases] == [128, 200]
    for key in ("pretrain.phase2.max_seq_length=64", "pretrain.data.vocab_dir=/v",
                "pretrain.phases.0.train_shards=/s"):
        with pytest.raises(ValueError, match=f"setting {key.split('=')[0]}: the flow sets it"):
            resolve("tiny", parse_set_flags([key]))


@pytest.mark.parametrize(("flag", "section", "name", "expected"), [
    ("finetune.learning_rates=5e-5,3e-5", "finetune", "learning_rates", (5e-5, 3e-5)),
    ("finetune.learning_rates=[5e-5, 3e-5]", "finetune", "learning_rates", (5e-5, 3e-5)),
    ("finetune.seeds=1,2", "finetune", "seeds", (1, 2)),
    ("finetune.seeds=[3]", "finetune", "seeds", (3,)),
    ("finetune.tasks= rte , mrpc", "finetune", "tasks", ("rte", "mrpc")),
    ("finetune.tasks=", "finetune", "tasks", ()),
    ("vocab.do_lower_case=False", "vocab", "do_lower_case", False),
    ("vocab.do_lower_case=false", "vocab", "do_lower_case", False),
    ("vocab.do_lower_case=0", "vocab", "do_lower_case", False),
    ("vocab.do_lower_case=no", "vocab", "do_lower_case", False),
    ("vocab.do_lower_case=True", "vocab", "do_lower_case", True),
    ("vocab.do_lower_case=1", "vocab", "do_lower_case", True),
    ("vocab.do_lower_case=YES", "vocab", "do_lower_case", True),
    ("shards.phase1.pack=true", "shards.phase1", "pack", True),
    ("vocab.vocab_size=30522", "vocab", "vocab_size", 30522),
    ("shards.phase2.target_shard_mb=2", "shards.phase2", "target_shard_mb", 2.0),
    ("finetune.epochs=0.5", "finetune", "epochs", 0.5),
    ("pretrain.optimizer.adam_epsilon=1e-8", "pretrain.optimizer", "adam_epsilon", 1e-8),
    ("pretrain.model.preset=bert_mini", "pretrain.model", "preset", "bert_mini"),
    ("launch.hostfile=123", "launch", "hostfile", "123"),
    ('data.beam_args=["--direct_num_workers=2","--region=a,b"]', "data", "beam_args",
     ("--direct_num_workers=2", "--region=a,b")),
])
def test_set_flags_take_each_fields_type(flag, section, name, expected):
    cfg = resolve("tiny", parse_set_flags([flag]))
    for part in section.split("."):
        cfg = getattr(cfg, part)
    value = getattr(cfg, name)
    assert value == expected and type(value) is type(expected)
    if isinstance(expected, tuple):  # ('1', '2') == (1, 2) is False, but 1.0 == 1 is True
        assert [type(v) for v in value] == [type(e) for e in expected]


def test_typed_seeds_and_rates_reach_fine_tuning():
    """`finetune.seeds=1,2` becomes the ints (1, 2), not the strings ('1', '2') that would fail
    in fine-tuning."""
    from finetune.tasks import get_task

    cfg = resolve("tiny", parse_set_flags(["finetune.seeds=1,2",
                                           "finetune.learning_rates=5e-5,3e-5"]))
    ft = cfg.finetune.for_task(get_task("rte"))
    assert (ft.seeds, ft.learning_rates) == ((1, 2), (5e-5, 3e-5))
    assert [(j.learning_rate, j.seed) for j in finetune_runs.finetune_jobs(cfg) if j.task == "rte"] == [
        (5e-5, 1), (5e-5, 2), (3e-5, 1), (3e-5, 2)]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"finetune": {"seeds": "1,x"}}, "setting finetune.seeds='1,x': 'x' is not an int"),
    ({"finetune": {"learning_rates": "5e-5,fast"}},
     "setting finetune.learning_rates='5e-5,fast': 'fast' is not a number"),
    ({"finetune": {"learning_rates": "[5e-5"}},
     "setting finetune.learning_rates='[5e-5': not a JSON list"),
    ({"finetune": {"seeds": 3}},
     "setting finetune.seeds=3: expected a list or comma-separated values"),
    ({"vocab": {"do_lower_case": "Flase"}},
     "setting vocab.do_lower_case='Flase': 'Flase' is not a bool"),
    ({"vocab": {"do_lower_case": 2}}, "setting vocab.do_lower_case=2: 2 is not a bool"),
    ({"pretrain": {"phase1": {"steps": "1.5"}}},
     "setting pretrain.phase1.steps='1.5': '1.5' is not an int"),
    ({"pretrain": {"phase1": {"steps": True}}},
     "setting pretrain.phase1.steps=True: True is not an int"),
    ({"pretrain": {"phase2": {"learning_rate": "nan"}}},
     "setting pretrain.phase2.learning_rate='nan': 'nan' is not a finite"),
    ({"pretrain": {"model": {"preset": 7}}}, "setting pretrain.model.preset=7: 7 is not a string"),
    ({"data": {"wikipedia": None}}, "needs data.wikipedia"),
    ({"pretrain": {"engine": {"zero_stage": "0", "precision": "bf16"}}},
     "setting pretrain: engine.precision=bf16 cannot be combined with engine.zero_stage=0"),
    ({"finetune": {"data": "gs://b/finetune"}},
     "finetune.data='gs://b/finetune': the fine-tuning readers take"),
    # the settings' old section names the new one
    ({"glue": {"tasks": "rte", "data": "/d"}},
     ("setting 'glue' was renamed 'finetune': glue.tasks is now finetune.tasks, glue.data is now "
     "finetune.data (finetune.data is the folder holding glue/, squad/, ...: the old glue.data "
     "folder goes in its glue/)")),
])
def test_bad_override_values_name_the_setting_and_value(overrides, message):
    with pytest.raises(ValueError) as error:
        resolve("tiny", overrides)
    assert message in str(error.value)


@pytest.mark.parametrize(("flag", "message"), [
    # each refused by the stage's own config, which would only run hours later
    ("pretrain.engine.precision=bf17",
     "setting pretrain.engine.precision='bf17': must be one of fp32, bf16, fp16 or auto"),
    ("pretrain.model.preset=bert_huge", ("setting pretrain.model.preset: must be one of ['bert_base', "
                                  "'bert_large', 'bert_mini', 'bert_tiny', 'modernbert_base', "
                                  "'modernbert_large', 'modernbert_tiny'] (or empty with init_from)")),
    ("pretrain.phase2.steps=0", "setting pretrain.phase2.steps: must be positive"),
    ("pretrain.phase1.global_batch_size=20",
     "setting pretrain.phase1.global_batch_size: must be a multiple of micro_batch_size=32"),
    ("pretrain.phase2.micro_batch_size=5",
     "setting pretrain.phase2.global_batch_size: must be a multiple of micro_batch_size=5"),
    ("pretrain.phase1.warmup_steps=601",
     "setting pretrain.phase1.warmup_steps: must be in [0, steps=600], got 601"),
    ("shards.phase1.dupe_factor=0", "setting shards.phase1.dupe_factor: must be >= 1, got 0"),
    ("shards.phase2.max_seq_length=4",
     "setting shards.phase2.max_seq_length: must be in [5, 65535], got 4"),
    ("shards.phase1.max_predictions_per_seq=0",
     "setting shards.phase1.max_predictions_per_seq: must be >= 1, got 0"),
    ("shards.phase2.validation_fraction=1",
     "setting shards.phase2.validation_fraction: must be in [0, 1), got 1.0"),
    ("vocab.vocab_size=100",
     "setting vocab.vocab_size: must exceed the 104 special and [unused*] tokens, got 100"),
    ("launch.nproc_per_node=0", "setting launch.nproc_per_node: must be >= 1, got 0"),
    # (unset is the family's recipe)
    ("finetune.batch_size=-1", "setting finetune.batch_size: must be >= 1, got -1"),
    ("finetune.epochs=-1", "setting finetune.epochs: must be > 0, got -1.0"),
])
def test_values_a_stage_would_refuse_fail_before_the_first_stage(flag, message):
    with pytest.raises(ValueError) as error:
        resolve("tiny", parse_set_flags([flag]))
    assert str(error.value) == message


def test_finetune_settings_are_checked_even_when_fine_tuning_is_skipped():
    """The section checks itself (finetune/config.py `TasksConfig`), as every stage config."""
    with pytest.raises(ValueError) as error:
        resolve("tiny", {"finetune": {"data": "", "epochs": -1}})
    assert str(error.value) == "setting finetune.epochs: must be > 0, got -1.0"
    assert resolve("tiny", {"finetune": {"data": "", "epochs": 2}}).finetune.epochs == 2.0


def test_a_gs_root_takes_the_data_stages_alone_and_dataflow_needs_one():
    dataflow = {"data": {**CLUSTER_DATA["data"],
                         "beam_args": ["--runner", "DataflowRunner", "--project=p"]}}
    with pytest.raises(ValueError, match=r"^output='gs://b/runs': pre-training and fine-tuning "
                                         "need a local or mounted folder"):
        resolve("tiny", {"output": "gs://b/runs"})
    with pytest.raises(ValueError, match=r"^data.beam_args run Beam on Dataflow, whose workers "
                                         "cannot write to /data/runs on this machine"):
        resolve("tiny", {**dataflow, "output": "/data/runs"}, data_only=True)
    local_books = {"data": {**dataflow["data"], "books": "gs://b/books,/data/books"}}
    with pytest.raises(ValueError, match=r"^setting data.books='gs://b/books,/data/books': "
                                         "Dataflow's workers cannot read /data/books"):
        resolve("tiny", {**local_books, "output": "gs://b/runs"}, data_only=True)
    cfg = resolve("tiny", {**dataflow, "output": "gs://b/runs"}, data_only=True)
    assert cfg.output == "gs://b/runs"
    check_inputs_exist(cfg, data_only=True)  # the tiny preset's GLUE folder is not read


@pytest.mark.parametrize(("beam_args", "dataflow"), [
    (("--runner=DataflowRunner",), True),
    (("--runner=apache_beam.runners.dataflow.DataflowRunner",), True),
    (("--runner=dataflow",), True),  # Beam matches runner names without case or "Runner"
    (("--runner", "DataFlowRunner"), True),
    (("--runner=DirectRunner", "--job_name=DataflowRunner"), False),
    (("--runner=DataflowRunner", "--runner=DirectRunner"), False),  # the last one wins
    ((), False),
])
def test_runs_on_dataflow_reads_the_runner_as_beam_does(beam_args, dataflow):
    assert runs_on_dataflow(beam_args) is dataflow


def test_training_settings_are_the_pretrain_section_not_extra_flags():
    """The training run's settings are checked as `pretrain.*`; `launch.extra_args` carries the
    entry point's other flags only."""
    with pytest.raises(ValueError, match="^setting pretrain: optimizer.name=lamb cannot be "
                                         "combined with engine.zero_stage=1"):
        resolve("tiny", {"pretrain": {"optimizer": {"name": "lamb"}}})
    for flags in (["--set", "optimizer.name=lamb"], ["--set=engine.zero_stage=0"],
                  ["--config", "x.yaml"]):
        with pytest.raises(ValueError, match=r"^setting launch.extra_args: --(set|config)\S*: the "
                                             r"training run's settings are the flow's pretrain"):
            resolve("tiny", {"launch": {"extra_args": flags}})
    ok = ["--stop_after_steps", "3"]  # other flags: the entry point's
    assert resolve("tiny", {"launch": {"extra_args": ok}}).launch.extra_args == tuple(ok)


def test_every_deployment_resolves_as_its_flow_run_will():
    """prefect.yaml's parameters (the cluster ones with the README's data overrides) pass the
    up-front checks: a deployment the checks refused would fail every run at its start."""
    deployments = yaml.safe_load((REPO / "prefect.yaml").read_text())["deployments"]
    for deployment in deployments:
        params = deployment["parameters"]
        overrides = {**params["overrides"], **(CLUSTER_DATA if params["preset"] != "tiny" else {})}
        if params.get("output"):
            overrides = {"output": params["output"], **overrides}  # as pretrain_bert merges it
        cfg = resolve(params["preset"], overrides, data_only=params.get("data_only", False))
        assert cfg.output == params.get("output", str(REPO / "runs" / "tiny")), deployment["name"]
    assert sorted(d["name"] for d in deployments) == [
        "base", "data-base", "data-large", "large", "tiny"]


def test_cli_keeps_a_gs_output_as_a_url(capsys):
    from flows.cli import main

    with pytest.raises(SystemExit):  # refused (no --data_only), and named as given
        main(["--preset", "tiny", "--output", "gs://b/runs"])
    assert "output='gs://b/runs': pre-training and fine-tuning need" in capsys.readouterr().err


def test_cli_reports_a_bad_set_flag_as_a_usage_error(capsys):
    from flows.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--preset", "tiny", "--set", "vocab.do_lower_case=maybe"])
    assert exit_.value.code == 2
    assert "setting vocab.do_lower_case='maybe': 'maybe' is not a bool" in capsys.readouterr().err


@pytest.mark.parametrize("preset", ["base", "large"])
def test_cluster_presets_require_explicit_data_paths(preset):
    with pytest.raises(ValueError) as error:
        resolve(preset)
    assert f"preset {preset!r} needs data.wikipedia, data.books, finetune.data:" in \
        str(error.value)
    with pytest.raises(ValueError, match=f"preset {preset!r} needs finetune.data:"):
        resolve(preset, {"data": CLUSTER_DATA["data"]})
    cfg = resolve(preset, CLUSTER_DATA)
    assert (cfg.data.wikipedia, cfg.data.books, cfg.finetune.data) == (
        "gs://b/enwiki.xml.bz2", "gs://b/books/", "/data/finetune")
    # '' still skips an input explicitly (no books, no fine-tuning).
    skipped = resolve(preset, {"data": {"wikipedia": "/data/wiki", "books": ""},
                               "finetune": {"data": ""}})
    assert (skipped.data.books, skipped.finetune.data, finetune_runs.finetune_jobs(skipped)) == \
        ("", "", [])


def test_tiny_keeps_the_bundled_sample():
    cfg = resolve("tiny")
    assert cfg.data.wikipedia == str(REPO / "data" / "sample" / "wiki")
    assert cfg.data.books == str(REPO / "data" / "sample" / "books")
    assert cfg.finetune.data == str(REPO / "data" / "sample")  # holds glue/
    for path in (cfg.data.wikipedia, cfg.data.books, cfg.finetune.data + "/glue"):
        assert Path(path).is_dir(), path


def test_presets_follow_the_paper():
    base, large = resolve("base", CLUSTER_DATA), resolve("large", CLUSTER_DATA)
    phase1, phase2 = base.pretrain.phases
    assert (phase1.steps + phase2.steps) == 1_000_000
    assert {p.global_batch_size for p in (phase1, phase2)} == {256}
    assert {p.learning_rate for p in (phase1, phase2)} == {1e-4}
    assert phase1.warmup_steps == 10_000 and base.shards.phase1.dupe_factor == 10
    assert (phase1.max_seq_length, phase2.max_seq_length) == (128, 512)
    assert (base.shards.phase1.max_seq_length, base.shards.phase2.max_seq_length) == (128, 512)
    assert large.pretrain.model.preset == "bert_large" and large.launch.launcher == "deepspeed"
    from finetune.tasks import get_task

    rte = base.finetune.for_task(get_task("rte"))  # the family's recipe: the paper's
    assert rte.learning_rates == (5e-5, 4e-5, 3e-5, 2e-5) and rte.batch_size == 32


def test_launch_commands_for_each_launcher():
    """The flow starts its ranks with training.launch's builder, the one the tests run."""
    import sys
    cfg = resolve("tiny")
    assert steps.launch_command(cfg, "c.json") == [
        sys.executable, "-m", "training.pretrain", "--config", "c.json"]
    torchrun = steps.launch_command(resolve("tiny", {"launch": {"launcher": "torchrun",
                                                                "nproc_per_node": 2}}), "c.json")
    assert torchrun[:5] == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                            "2"]
    assert torchrun[5] == "--master_port" and torchrun[7:] == [
        "-m", "training.pretrain", "--config", "c.json"]
    ds = steps.launch_command(resolve("large", CLUSTER_DATA), "c.json")
    assert ds[:5] == [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "8"]
    assert ds[5] == "--master_port" and ds[7:] == [
        "--no_local_rank", "--module", "training.pretrain", "--config", "c.json"]
    hosts = {**CLUSTER_DATA, "launch": {"hostfile": "/etc/deepspeed/hostfile"}}
    multi = steps.launch_command(resolve("large", hosts), "c.json")
    assert multi[3:7] == ["--hostfile", "/etc/deepspeed/hostfile", "--num_gpus", "8"]
    assert ["--module", "training.pretrain"] == multi[10:12]


def test_glue_task_names_and_local_inputs_are_checked_before_any_stage(tmp_path):
    """A task typo fails at resolve; a fine-tuning or family folder missing where the flow runs
    fails before the data stages (it used to surface after pre-training)."""
    with pytest.raises(ValueError) as error:
        resolve("tiny", {"finetune": {"tasks": "rte,mrcp"}})
    assert str(error.value).startswith("setting finetune.tasks=rte,mrcp: unknown task 'mrcp'; "
                                       "known: cola, sst-2,")
    cfg = resolve("tiny", {"finetune": {"data": str(tmp_path / "nowhere")}})
    with pytest.raises(FileNotFoundError, match=r"setting finetune\.data='.*nowhere': .*nowhere "
                                                r"matches no file or folder here"):
        check_inputs_exist(cfg)
    with pytest.raises(FileNotFoundError) as error:
        check_inputs_exist(resolve("tiny", {"finetune": {"data": str(tmp_path)}}))
    assert str(error.value) == (f"setting finetune.data={str(tmp_path)!r}: no glue/ folder (for "
                                "rte, mrpc, sts-b, sst-2); no squad/ folder (for squad1)")
    books = f"{resolve('tiny').data.books},{tmp_path / 'missing.txt'}"
    with pytest.raises(FileNotFoundError, match=r"setting data\.books=.*missing\.txt matches no"):
        check_inputs_exist(resolve("tiny", {"data": {"books": books}}))
    check_inputs_exist(resolve("tiny"))  # the bundled sample is all there
    literal = tmp_path / "books [v2]"  # a real folder whose name is no glob of itself
    literal.mkdir()
    check_inputs_exist(resolve("tiny", {"data": {"books": str(literal)}}))
    check_inputs_exist(resolve("tiny", {"data": {"wikipedia": "gs://b/wiki"}}))  # the job's
