"""The pretrain-bert flow: config, content-addressed stages, and a real deployment run.

The deployment test starts a real Prefect server and process worker, deploys prefect.yaml, runs
`prefect deployment run pretrain-bert/tiny` on the bundled sample, and runs it again to check
that every stage is reused.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from flows import devices, fanout, launch, steps
from flows.config import check_inputs_exist, parse_set_flags, resolve, runs_on_dataflow
from flows.stages import run_stage

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


CLUSTER_DATA = {"data": {"wikipedia": "gs://b/enwiki.xml.bz2", "books": "gs://b/books/"},
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
    with pytest.raises(ValueError, match="launch.launcher"):
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
        "pretrain.dynamic_masking=true", "pretrain.phase2.learning_rate=5e-4",
        "shards.phase2.max_seq_length=200"]))
    assert (cfg.shards.phase2.short_seq_prob, cfg.shards.phase1.short_seq_prob) == (0.2, 0.1)
    assert (cfg.shards.phase1.dupe_factor, cfg.shards.phase2.dupe_factor) == (3, 3)
    assert (cfg.vocab.min_frequency, cfg.pretrain.dynamic_masking) == (3, True)
    assert [p.learning_rate for p in cfg.pretrain.phases] == [1e-3, 5e-4]
    # phase N trains at its shards' length
    assert [p.max_seq_length for p in cfg.pretrain.phases] == [128, 200]
    for key in ("pretrain.phase2.max_seq_length=64", "pretrain.vocab_dir=/v",
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
    ("pretrain.adam_epsilon=1e-8", "pretrain", "adam_epsilon", 1e-8),
    ("pretrain.model=bert_mini", "pretrain", "model", "bert_mini"),
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
    """The reviewer's case: `finetune.seeds=1,2` used to stay ('1', '2') and fail in
    fine-tuning."""
    from finetune.tasks import get_task

    cfg = resolve("tiny", parse_set_flags(["finetune.seeds=1,2",
                                           "finetune.learning_rates=5e-5,3e-5"]))
    ft = cfg.finetune.for_task(get_task("rte"))
    assert (ft.seeds, ft.learning_rates) == ((1, 2), (5e-5, 3e-5))
    assert [(j.learning_rate, j.seed) for j in fanout.finetune_jobs(cfg) if j.task == "rte"] == [
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
     "setting pretrain.phases.0.steps='1.5': '1.5' is not an int"),
    ({"pretrain": {"phase1": {"steps": True}}},
     "setting pretrain.phases.0.steps=True: True is not an int"),
    ({"pretrain": {"phase2": {"learning_rate": "nan"}}},
     "setting pretrain.phases.1.learning_rate='nan': 'nan' is not a finite"),
    ({"pretrain": {"model": 7}}, "setting pretrain.model=7: 7 is not a string"),
    ({"data": {"wikipedia": None}}, "needs data.wikipedia"),
    ({"pretrain": {"zero_stage": "0", "precision": "bf16"}},
     "setting pretrain: precision=bf16 cannot be combined with zero_stage=0"),
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
    ("pretrain.precision=bf17", "setting pretrain.precision: must be one of ('fp32', 'bf16', 'fp16', 'auto')"),
    ("pretrain.model=bert_huge", ("setting pretrain.model: must be one of ['bert_base', "
                                  "'bert_large', 'bert_mini', 'bert_tiny'] (or empty with init_from)")),
    ("pretrain.phase2.steps=0", "setting pretrain.phases.1.steps: must be positive"),
    ("pretrain.phase1.global_batch_size=20",
     "setting pretrain.phases.0.global_batch_size: must be a multiple of micro_batch_size=32"),
    ("pretrain.phase2.micro_batch_size=5",
     "setting pretrain.phases.1.global_batch_size: must be a multiple of micro_batch_size=5"),
    ("pretrain.phase1.steps=50", "setting pretrain.phases.0.warmup_steps: must be in [0, steps]"),
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


def test_without_finetune_data_its_settings_are_not_checked():
    assert resolve("tiny", {"finetune": {"data": "", "epochs": -1}}).finetune.epochs == -1


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
    with pytest.raises(ValueError, match="^setting pretrain: optimizer=lamb cannot be combined "
                                         "with zero_stage=1"):
        resolve("tiny", {"pretrain": {"optimizer": "lamb"}})
    for flags in (["--set", "optimizer=lamb"], ["--set=zero_stage=0"], ["--config", "x.yaml"]):
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
    assert (skipped.data.books, skipped.finetune.data, fanout.finetune_jobs(skipped)) == \
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
    assert large.pretrain.model == "bert_large" and large.launch.launcher == "deepspeed"
    from finetune.tasks import get_task

    rte = base.finetune.for_task(get_task("rte"))  # the family's recipe: the paper's
    assert rte.learning_rates == (5e-5, 4e-5, 3e-5, 2e-5) and rte.batch_size == 32


def test_stage_is_reused_only_when_config_and_upstream_match(tmp_path):
    calls = []

    def build(out):
        calls.append(out)
        Path(out, "manifest.json").write_text("{}")

    first = run_stage(str(tmp_path), "s", {"a": 1}, build)
    again = run_stage(str(tmp_path), "s", {"a": 1}, build)
    changed = run_stage(str(tmp_path), "s", {"a": 2}, build)
    downstream = run_stage(str(tmp_path), "t", {}, build, upstream=(first,))
    downstream2 = run_stage(str(tmp_path), "t", {}, build, upstream=(changed,))
    assert (first.cached, again.cached, changed.cached) == (False, True, False)
    assert again.path == first.path != changed.path
    assert downstream.path != downstream2.path
    assert len(calls) == 4


def test_failed_stage_leaves_no_manifest_and_reruns(tmp_path):
    def fail(out):
        Path(out, "partial").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_stage(str(tmp_path), "s", {}, fail)
    done = run_stage(str(tmp_path), "s", {}, lambda out: Path(out, "manifest.json").write_text("{}"))
    assert not done.cached and Path(done.path, "partial").exists()


RUN = r"""
import logging, sys, time
from pathlib import Path
from flows import devices, fanout, launch, steps
from flows.stages import run_stage

