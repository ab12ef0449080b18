"""The optional dependencies by subsystem (pyproject.toml's extras, common/extras.py).

The commands run with some packages hidden from the import system (`hidden_env`: every finder
on sys.meta_path answers "not found" for them, so `import apache_beam` fails and
`importlib.util.find_spec` says None, as in an environment where they were never installed):
fine-tuning and pre-training without Beam or Prefect, and each command without its extra
ending in one line naming it. The `slow` test installs `.[train]` in a fresh virtualenv.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

from common import extras
from tests.conftest import REPO, SAMPLE_DATA

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BIN = Path(sys.executable).parent

# Run as sitecustomize (PYTHONPATH) before the command: each finder on sys.meta_path, the
# editable install's too, is wrapped to find nothing for the hidden top-level names.
HIDE = '''\
import os, sys

HIDDEN = set(os.environ["BERT_HIDDEN_MODULES"].split(","))


class Hidden:
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.finder.find_spec(name, path, target)

    def invalidate_caches(self):
        getattr(self.finder, "invalidate_caches", lambda: None)()


sys.meta_path[:] = [Hidden(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
'''


def hidden_env(tmp_path: Path, hidden: set[str]) -> dict[str, str]:
    site = tmp_path / "hide"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE)
    return {**os.environ, "PYTHONPATH": str(site), "BERT_HIDDEN_MODULES": ",".join(sorted(hidden)),
            "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu", "TOKENIZERS_PARALLELISM": "false"}


def run(args: list[str], env: dict[str, str], timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def script(name: str) -> str:
    """The installed console script (its entry point, as a user starts it)."""
    path = BIN / name
    assert path.is_file(), f"{name} is not installed in {BIN} (pip install -e '.[all]')"
    return str(path)


# --- the lists --------------------------------------------------------------------------------

def requirement_names(extra: str) -> tuple[set[str], set[str]]:
    """The distributions an extra lists, and the extras of the project itself it names."""
    names, included = set(), set()
    for line in PYPROJECT["optional-dependencies"][extra]:
        req = Requirement(line)
        if req.name == PYPROJECT["name"]:
            included |= req.extras
        else:
            names.add(req.name.lower())
    return names, included


def test_extras_name_the_modules_of_pyprojects_lists():
    distributions: dict[str, set[str]] = {}
    for module, dists in packages_distributions().items():
        for dist in dists:
            distributions.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    for extra, listed in extras.EXTRAS.items():
        names, included = requirement_names(extra)
        assert included == set(extras.INCLUDES.get(extra, ())), extra
        assert names, extra
        # each distribution the extra lists provides one of the modules extras.py names, and
        # each module named there comes from one of the extra's distributions
        provided = {name: distributions[name] & set(listed) for name in names}
        assert all(provided.values()), (extra, provided)
        assert set(listed) == set().union(*provided.values()), extra


def test_the_core_is_what_common_imports_and_all_is_every_extra():
    core = {Requirement(line).name.lower() for line in PYPROJECT["dependencies"]}
    assert core == {"numpy", "tokenizers", "pyyaml", "tqdm"}
    _, everything = requirement_names("all")
    assert set(extras.EXTRAS) | {"trackers", "gcp"} == everything
    assert extras.COMMANDS.keys() == PYPROJECT["scripts"].keys()
    assert set(extras.COMMANDS.values()) <= set(extras.EXTRAS)


def test_a_missing_module_names_the_extra_that_installs_it():
    assert extras.extra_of("bert-dag", "apache_beam") == "flow"  # flow installs data too
    assert extras.extra_of("beam", "apache_beam") == "data"
    assert extras.extra_of("beam", "torch") == "train"  # the contamination audit's readers
    assert extras.extra_of("bert-finetune", "pyarrow") == "train"
    assert extras.extra_of("bert-finetune", "flash_attn") is None

    def fails(module: str) -> None:
        raise ModuleNotFoundError(f"No module named {module!r}", name=module)

    with pytest.raises(SystemExit) as stop:
        extras.reports_missing("beam")(fails)("torch.nn")
    assert str(stop.value) == "beam: needs the train extra: pip install '.[train]'"
    with pytest.raises(ModuleNotFoundError):  # not an extra's: the error as it was
        extras.reports_missing("beam")(fails)("flash_attn")


# --- the commands, with packages hidden ---------------------------------------------------------

@pytest.mark.parametrize("command", ["bert-finetune", "bert-glue", "bert-features",
                                     "bert-pretrain"])
def test_training_commands_run_without_beam_or_prefect(command, tmp_path):
    env = hidden_env(tmp_path, {"apache_beam", "prefect", "fastapi"})
    done = run([script(command), "--help"], env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith(f"usage: {command} ")
    code = ("import sys, finetune.cli, finetune.glue.cli, training.pretrain, model.hf\n"
            "import importlib.util\n"
            "assert importlib.util.find_spec('apache_beam') is None\n"
            "print(' '.join(sorted({n.split('.')[0] for n in sys.modules})))")
    done = run([sys.executable, "-c", code], env)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = set(done.stdout.split())
    assert {"finetune", "training", "model", "torch"} <= loaded
    assert not loaded & {"apache_beam", "prefect", "fastapi", "pipelines", "flows"}


def test_finetuning_trains_without_beam_or_prefect(minilm_dir, tmp_path):
    """A real `bert-finetune` run (MiniLM, 8 RTE rows, one epoch) with Beam and Prefect hidden:
    the run's lazy imports (metrics, the report) need neither."""
    data = tmp_path / "data" / "glue" / "RTE"
    data.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        lines = (SAMPLE_DATA / "glue" / "RTE" / name).read_text(encoding="utf-8").splitlines(True)
        (data / name).write_text("".join(lines[:9]), encoding="utf-8")
    out = tmp_path / "out"
    done = run([script("bert-finetune"), "--model", str(minilm_dir), "--data",
                str(tmp_path / "data"), "--output", str(out), "--tasks", "rte",
                "--learning_rates", "5e-5", "--seeds", "1", "--epochs", "1", "--batch_size", "2",
                "--max_seq_length", "64", "--no_progress", "--num_threads", "1"],
               hidden_env(tmp_path, {"apache_beam", "prefect", "fastapi"}))
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / "results.json").is_file() and (out / "summary.md").is_file()


