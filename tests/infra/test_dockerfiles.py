"""The Dockerfiles: hadolint, the paths they copy, stages and pins, the GPU image's gsutil, and the
Dataflow package Beam's stager builds.

No Docker engine, GPU, cluster or cloud account exists on the development machines or in CI;
infra/README.md lists what therefore only gets checked, not executed.
"""

from __future__ import annotations

import ast
import fnmatch
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import tomllib
import yaml

from tests.infra.infra_files import INFRA, REPO, tool

DOCKERFILES = [REPO / "Dockerfile", INFRA / "dataflow" / "Dockerfile"]


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
    assert list(stages) == ["source", "cpu-builder", "cpu", "ci", "gpu-builder", "gpu"]
    for runtime in ("cpu", "ci", "gpu"):  # non-root, numeric so runAsNonRoot can check it
        assert re.findall(r"^USER (.*)$", stages[runtime], flags=re.MULTILINE)[-1] == "1000:1000"
        assert re.search(r"^CMD \[", stages[runtime], flags=re.MULTILINE), runtime
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["train"]
    deepspeed = next(d for d in deps if d.startswith("deepspeed==")).split("==")[1]
    assert "ARG TORCH_VERSION=2.13.0" in text and f"ARG DEEPSPEED_VERSION={deepspeed}" in text
    assert "--index-url https://download.pytorch.org/whl/cpu" in stages["cpu-builder"]
    # both runtime images run the flow (its data stages, on gs:// too): flow (data, train), gcp
    assert re.search(r"pyproject_requirements\.py --pyproject /tmp/pyproject\.toml --extra flow "
                     r"\\\s+--extra gcp > /requirements\.txt", stages["source"])
    assert "DS_BUILD_FUSED_ADAM=1" in stages["gpu-builder"]
    assert "--no-build-isolation" in stages["gpu-builder"]


def test_the_dataflow_image_runs_as_a_non_root_user():
    text = (INFRA / "dataflow" / "Dockerfile").read_text()
    final = text.split("\nFROM ")[-1]  # the image Dataflow starts; the launcher stage is a source
    users = re.findall(r"^USER (.*)$", final, flags=re.MULTILINE)
    assert users and users[-1] == "1000:1000", users
    assert re.search(r"useradd [^\n]*--uid 1000 [^\n]*beam", final)
    assert final.index("USER 1000:1000") > max(m.start() for m in re.finditer(r"^RUN ", final,
                                                                                flags=re.MULTILINE))


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
    optional = project["optional-dependencies"]
    # an extra naming the project itself stands for those extras' lines, each printed once
    flow = run("--no-main", "--extra", "flow").stdout.splitlines()
    assert flow == list(dict.fromkeys(optional["data"] + optional["train"] + optional["flow"][1:]))
    assert optional["flow"][0] == "bert-dag[data,train]" and not any("bert-dag" in r for r in flow)
    bad = run("--extra", "nope")
    assert bad.returncode != 0 and "no extra 'nope'" in bad.stderr


# --- Dataflow packaging ----------------------------------------------------------------------

def test_setup_file_package_builds_with_beams_stager_and_covers_the_imports(tmp_path):
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager

    dataflow = INFRA / "dataflow"
    assert (dataflow / "pipelines").resolve() == REPO / "pipelines"
    assert (dataflow / "common").resolve() == REPO / "common"
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
    sources = sorted(p for package in ("pipelines", "common")
                     for p in (REPO / package).rglob("*.py") if "__pycache__" not in p.parts)
    packaged = sorted(n.split("/", 1)[1] for n in names if n.endswith(".py")
                      and n.startswith((f"{root}/pipelines/", f"{root}/common/")))
    assert packaged == sorted(str(p.relative_to(REPO)) for p in sources)
    requirements = [line for line in (dataflow / "requirements.txt").read_text().splitlines()
                    if line and not line.startswith("#")]
    from packaging.requirements import Requirement

    def normal(lines):
        return [(r.name, r.specifier) for r in map(Requirement, lines)]

    assert normal(requires.decode().split()) == normal(requirements)

    # Every third-party module the jobs import is either Beam (in the SDK container) or listed.
    imported = set()
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    # (yaml: PyYAML, a requirement of apache-beam itself, so in the SDK container too; google:
    # google-auth, of apache-beam[gcp], read by the launcher's Dataflow check; finetune: the
    # contamination audit reads the evaluation sets on the launcher, its workers load an index)
    third_party = imported - set(sys.stdlib_module_names) - {
        "pipelines", "common", "apache_beam", "__future__", "yaml", "google", "finetune"}
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
    code = ("import sys, webdataset as wds\nfrom training.shard_trust import list_shards\n"
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