logging.basicConfig(level=logging.INFO, format="%(message)s")
root, name, how = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
CHILD = '''
import signal, sys, time
from pathlib import Path
root = Path(sys.argv[1])
def stop(*_):  # a launcher taking its trainers down takes a moment
    (root / "child.stopping").touch()
    time.sleep(1.5)
    (root / "child.stopped").touch()
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
(root / "child.running").touch()
while True:
    time.sleep(0.05)
'''

def build(out):
    with open(root / "builds.log", "a") as log:
        log.write(name + ("" if (root / "child.stopped").exists() else " (job alive)") + "\n")
    (root / (name + ".building")).touch()
    if how == "launch":  # the stage's job in a subprocess, as pre-training's launcher
        launch.run_subprocess([sys.executable, "-c", CHILD, str(root)], log=lambda line: None)
    while how == "hold" and not (root / (name + ".release")).exists():
        time.sleep(0.05)
    Path(out, "manifest.json").write_text('{"by": "' + name + '"}')

result = run_stage(str(root), "shards", {"seq": 512}, build, poll_seconds=0.05)
print(("cached " if result.cached else "built ") + result.manifest["by"])
"""


def _flow_run(root: Path, name: str, how: str) -> subprocess.Popen:
    """A process that needs the stage "shards"; its build `hold`s until `<name>.release`
    appears, `launch`es a subprocess that runs until stopped, or is done at once."""
    return subprocess.Popen([sys.executable, "-c", RUN, str(root), name, how],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _wait_until_waiting(run: subprocess.Popen) -> str:
    """Read `run`'s log until it says it waits for another run's build; that line."""
    for line in run.stderr:
        if "another run is building" in line:
            return line
    raise AssertionError(f"the run ended without waiting: {run.communicate()}")


def test_a_stage_two_runs_need_at_once_is_built_once(tmp_path):
    """A second flow run (process) reaching a stage the first is building waits for it, says
    who builds it, and reuses its output instead of building it beside it."""
    first = _flow_run(tmp_path, "first", "hold")
    _wait_for(tmp_path / "first.building")
    second = _flow_run(tmp_path, "second", "now")
    assert f"pid {first.pid}" in _wait_until_waiting(second)
    (tmp_path / "first.release").touch()
    out1, _ = first.communicate(timeout=120)
    out2, _ = second.communicate(timeout=120)
    assert (out1.strip(), out2.strip()) == ("built first", "cached first")
    assert Path(tmp_path, "builds.log").read_text() == "first (job alive)\n"


def test_a_run_killed_while_building_keeps_the_lock_until_its_job_is_down(tmp_path):
    """kill -9 of a run whose stage job runs in a subprocess: the job (which inherited the
    lock) is told to stop, and the waiting run builds the stage only once the job has ended,
    and then at once (no lease to wait out)."""
    dead = _flow_run(tmp_path, "dead", "launch")
    _wait_for(tmp_path / "child.running")
    waiting = _flow_run(tmp_path, "waiting", "now")
    _wait_until_waiting(waiting)
    dead.kill()
    dead.wait(10)
    out, _ = waiting.communicate(timeout=120)
    assert out.strip() == "built waiting"
    assert (tmp_path / "child.stopping").exists()  # the job was stopped, not left running
    # when "waiting" built, the job had finished stopping: the lock had lived with the job
    assert Path(tmp_path, "builds.log").read_text() == "dead (job alive)\nwaiting\n"


def test_a_failed_build_lets_the_waiting_run_build_it(tmp_path):
    """Threads of one process exclude each other too (the GLUE fan-out's runs are threads):
    a run waits while the build it found fails, then builds the stage itself."""
    import threading

    holding, fail = threading.Event(), threading.Event()

    def failing(out):
        holding.set()
        fail.wait(30)
        raise RuntimeError("boom")

    errors, results, built = [], [], []

    def first():
        try:
            run_stage(str(tmp_path), "s", {}, failing, poll_seconds=0.05)
        except RuntimeError as e:
            errors.append(str(e))

    def build(out):
        built.append(out)
        Path(out, "manifest.json").write_text("{}")

    holder = threading.Thread(target=first)
    holder.start()
    assert holding.wait(30)
    waiter = threading.Thread(target=lambda: results.append(
        run_stage(str(tmp_path), "s", {}, build, poll_seconds=0.05)))
    waiter.start()
    waiter.join(0.5)
    assert waiter.is_alive() and not built  # held: the waiter neither built nor returned
    fail.set()
    holder.join(30)
    waiter.join(30)
    assert errors == ["boom"] and len(built) == 1 and [r.cached for r in results] == [False]
    with pytest.raises(ValueError, match="poll_seconds"):
        run_stage(str(tmp_path), "t", {}, build, poll_seconds=0)


def test_glue_fan_out_covers_tasks_rates_and_seeds_for_small_tasks():
    cfg = resolve("tiny", {"finetune": {"tasks": ["rte", "sst-2"],
                                        "learning_rates": [1e-4, 5e-5], "seeds": [1, 2]}})
    jobs = fanout.finetune_jobs(cfg)
    # RTE is a small task (seeds x rates); SST-2 is not (first seed only).
    assert [(j.family, j.task, j.learning_rate, j.seed) for j in jobs] == [
        ("glue", "rte", 1e-4, 1), ("glue", "rte", 1e-4, 2), ("glue", "rte", 5e-5, 1),
        ("glue", "rte", 5e-5, 2), ("glue", "sst-2", 1e-4, 1), ("glue", "sst-2", 5e-5, 1)]
    # a family name is all its tasks; the recipe fills what is not set
    every = resolve("tiny", {"finetune": {"tasks": ["glue"], "learning_rates": [],
                                          "epochs": None, "seeds": [1]}})
    assert len(fanout.finetune_jobs(every)) == 9 * 4


def test_fine_tuning_runs_take_a_free_device_one_run_each():
    """GLUE runs mapped on Prefect's threads borrow a device from the pool: each device serves
    one run at a time, and a run waits only while every device is taken."""
    import threading

    import torch

    assert devices.fine_tuning_devices(num_gpus=2) == ["cuda:0", "cuda:1"]
    assert devices.fine_tuning_devices(num_gpus=0) == ["cpu"]
    if not torch.cuda.is_available():
        assert devices.fine_tuning_devices() == ["cpu"]
    pool = devices.DevicePool(["cuda:0", "cuda:1"])
    third: list[str] = []

    def run() -> None:
        with pool.take() as device:
            third.append(device)

    with pool.take() as first, pool.take() as second:
        assert {first, second} == {"cuda:0", "cuda:1"}
        waiting = threading.Thread(target=run)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not third  # both devices lent: the third run waits
    waiting.join(10)
    assert third in (["cuda:0"], ["cuda:1"])  # and gets one once they are back


def test_runs_of_one_task_share_one_preparation():
    """The fan-out's threads tokenize a task once: runs that ask while it is being read wait
    for that reading and get the same object; another task is prepared on its own; a task no
    run holds any more is freed, and read again if asked for."""
    import gc
    import threading

    shared = fanout.SharedPreparations()
    builds: list[str] = []
    reading = threading.Event()
    release = threading.Event()

    def build(name: str, slow: bool):
        def read():
            builds.append(name)
            if slow:  # the other runs of the task arrive while it is read
                reading.set()
                release.wait(30)
            return fanout._Prepared(encoder=name, prepared=[name])
        return read

    got: list = []
    threads = [threading.Thread(target=lambda: got.append(shared.get("MRPC", build("MRPC", True))))
               for _ in range(3)]
    for t in threads:
        t.start()
    assert reading.wait(10)
    others: list = []
    rte = threading.Thread(target=lambda: others.append(shared.get("RTE", build("RTE", False))))
    rte.start()
    rte.join(10)  # not blocked behind MRPC's reading, which is still going on
    assert not rte.is_alive() and others[0].encoder == "RTE" and not got
    release.set()
    for t in threads:
        t.join(10)
    assert builds == ["MRPC", "RTE"]
    assert len(got) == 3 and got[0] is got[1] is got[2]
    del got[:], others[:]
    gc.collect()
    shared.get("MRPC", build("MRPC", False))
    assert builds == ["MRPC", "RTE", "MRPC"]

    # A failed reading fails the runs waiting for it without reading again ...
    failing, fail = threading.Event(), threading.Event()

    def malformed():
        builds.append("CoLA")
        failing.set()
        fail.wait(30)
        raise ValueError("CoLA/train.tsv line 7: 3 fields, expected 4")

    errors: list[str] = []

    def run() -> None:
        try:
            shared.get("CoLA", malformed)
        except (ValueError, RuntimeError) as e:
            errors.append(f"{type(e).__name__}: {e}")

    cola = [threading.Thread(target=run) for _ in range(3)]
    cola[0].start()
    assert failing.wait(10)
    for t in cola[1:]:
        t.start()
    deadline = time.monotonic() + 10
    while shared._keys["CoLA"].waiting < 3:  # the other two wait on CoLA's key
        assert time.monotonic() < deadline
        time.sleep(0.01)
    fail.set()
    for t in cola:
        t.join(10)
    assert builds.count("CoLA") == 1 and len(errors) == 3
    assert max(errors) == "ValueError: CoLA/train.tsv line 7: 3 fields, expected 4"
    assert all(e.startswith("RuntimeError: ValueError: CoLA/train.tsv line 7") for e in
               sorted(errors)[:2])
    # ... and a run that comes after them reads the (now fixed) task again
    assert shared.get("CoLA", build("CoLA", False)).encoder == "CoLA"


def test_launch_commands_for_each_launcher():
    cfg = resolve("tiny")
    assert steps.launch_command(cfg, "c.json")[1:] == [
        "-m", "training.pretrain", "--config", "c.json"]
    torchrun = steps.launch_command(resolve("tiny", {"launch": {"launcher": "torchrun",
                                                                "nproc_per_node": 2}}), "c.json")
    assert torchrun[0].endswith("torchrun") and "--nproc_per_node=2" in torchrun
    ds = steps.launch_command(resolve("large", CLUSTER_DATA), "c.json")
    assert ds[0].endswith("deepspeed") and ds[1:4] == ["--num_gpus=8", "--module",
                                                        "training.pretrain"]
    hosts = {**CLUSTER_DATA, "launch": {"hostfile": "/etc/deepspeed/hostfile"}}
    multi = steps.launch_command(resolve("large", hosts), "c.json")
    assert multi[1:3] == ["--hostfile", "/etc/deepspeed/hostfile"]
    assert ["--module", "training.pretrain"] == multi[4:6]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_cancelled_subprocess_group_is_stopped(tmp_path, sig):
    """Cancelling the flow (SIGTERM to its process) or killing it must take the trainer down."""
    marker = tmp_path / "child.pid"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\n"
                       "time.sleep(600)\n")
    script = (f"import sys\nfrom flows.launch import run_subprocess\n"
              f"run_subprocess([sys.executable, {str(trainer)!r}])\n")
    parent = subprocess.Popen([sys.executable, "-c", script])
    for _ in range(100):
        if marker.exists() and marker.read_text():
            break
        time.sleep(0.1)
    child = int(marker.read_text())
    parent.send_signal(sig)
    parent.wait(30)
    time.sleep(0.5)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


# ---------------------------------------------------------------- real server + deployment

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture()
def prefect_server(tmp_path):
    port = _free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
           "BERT_DAG_HOME": str(REPO), "BERT_IMAGE": "bert-dag:test", "DS_ACCELERATOR": "cpu",
           "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    log = open(tmp_path / "server.log", "w")  # noqa: SIM115 (the server writes to it until teardown)
    server = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                               "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                    break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError("Prefect server did not become healthy in 120 s: "
                               + (tmp_path / "server.log").read_text()[-2000:])
        yield env
    finally:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)


def _prefect(env, *args, timeout=600) -> subprocess.CompletedProcess:
    out = subprocess.run([str(BIN / "prefect"), *args], env=env, cwd=REPO, capture_output=True, check=False,
                         text=True, timeout=timeout)
    assert out.returncode == 0, f"prefect {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out


def _artifacts(env, flow_run_id: str) -> dict[str, object]:
    code = (
        "import json, sys\n"
        "from prefect.client.orchestration import get_client\n"
        "from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId\n"
        "with get_client(sync_client=True) as c:\n"
        "    arts = c.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id="
        "ArtifactFilterFlowRunId(any_=[sys.argv[1]])))\n"
        "    print(json.dumps({a.key: a.data for a in arts}))\n")
    out = subprocess.run([sys.executable, "-c", code, flow_run_id], env=env, capture_output=True, check=False,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _run_deployment(env, overrides, data_only: bool = False) -> str:
    params = {"preset": "tiny", "overrides": overrides, "data_only": data_only}
    out = _prefect(env, "deployment", "run", "pretrain-bert/tiny", "--params",
                   json.dumps(params), "--watch",
                   "--watch-timeout", "900", timeout=960)
    flow_run_id = next(line.split("UUID:")[1].strip() for line in out.stdout.splitlines()
                       if "UUID:" in line)
    assert "Completed" in out.stdout, out.stdout[-3000:]
    return flow_run_id


def test_deployment_run_tiny_then_rerun_reuses_every_stage(prefect_server, tmp_path):
    env = prefect_server
    _prefect(env, "work-pool", "create", "local-process", "--type", "process")
    _prefect(env, "--no-prompt", "deploy", "--name", "tiny")
    worker_log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 (the worker writes to it)
    worker = subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "local-process"],
                              env=env, cwd=REPO, stdout=worker_log, stderr=subprocess.STDOUT,
                              start_new_session=True)
    overrides = {
        "output": str(tmp_path / "run"),
        "shards": {"dupe_factor": 1},
        "pretrain": {"phase1": {"steps": 8, "warmup_steps": 2, "global_batch_size": 16,
                                "micro_batch_size": 16},
                     "phase2": {"steps": 3, "warmup_steps": 1, "global_batch_size": 4,
                                "micro_batch_size": 4}},
        # The bundled sample has no WNLI: that run fails, and must not take RTE down with it.
        "finetune": {"tasks": ["rte", "wnli"], "learning_rates": [1e-4], "seeds": [1],
                     "epochs": 1, "max_train_examples": 32, "max_eval_examples": 32},
    }
    try:
        data = _artifacts(env, _run_deployment(env, overrides, data_only=True))
        first = _artifacts(env, _run_deployment(env, overrides))
        second = _artifacts(env, _run_deployment(env, overrides))
    finally:
        os.killpg(worker.pid, signal.SIGINT)  # the worker may ignore SIGTERM for long
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)

    assert {"stage-timings", "report", "finetune-results", "loss-curve"} <= set(first)
    stages_data = {row["stage"]: row["cached"] for row in json.loads(data["stage-timings"])}
    stages_first = {row["stage"]: row["cached"] for row in json.loads(first["stage-timings"])}
    stages_second = {row["stage"]: row["cached"] for row in json.loads(second["stage-timings"])}
    data_stages = {"wikipedia", "books", "corpus", "vocab", "shards128", "shards256"}
    assert stages_data == dict.fromkeys(data_stages, False)  # data_only builds the data alone
    assert "finetune-results" not in data and "loss-curve" not in data
    assert set(stages_first) == data_stages | {"pretrain", "export"}
    # the full run reuses the data stages and builds the rest; a second one reuses everything
    assert stages_first == {**dict.fromkeys(data_stages, True), "pretrain": False, "export": False}
    assert all(stages_second.values())
    assert "RTE" in first["finetune-results"] and "WNLI" not in first["finetune-results"]
    report = (tmp_path / "run" / "report.md").read_text()  # the full run's, not the data run's
    assert "FAILED" in report and "'task': 'wnli'" in report
    assert "| shards256 | no |" in (tmp_path / "run" / "report-data.md").read_text()
    assert "| pretrain | yes |" in report
    assert (tmp_path / "run" / "finetune").is_dir()


def test_a_launched_job_gets_no_stale_rendezvous(monkeypatch):
    """An in-process run leaves RANK/MASTER_PORT in os.environ; the pretrain job the flow
    launches must pick its own port, not bind one that is still in use."""
    monkeypatch.setenv("MASTER_PORT", "58713")
    monkeypatch.setenv("RANK", "0")
    lines: list[str] = []
    show = "import os; print(os.environ.get('MASTER_PORT'), os.environ.get('RANK'), " \
           "os.environ['DS_ACCELERATOR'])"
    launch.run_subprocess([sys.executable, "-c", show], log=lines.append)
    assert lines[-1] == "None None cpu"


def test_launched_trainers_take_the_callers_accelerator_or_torchs(monkeypatch):
    """DS_ACCELERATOR passes through (the GPU image sets cuda); unset, it follows torch, so a
    GPU machine's trainers are not sent to the CPU (it used to be "cpu" whenever unset)."""
    import torch

    show = "import os; print(os.environ['DS_ACCELERATOR'])"
    for setting, expected in (("cuda", "cuda"), (None, "cuda" if torch.cuda.is_available()
                                                 else "cpu")):
        if setting:
            monkeypatch.setenv("DS_ACCELERATOR", setting)
        else:
            monkeypatch.delenv("DS_ACCELERATOR", raising=False)
        lines: list[str] = []
        launch.run_subprocess([sys.executable, "-c", show], log=lines.append)
        assert lines[-1] == expected


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


def _glue_fan_out(cfg, model_dir: Path) -> dict:
    """The flow's fine-tuning steps (each job, then the best), run in this process."""
    from flows.stages import StageResult

    model = StageResult("export", str(model_dir), "test", cached=False, seconds=0.0)
    return fanout.finetune_best(cfg, model, [fanout.finetune_run(cfg, model, job)
                                            for job in fanout.finetune_jobs(cfg)])


def test_glue_fan_out_sets_bad_rows_aside_in_the_dead_letter_file(shared_data, minilm_dir,
                                                                  tmp_path, caplog):
    """finetune.skip_bad_rows: the flow writes the rows set aside (file, line, reason, text) to
    finetune/dead_letter/ as bert-glue does; without it the run fails naming the file and
    line."""
    from tests.support.glue_fixtures import glue_slice

    data = glue_slice(shared_data, tmp_path / "glue", {"RTE/train.tsv": 8, "RTE/dev.tsv": 4})
    train = (data / "RTE" / "train.tsv").read_text(encoding="utf-8").split("\n")
    train[2] = train[2].rsplit("\t", 1)[0] + "\tentailed"  # line 3: unknown label
    (data / "RTE" / "train.tsv").write_text("\n".join(train), encoding="utf-8")
    glue = {"data": str(tmp_path), "tasks": ["rte"], "learning_rates": [1e-4], "seeds": [1],
            "epochs": 0.5}
    strict = resolve("tiny", {"output": str(tmp_path / "strict"), "finetune": glue})
    path = data / "RTE" / "train.tsv"
    with pytest.raises(ValueError, match=f"{path}:3: label 'entailed' is not one of"):
        _glue_fan_out(strict, minilm_dir)

    cfg = resolve("tiny", {"output": str(tmp_path / "run"),
                           "finetune": {**glue, "skip_bad_rows": "true"}})
    summary = _glue_fan_out(cfg, minilm_dir)
    dead_letter = tmp_path / "run" / "finetune" / "dead_letter" / "glue_bad_rows.jsonl"
    assert summary["files"]["dead_letter"] == str(dead_letter)
    assert [json.loads(line) for line in dead_letter.read_text(encoding="utf-8").splitlines()] == [
        {"task": "RTE", "file": str(path), "record": "line 3", "text": train[2],
         "reason": "label 'entailed' is not one of ['entailment', 'not_entailment']"}]
    results = json.loads((tmp_path / "run" / "finetune" / "results.json").read_text())
    assert (results["bad_rows"], results["tasks"][0]["num_train_examples"]) == (1, 7)
    assert ("fine-tuning: 1 malformed record(s) set aside (finetune.skip_bad_rows) in "
            f"{dead_letter}" in caplog.messages)


def test_glue_fan_out_checks_the_tokenizer_against_the_model(shared_data, minilm_dir, tmp_path):
    """A model folder whose vocabulary has ids the model cannot embed fails before training
    with the check bert-glue runs, not with an IndexError deep in torch."""
    from tests.support.glue_fixtures import glue_slice

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for name in ("config.json", "model.safetensors"):
        (model_dir / name).symlink_to(minilm_dir / name)
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (model_dir / "vocab.txt").write_text("\n".join([*vocab, "newtoken"]) + "\n", encoding="utf-8")
    data = glue_slice(shared_data, tmp_path / "glue", {"RTE/train.tsv": 4, "RTE/dev.tsv": 4})
    cfg = resolve("tiny", {"output": str(tmp_path / "run"), "finetune": {
        "data": str(data.parent), "tasks": ["rte"], "learning_rates": [1e-4], "seeds": [1]}})
    with pytest.raises(ValueError, match=f"tokenizer of {model_dir} gives token ids up to 30522 "
                                         f"\\(30523 ids\\) but the model {model_dir} has "
                                         "vocab_size 30522"):
        _glue_fan_out(cfg, model_dir)


def test_extraction_stage_is_rebuilt_when_the_jobs_output_version_changes(tmp_path,
                                                                          monkeypatch):
    """Same input and options, other records from newer code: once a job bumps its
    OUTPUT_VERSION the stage's hash holds it, so an older cached output is not reused."""
    from pipelines import extract_books

    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text("It was a dark night. The rain fell.\n\nThen it stopped.\n")
    cfg = resolve("tiny", {"output": str(tmp_path / "run"),
                           "data": {"books": str(books)}})
    assert steps.extract_stage_config("in", "sha", 1) == {"input": "in", "input_sha": "sha",
                                                          "output_version": 1}
    first = steps.extract_books(cfg)
    assert (first.cached, steps.extract_books(cfg).cached) == (False, True)
    assert first.manifest["output_version"] == extract_books.OUTPUT_VERSION == 2
    monkeypatch.setattr(extract_books, "OUTPUT_VERSION", 3)
    newer = steps.extract_books(cfg)
    assert not newer.cached and newer.path != first.path