FLOW = "bert-dag: needs the flow extra: pip install '.[flow]'"
DATA = "beam: needs the data extra: pip install '.[data]'"


def train(command: str) -> str:
    return f"{command}: needs the train extra: pip install '.[train]'"


@pytest.mark.parametrize("args, hidden, line", [
    (["bert-dag", "--preset", "tiny"], {"prefect"}, FLOW),
    (["bert-dag", "--help"], {"apache_beam"}, FLOW),
    (["bert-dag", "--help"], {"deepspeed"}, FLOW),
    (["beam", "run", "pipelines/make_shards.py", "--help"], {"apache_beam"}, DATA),
    (["beam", "run", "pipelines/make_shards.py"], {"py3langid"}, DATA),
    (["bert-finetune", "--help"], {"torch"}, train("bert-finetune")),
    (["bert-glue", "--help"], {"seqeval"}, train("bert-glue")),
    (["bert-features", "--help"], {"transformers"}, train("bert-features")),
    (["bert-pretrain", "--help"], {"deepspeed"}, train("bert-pretrain")),
    (["bert-pretrain", "--help"], {"torch", "apache_beam"}, train("bert-pretrain")),
], ids=lambda v: ",".join(sorted(v)) if isinstance(v, set) else None)
def test_a_command_without_its_extra_says_which_in_one_line(args, hidden, line, tmp_path):
    done = run([script(args[0]), *args[1:]], hidden_env(tmp_path, hidden), timeout=120)
    assert (done.returncode, done.stderr.splitlines()) == (1, [line]), done.stderr[-3000:]
    assert done.stdout == ""


# --- a fresh virtualenv -------------------------------------------------------------------------

@pytest.mark.slow
def test_pip_install_train_extra_in_a_fresh_venv_runs_finetuning(tmp_path):
    """`pip install torch==2.13.0+cpu` then `pip install '.[train]'` in a new virtualenv, from a
    copy of the sources (pip builds in the tree it is given): no Beam, no Prefect, `pip check`
    clean; `bert-finetune` starts, `bert-dag` and `beam` name their extras. Needs the package
    sources pip is configured with (a local wheel folder or the registries); ~80 s here."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"]["find"]["include"]
    for package in {p.rstrip("*") for p in packages}:
        shutil.copytree(REPO / package, source / package,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    venv = tmp_path / "venv"
    started = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)

    def pip(*args: str) -> str:
        done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", *args],
                              capture_output=True, text=True, timeout=1800, check=False)
        assert done.returncode == 0, (args, done.stdout[-3000:], done.stderr[-3000:])
        return done.stdout

    # torch first, as scripts/setup.sh does: the CPU build, from a local wheel source pip is
    # configured with when it has one, else from PyTorch's CPU index
    torch = "torch==2.13.0+cpu"
    local = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                            "--dry-run", "--no-index", "--no-deps", torch],
                           capture_output=True, timeout=600, check=False).returncode == 0
    pip("install", "-q", torch,
        *([] if local else ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]))
    pip("install", "-q", f"{source}[train]")
    seconds = time.monotonic() - started
    pip("check")
    installed = {line.split("==")[0].lower() for line in pip("list", "--format=freeze").split()}
    assert {"torch", "deepspeed", "transformers", "bert-dag"} <= installed
    assert not installed & {"apache-beam", "prefect", "fastapi"}, sorted(installed)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DS_ACCELERATOR": "cpu"}
    env.pop("PYTHONPATH", None)

    def command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300, check=False)

    done = command("bert-finetune", "--help")
    assert done.returncode == 0 and done.stdout.startswith("usage: bert-finetune "), done.stderr
    done = command("python", "-c", "import finetune.cli, model.hf, training.pretrain")
    assert done.returncode == 0, done.stderr
    assert command("bert-dag", "--help").stderr.splitlines() == [FLOW]
    assert command("beam", "run", "pipelines/make_shards.py").stderr.splitlines() == [DATA]
    size = sum(f.stat().st_size for f in venv.rglob("*") if f.is_file())
    print(f"fresh venv with .[train]: {seconds:.0f} s to install, {size / 2**20:.0f} MiB")
