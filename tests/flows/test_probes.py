"""Probes (flows/probes.py, flows/probe_report.py) on a real pre-training run's exports.

One real DeepSpeed run (4 + 2 steps, `probe_every=3`: exports at global steps 3 and 6), then
the probe runner on real fine-tuning slices of the bundled sample (SST-2, SQuAD v1.1): a probe
process killed with SIGKILL mid-run leaves no result, the next pass runs it and the rest, a
second pass runs nothing, the watcher reuses every result, and the report's table and chart.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from flows import probes
from flows import report as reporting
from flows.config import resolve
from flows.stages import StageResult
from tests.support.shard_fixtures import book_shards
from training.config import (
    CadenceConfig,
    ModelConfig,
    PhaseConfig,
    PretrainConfig,
    PretrainDataConfig,
)

TASKS = ("sst-2", "squad1")
NAMES = ["sst-2 @ step 3", "squad1 @ step 3", "sst-2 @ step 6", "squad1 @ step 6"]


def pretrain_run(data, run_dir) -> None:
    """The real trainer, two phases, probe exports at global steps 3 and 6."""
    from training import pretrain

    phases = tuple(PhaseConfig(name=name, train_shards=str(data.shards_128), max_seq_length=128,
                               micro_batch_size=4, global_batch_size=8, steps=steps,
                               warmup_steps=1, learning_rate=2e-3)
                   for name, steps in (("phase1", 4), ("phase2", 2)))
    pretrain.run(PretrainConfig(
        model=ModelConfig(preset="bert_tiny"), output_dir=str(run_dir), phases=phases,
        data=PretrainDataConfig(vocab_dir=str(data.vocab_dir), num_workers=0, shuffle_buffer=16),
        cadence=CadenceConfig(log_every=1, eval_every=0, eval_batches=2, checkpoint_every=0,
                              probe_every=3), seed=7))


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def kill_mid_probe(job: probes.ProbeJob) -> list[str]:
    """Start `job`'s probe process, SIGKILL it once it is fine-tuning; its stderr lines."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(probes.probe_command(job), env=env, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    try:
        for line in proc.stderr:
            lines.append(line.rstrip())
            if "fine-tuning" in line:
                os.kill(proc.pid, signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, lines
    return lines


@pytest.fixture(scope="module")
def probed(shared_data, tmp_path_factory) -> dict:
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    root = tmp_path_factory.mktemp("probes")
    run_dir = root / "pretrain-run"
    pretrain_run(made, run_dir)
    probe = {"tasks": ",".join(TASKS), "max_train_examples": 16, "max_eval_examples": 16,
             "batch_size": 8, "keep_exports": True}  # the tests below probe them again
    cfg = resolve("tiny", {"output": str(root), "pretrain": {"cadence": {"probe_every": 3}},
                           "finetune": {"probe": probe}})
    jobs = probes.probe_jobs(cfg, str(run_dir))
    killed = kill_mid_probe(jobs[0])
    left_after_kill = sorted(os.listdir(jobs[0].out)) if os.path.isdir(jobs[0].out) else []
    first = probes.run_probes(cfg, str(run_dir))
    second = probes.run_probes(cfg, str(run_dir))
    probes.pretraining_ended(str(run_dir))
    watched = probes.watch(cfg, str(run_dir), poll_seconds=0.1)
    return {"cfg": cfg, "root": root, "run_dir": run_dir, "jobs": jobs, "killed": killed,
            "left_after_kill": left_after_kill, "first": first, "second": second,
            "watched": watched}


def test_exports_are_found_at_the_due_steps_with_their_checksums(probed):
    exports = probes.find_exports(str(probed["run_dir"]))
    assert [e.global_step for e in exports] == [3, 6]
    for export in exports:
        manifest = json.loads((probed["run_dir"] / "probes" / f"step-{export.global_step:07d}"
                               / "manifest.json").read_text())
        assert export.weights_sha256 == manifest["weights_sha256"]
    assert [j.name for j in probed["jobs"]] == NAMES


def test_a_killed_probe_leaves_no_result_and_the_next_pass_runs_it_and_the_rest(probed):
    assert probed["killed"][-1] == "probe sst-2 on step 3: fine-tuning 16 examples"
    assert "results.json" not in probed["left_after_kill"]
    assert probed["first"] == {"ran": NAMES, "reused": [], "failed": []}


def test_results_are_content_addressed_and_a_second_pass_runs_nothing(probed):
    assert probed["second"] == {"ran": [], "reused": NAMES, "failed": []}
    assert probed["watched"] == {"ran": [], "reused": NAMES, "failed": []}
    folders = sorted(p.name for p in (probed["root"] / "probes").iterdir())
    assert len(folders) == 4 and len({f.rsplit("-", 1)[1] for f in folders}) == 4
    for job in probed["jobs"]:
        result = read_json(job.results)
        assert (result["task"], result["global_step"], result["weights_sha256"]) == (
            job.task, job.export.global_step, job.export.weights_sha256)
        assert result["num_train"] == 16 and result["loop"]["learning_rates"] == [1e-4]
        metrics = {"sst-2": {"accuracy"}, "squad1": {"exact", "f1"}}[job.task]
        assert set(result["metrics"]) == metrics
        assert 0.0 <= result["score"] <= 1.0


def test_the_report_tabulates_and_charts_each_probe_by_step_and_tokens(probed):
    cfg, run_dir = probed["cfg"], str(probed["run_dir"])
    stage = StageResult("pretrain", run_dir, "key", cached=False, seconds=1.0)
    out = reporting.report(cfg, [stage], None, folder=str(probed["root"] / "report"))
    lines = out["markdown"].splitlines()
    start = lines.index("## Probes (quality while it trains)")
    lines_of_metrics = (probed["run_dir"] / "metrics.jsonl").read_text().splitlines()
    train = {r["global_step"]: r for r in map(json.loads, lines_of_metrics)
             if r["split"] == "train"}
    scores = {(j.task, j.export.global_step): read_json(j.results)["score"]
              for j in probed["jobs"]}
    # 8 rows of 128 tokens per step in both phases: 1024 tokens a step
    assert lines[start + 2:start + 6] == [
        ("| step | tokens seen (est.: steps x batch x length) | MLM loss | NSP loss | sst-2 "
         "| squad1 |"), "|---:|---:|---:|---:|---:|---:|",
        *(f"| {s} | {s * 1024} | {train[s]['mlm_loss']:.4f} | {train[s]['nsp_loss']:.4f} | "
          f"{scores[('sst-2', s)]:.4f} | {scores[('squad1', s)]:.4f} |" for s in (3, 6))]
    png = probed["root"] / "report" / "probe_curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"![probe curves]({png})" in out["markdown"]


def test_probe_settings_are_checked_in_the_flows_terms(tmp_path):
    cfg = resolve("tiny", {"output": str(tmp_path), "finetune": {"probe": {"tasks": "nope"}}})
    with pytest.raises(ValueError, match=r"^setting finetune.probe.tasks=nope: unknown task "
                                         r"'nope'; known: cola,"):
        probes.check(cfg)
    with pytest.raises(ValueError, match=r"^setting finetune.probe.epochs: must be > 0, got 0"):
        resolve("tiny", {"output": str(tmp_path), "finetune": {"probe": {"epochs": 0}}})
    assert resolve("tiny").pretrain.cadence.probe_every == 200  # steps 200, 400, 600 of 660



def test_a_probe_past_its_timeout_is_stopped_and_counted_failed(probed, tmp_path):
    """A stuck probe (here: one given half a second, less than its start-up) never holds the
    watcher, and so the report: its process is killed and it counts as failed."""
    job = probed["jobs"][0]
    assert os.path.isdir(job.export.hf_dir)  # the weights are there: only the clock stops it
    out = str(tmp_path / "stuck")
    stuck = dataclasses.replace(job, out=out, spec={**job.spec, "out": out, "timeout_s": 0.5})
    started = time.monotonic()
    assert probes.run_probe(stuck) == "failed"
    assert time.monotonic() - started < 30
    assert not os.path.exists(stuck.results)


STAND_IN_FLOW = """
import json, sys
from flows import probes
from flows.config import resolve
if sys.argv[1] == "job":
    spec = json.loads(sys.argv[2])
    export = probes.ProbeExport(spec["global_step"], spec["hf_dir"], spec["weights_sha256"])
    print(probes.run_probe(probes.ProbeJob(spec["task"], export, spec["out"], spec)))
else:
    cfg = resolve("tiny", json.loads(sys.argv[2]))
    print(json.dumps(probes.run_probes(cfg, sys.argv[3])))
"""
"""A flow's process as far as its probes go: `run_probe` of one job, or a pass of `run_probes`."""


def stand_in_flow(*args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", STAND_IN_FLOW, *args], env=env, text=True,
                            **popen)


def test_a_probe_process_dies_with_its_flow(probed, tmp_path):
    """The flow's process killed with SIGKILL while its probe fine-tunes: the probe process
    ends with it (Linux's parent-death signal) and writes no result after the kill."""
    import psutil

    job = probed["jobs"][0]
    out = str(tmp_path / "orphan")
    flow = stand_in_flow("job", json.dumps({**job.spec, "out": out}),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (children := psutil.Process(flow.pid).children()):
        assert flow.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    (probe,) = children
    while probe.io_counters().write_chars == 0:  # its first line: "... fine-tuning N examples"
        assert probe.is_running() and time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(flow.pid, signal.SIGKILL)
    flow.wait()
    killed = time.monotonic()
    while probe.is_running() and probe.status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() - killed < 2, "the probe outlived its flow"
        time.sleep(0.05)
    print(f"probe process ended {time.monotonic() - killed:.2f} s after its flow")
    time.sleep(1.0)
    assert not os.path.exists(os.path.join(out, probes.RESULTS))


def test_two_flows_on_one_root_run_each_probe_once(probed, tmp_path):
    """Two flows' probe passes at once on one root: the probe runs in one of them (its result
    folder's build lock, flows/stages.py), the other waits and reuses its result; no
    traceback. (One export, step 3's, and one task: one probe.)"""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(probed["run_dir"] / "probes" / "step-0000003",
                    run_dir / "probes" / "step-0000003")
    overrides = {"output": str(tmp_path), "pretrain": {"cadence": {"probe_every": 3}},
                 "finetune": {"probe": {"tasks": "sst-2", "max_train_examples": 16,
                                        "max_eval_examples": 16, "batch_size": 8,
                                        "keep_exports": True}}}  # other tests read them
    flows = [stand_in_flow("pass", json.dumps(overrides), str(run_dir),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    done = [flow.communicate(timeout=600) for flow in flows]
    assert [flow.returncode for flow in flows] == [0, 0], [err[-3000:] for _, err in done]
    assert not any("Traceback" in err for _, err in done), [err[-3000:] for _, err in done]
    outcomes = sorted((json.loads(out.strip().splitlines()[-1]) for out, _ in done),
                      key=lambda outcome: outcome["reused"])
    assert outcomes == [{"ran": ["sst-2 @ step 3"], "reused": [], "failed": []},
                        {"ran": [], "reused": ["sst-2 @ step 3"], "failed": []}]


def test_the_probe_scores_go_to_the_trackers_by_step(probed, tmp_path, monkeypatch):
    """With `pretrain.cadence.report_to=mlflow`, the report's tracker run holds each probe's
    score as `probe/<task>` at its export's global step (a REAL local MLflow store). The report
    made again (a re-run) continues that run: still one run, one point a probe."""
    from tests.support.trackers import mlflow_client, mlflow_runs, no_tracker_account

    no_tracker_account(monkeypatch, tmp_path)
    cfg = dataclasses.replace(probed["cfg"], pretrain=dataclasses.replace(
        probed["cfg"].pretrain, cadence=dataclasses.replace(
            probed["cfg"].pretrain.cadence, report_to=("mlflow",))))
    stage = StageResult("pretrain", str(probed["run_dir"]), "key", cached=False, seconds=1.0)
    reporting.report(cfg, [stage], None, folder=str(tmp_path / "report"))
    reporting.report(cfg, [stage], None, folder=str(tmp_path / "report"))
    (run,) = mlflow_runs(probed["root"])
    assert run.info.status == "FINISHED"
    client = mlflow_client(probed["root"])
    for task in TASKS:
        history = client.get_metric_history(run.info.run_id, f"probe/{task}")
        assert sorted((m.step, m.value) for m in history) == sorted(
            (j.export.global_step, read_json(j.results)["score"])
            for j in probed["jobs"] if j.task == task)
    assert "probe_curves.png" in [a.path for a in client.list_artifacts(run.info.run_id)]


def test_probe_data_edited_in_place_gives_new_result_folders(probed, tmp_path):
    """The key holds the data files' names, sizes and times, not only the folder's path: a
    probe task's data edited in place is probed again rather than reusing old scores."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(probed["cfg"].finetune.data, data)
    cfg = dataclasses.replace(probed["cfg"], finetune=dataclasses.replace(
        probed["cfg"].finetune, data=str(data)))
    before = {j.out for j in probes.probe_jobs(cfg, str(probed["run_dir"]))}
    job = probes.probe_jobs(cfg, str(probed["run_dir"]))[0]
    dev = next(p for p in (data / "glue" / "SST-2").iterdir() if p.name.startswith("dev"))
    dev.write_text(dev.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    after = {j.out for j in probes.probe_jobs(cfg, str(probed["run_dir"]))}
    assert job.out in before and job.out not in after
    assert len(before & after) == 2  # squad1's two folders are untouched


def test_an_exports_weights_go_once_every_task_has_its_result(probed, tmp_path, caplog):
    """`keep_exports=false`: an export with a task still failing keeps its weights for a re-run;
    once every task has a result its `hf/` is deleted and its manifest kept, results are still
    found through the manifest's sha256, and a task added later is refused in one line, with
    no probe process started."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(probed["run_dir"] / "probes", run_dir / "probes")

    def with_probe(**probe):
        return dataclasses.replace(probed["cfg"], finetune=dataclasses.replace(
            probed["cfg"].finetune, probe=dataclasses.replace(
                probed["cfg"].finetune.probe, keep_exports=False, **probe)))

    exports = [run_dir / "probes" / f"step-{step:07d}" for step in (3, 6)]
    rte_fails = with_probe(tasks=(*TASKS, "rte"), timeout_minutes=0.005)  # 0.3 s: never done
    assert probes.run_probes(rte_fails, str(run_dir)) == {
        "ran": [], "reused": NAMES, "failed": ["rte @ step 3", "rte @ step 6"]}
    assert all((e / "hf" / "model.safetensors").exists() for e in exports)

    assert probes.run_probes(with_probe(), str(run_dir)) == {
        "ran": [], "reused": NAMES, "failed": []}
    assert [sorted(os.listdir(e)) for e in exports] == [["manifest.json"]] * 2
    assert probes.run_probes(with_probe(), str(run_dir))["reused"] == NAMES

    caplog.set_level("WARNING", logger="flows")
    caplog.clear()
    started = time.monotonic()
    assert probes.run_probes(rte_fails, str(run_dir))["failed"] == ["rte @ step 3",
                                                                    "rte @ step 6"]
    assert time.monotonic() - started < 5
    assert [r.getMessage() for r in caplog.records] == [
        f"probe rte @ step {step} not run: the export's weights were deleted after its probes "
        "(finetune.probe.keep_exports=false)" for step in (3, 6)]
