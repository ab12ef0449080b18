"""Content-addressed stages: reuse only when config and upstream match, no manifest after a failure,
one build when two runs need a stage at once, the build lock held until the job is down."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows import steps
from flows.config import resolve
from flows.stages import run_stage

REPO = Path(__file__).resolve().parents[2]


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


def test_a_reused_stage_says_so_in_one_line(tmp_path, caplog):
    def build(out):
        logging.getLogger("flows").info("building")
        Path(out, "manifest.json").write_text("{}")

    with caplog.at_level(logging.INFO, logger="flows"):
        first = run_stage(str(tmp_path), "s", {"a": 1}, build)
        caplog.clear()
        run_stage(str(tmp_path), "s", {"a": 1}, build)
    assert caplog.messages == [f"s: reused {first.path}"]


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
from flows import devices, finetune_runs, launch, steps
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
    assert first.manifest["output_version"] == extract_books.OUTPUT_VERSION == 3
    monkeypatch.setattr(extract_books, "OUTPUT_VERSION", 4)
    newer = steps.extract_books(cfg)
    assert not newer.cached and newer.path != first.path
