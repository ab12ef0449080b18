"""GPU and cluster readiness that a CPU machine can check: the GPU image's build steps, the
Kubernetes Job's NCCL set-up, the refusal of a GPU launch where torch has no CUDA, and the
DeepSpeed config that overlaps the gradient reduction with the backward.

What needs a GPU, Docker or a cluster (the image build itself, NCCL over RDMA, the overlap's
effect on step time) is listed in infra/README.md and benchmarks/RESULTS.md.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from training import config as cfg
from training.ds_config import REDUCE_BUCKET_SIZE, build_ds_config
from training.launch import (
    deepspeed_arch_list,
    free_port,
    gpu_request,
    refuse_cpu_fallback,
    use_own_ninja,
)

REPO = Path(__file__).resolve().parents[2]
NO_CUDA = torch.version.cuda is None or not torch.cuda.is_available()
TORCH_WHEEL_CUDA = "13.0"
"""The CUDA release of PyPI's torch==2.13.0 Linux x86_64 wheel: its metadata requires
cuda-toolkit==13.0.3 and the *-cu13 NVIDIA packages (read from PyPI, 2026-11-25)."""


def stages() -> dict[str, str]:
    """Dockerfile stage name -> its instructions, with line continuations joined as Docker does."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", "")
    return dict(re.findall(r"^FROM \S+ AS (\S+)\n(.*?)(?=^FROM |\Z)", text,
                           flags=re.MULTILINE | re.DOTALL))


def instructions(stage: str, keyword: str) -> list[str]:
    return [line[len(keyword) + 1:] for line in stages()[stage].splitlines()
            if line.startswith(f"{keyword} ")]


def apt_packages(stage: str) -> set[str]:
    found = set()
    for run in instructions(stage, "RUN"):
        for command in re.findall(r"apt-get install ([^&]*)", run):
            found.update(w for w in command.split() if not w.startswith("-"))
    return found


# --- the GPU image ---------------------------------------------------------------------------

def test_gpu_builder_prebuilds_the_cuda_ops_without_a_gpu():
    """`docker build` sees no GPU: DS_ACCELERATOR=cuda must be set before DeepSpeed's op build,
    or it builds for its CPU accelerator and the installed-ops check stops the build. No CPU
    Adam (built with -march=native, for the build machine's CPU)."""
    builder = stages()["gpu-builder"]
    env = " ".join(instructions("gpu-builder", "ENV"))
    assert "DS_ACCELERATOR=cuda" in env and "TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}" in env
    (build,) = [r for r in instructions("gpu-builder", "RUN") if "DS_BUILD_" in r]
    assert builder.index("DS_ACCELERATOR=cuda") < builder.index(build)
    flags = set(re.findall(r"DS_BUILD_\w+=1", build))
    assert flags == {"DS_BUILD_FUSED_ADAM=1", "DS_BUILD_FUSED_LAMB=1", "DS_BUILD_UTILS=1"}
    assert "--no-build-isolation" in build and "CPU_ADAM" not in builder
    assert "('fused_adam', 'fused_lamb', 'utils')" in build  # the installed-ops check
    archs = re.search(r'ARG TORCH_CUDA_ARCH_LIST="([^"]+)"', builder).group(1)
    assert {"8.0", "9.0"} <= set(archs.replace("+PTX", "").split(";"))


def test_gpu_images_use_the_cuda_release_of_the_pinned_torch_wheel():
    text = (REPO / "Dockerfile").read_text()
    images = dict(re.findall(r"^ARG (CUDA_\w+_IMAGE)=nvidia/cuda:(\d+\.\d+)\.\d+-", text,
                             flags=re.MULTILINE))
    assert images == {"CUDA_DEVEL_IMAGE": TORCH_WHEEL_CUDA, "CUDA_RUNTIME_IMAGE": TORCH_WHEEL_CUDA}
    assert "ARG TORCH_INDEX_URL=https://pypi.org/simple" in stages()["gpu-builder"]
    assert 'pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"' in \
        stages()["gpu-builder"]


@pytest.mark.parametrize(("torch_cuda", "nvcc", "ok"), [
    ("13.0", "13.0", True), ("12.8", "13.0", False), ("None", "13.0", False)])
def test_the_builds_cuda_check_stops_a_mismatch_naming_both(tmp_path, torch_cuda, nvcc, ok):
    """The gpu-builder step that compares torch's CUDA with nvcc's, run as Docker runs it
    (bash -c), with an `nvcc` and a `torch` that say which release they are."""
    (check,) = [r for r in instructions("gpu-builder", "RUN") if "nvcc --version" in r
                or "'nvcc', '--version'" in r]
    bin_dir, site = tmp_path / "bin", tmp_path / "site" / "torch"
    bin_dir.mkdir()
    site.mkdir(parents=True)
    (bin_dir / "nvcc").write_text("#!/usr/bin/env bash\necho 'nvcc: NVIDIA (R) Cuda compiler "
                                  f"driver'\necho 'Cuda compilation tools, release {nvcc}, "
                                  f"V{nvcc}.88'\n")
    (bin_dir / "nvcc").chmod(0o755)
    version = "None" if torch_cuda == "None" else repr(torch_cuda)
    (site / "__init__.py").write_text(f"from types import SimpleNamespace\n"
                                      f"version = SimpleNamespace(cuda={version})\n")
    (bin_dir / "python").symlink_to(sys.executable)
    out = subprocess.run(["bash", "-o", "pipefail", "-c", check], capture_output=True, text=True,
                         timeout=60, check=False,
                         env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                              "PYTHONPATH": str(tmp_path / "site")})
    assert (out.returncode == 0) == ok, out.stderr
    if not ok:
        built = "none" if torch_cuda == "None" else torch_cuda
        assert f"torch is built with CUDA {built}, nvcc is {nvcc}: set CUDA_DEVEL_IMAGE and " \
               f"CUDA_RUNTIME_IMAGE to CUDA {built}" in out.stderr


def test_gpu_runtime_has_compilers_rdma_curl_and_no_ssh():
    runtime = stages()["gpu"]
    packages = apt_packages("gpu")
    assert {"gcc", "libc6-dev", "python3.11-dev"} <= packages  # torch.compile at run time
    assert {"libibverbs1", "ibverbs-providers", "librdmacm1"} <= packages  # NCCL over IB/RoCE
    assert {"curl", "ca-certificates"} <= packages  # http(s) shard URLs (webdataset pipes curl)
    assert not {"pdsh", "openssh-server", "openssh-client"} & packages
    env = " ".join(instructions("gpu", "ENV"))
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in env
    assert "DS_ACCELERATOR=cuda" in env and "PDSH" not in runtime
    assert instructions("gpu", "USER")[-1] == "1000:1000"


def test_every_run_step_of_the_dockerfile_is_valid_bash():
    for stage in stages():
        for run in instructions(stage, "RUN"):
            out = subprocess.run(["bash", "-n", "-c", run], capture_output=True, text=True,
                                 check=False, timeout=30)
            assert out.returncode == 0, (stage, run[:200], out.stderr)


# --- Kubernetes: NCCL between nodes ----------------------------------------------------------

def test_multi_node_job_asks_for_rdma_and_logs_ncclss_transport():
    docs = yaml.safe_load_all((REPO / "infra" / "k8s" / "pretrain-job.yaml").read_text())
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    resources = container["resources"]
    rdma = {k: v for k, v in resources["limits"].items() if k.startswith("rdma/")}
    assert rdma == {"rdma/rdma_shared_device_a": "1"}
    assert rdma.items() <= resources["requests"].items()  # extended resources: requests = limits
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_IB_DISABLE"] == "0" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert env["NCCL_DEBUG"] == "INFO" and set(env["NCCL_DEBUG_SUBSYS"].split(",")) >= {"NET"}
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "shm", "mountPath": "/dev/shm"} in container["volumeMounts"]


# --- a GPU launch where torch has no CUDA ----------------------------------------------------

def test_what_asks_for_gpus():
    assert gpu_request("auto", {}) is None
    assert gpu_request("auto", {"CUDA_VISIBLE_DEVICES": ""}) is None
    assert gpu_request("auto", {"CUDA_VISIBLE_DEVICES": "NoDevFiles"}) is None
    assert gpu_request("auto", {"SLURM_GPUS_ON_NODE": "0", "SLURM_JOB_ID": "7"}) is None
    assert gpu_request("cuda", {}) == "engine.device: cuda, as the base and large presets set"
    assert gpu_request("auto", {"CUDA_VISIBLE_DEVICES": "0,1"}) == "CUDA_VISIBLE_DEVICES=0,1"
    assert gpu_request("auto", {"SLURM_JOB_GPUS": "0,1,2,3"}) == \
        "Slurm allocated GPUs (SLURM_JOB_GPUS=0,1,2,3)"
    assert gpu_request("auto", {}, nproc_per_node="gpu") == "--nproc-per-node gpu"
    assert [cfg.resolve(p).engine.device for p in ("tiny", "base", "large")] == \
        ["auto", "cuda", "cuda"]
    with pytest.raises(ValueError,
                       match=r"--set engine.device='gpu': must be one of auto or cuda$"):
        cfg.resolve("tiny", None, ["engine.device=gpu"])


def one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.splitlines() if "error" in line.lower()]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    return lines[0]


@pytest.mark.skipif(not NO_CUDA, reason="torch sees a GPU here: nothing to refuse")
def test_a_gpu_launch_without_cuda_stops_in_one_line_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"^this run asks for GPUs \(CUDA_VISIBLE_DEVICES=0\), "
                                         r"but torch .* stopped before training"):
        refuse_cpu_fallback("auto", {"CUDA_VISIBLE_DEVICES": "0"})
    refuse_cpu_fallback("auto", {})  # a CPU run asks for nothing: it goes on
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE"))}
    env.update(PYTHONPATH=str(REPO), PYTHON=sys.executable, NNODES="1", NPROC_PER_NODE="8",
               RDZV_ENDPOINT="127.0.0.1:29400", SLURM_GPUS_ON_NODE="8",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    # the launch script, as Slurm runs it on a node with 8 allocated GPUs: torchrun never starts
    script = subprocess.run(["bash", str(REPO / "infra/launch/torchrun_rendezvous.sh"),
                             "--preset", "tiny"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    line = one_error_line(script)
    assert line.startswith("bert-pretrain: error: this run asks for GPUs (Slurm allocated GPUs "
                           "(SLURM_GPUS_ON_NODE=8)), but torch ")
    assert "torchrun" not in script.stderr + script.stdout and script.stdout == ""
    # bert-pretrain started by hand with the large preset (engine.device: cuda), on 2 ranks
    del env["SLURM_GPUS_ON_NODE"]
    by_hand = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node",
                              "2", "--master_port", str(free_port()), "-m", "training.pretrain", "--preset",
                              "large"], cwd=REPO, env=env, capture_output=True, text=True,
                             timeout=300, check=False)
    errors = [ln for ln in by_hand.stderr.splitlines() if ln.startswith("bert-pretrain: error")]
    assert by_hand.returncode != 0 and len(errors) == 1, by_hand.stderr[-3000:]
    assert "(engine.device: cuda, as the base and large presets set)" in errors[0]


@pytest.mark.skipif(not NO_CUDA, reason="torch sees a GPU here: nothing to refuse")
def test_the_refusal_reaches_the_user_when_another_rank_refuses_first(tmp_path):
    """Rank 0 starts 5 s after rank 1 (as under load): rank 1 refuses first, and the launcher
    ends the other ranks when one exits, yet the user still gets the one line."""
    (tmp_path / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get('RANK') == '0':\n    time.sleep(5)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CUDA_VISIBLE"))}
    env.update(PYTHONPATH=f"{tmp_path}{os.pathsep}{REPO}")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          "--master_port", str(free_port()), "-m", "training.pretrain",
                          "--preset", "large"], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("bert-pretrain: error")]
    assert out.returncode != 0 and len(errors) == 1, out.stderr[-3000:]
    assert "(engine.device: cuda, as the base and large presets set)" in errors[0]


# --- communication overlap -------------------------------------------------------------------

def test_gpu_presets_overlap_the_reduction_and_accumulate_in_fp32():
    config = cfg.resolve("large", str(REPO / "training" / "configs" / "bert_large_8gpu.yaml"))
    assert config.engine.zero_stage == 2 and cfg.base().engine.zero_stage == 2
    for phase in config.phases:
        ds = build_ds_config(config, phase, world_size=8, on_gpu=True)
        zero = ds["zero_optimization"]
        assert (zero["stage"], zero["overlap_comm"], zero["contiguous_gradients"]) == \
            (2, True, True)
        assert zero["reduce_bucket_size"] == REDUCE_BUCKET_SIZE < 340_000_000 // 4
        accumulates = ds["gradient_accumulation_steps"] > 1
        assert ds.get("data_types") == ({"grad_accum_dtype": "fp32"} if accumulates else None)
        # ZeRO-1 keeps bf16 accumulation: fp32 would replace the ZeRO optimizer (below)
        zero1 = build_ds_config(cfg.apply_overrides(config, ["engine.zero_stage=1"]), phase, 8,
                                on_gpu=True)
        assert "data_types" not in zero1 and zero1["zero_optimization"]["overlap_comm"] is True


def test_deepspeed_builds_the_overlapping_zero_optimizer_from_our_config():
    """deepspeed.initialize (one gloo rank) with our bf16 config at 2 micro-batches per step:
    ZeRO-2 gives DeepSpeed's ZeRO optimizer with overlap and an fp32 gradient partition; ZeRO-1
    the same optimizer with bf16 accumulation; ZeRO-1 with fp32 accumulation, the combination
    our config avoids, DeepSpeed's BF16_Optimizer, which has no overlap or buckets."""
    import deepspeed
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    from training import pretrain
    from training.ds_config import lr_scheduler
    from training.optim import param_groups

    dist = pretrain.init_distributed()
    phase = cfg.PhaseConfig(micro_batch_size=2, global_batch_size=4, steps=10, warmup_steps=1)
    base = cfg.PretrainConfig(engine=cfg.EngineConfig(precision="bf16", zero_stage=2),
                              phases=(phase,))
    zero_1 = cfg.EngineConfig(precision="bf16", zero_stage=1)

    def optimizer(config, **extra):
        model = pretrain.build_model(config, {"vocab_size": 128, "nsp": True})
        ds = {**build_ds_config(config, phase, dist.world_size, dist.on_gpu), **extra}
        engine, _, _, _ = deepspeed.initialize(model=model, config=ds,
                                               model_parameters=param_groups(model, 0.01),
                                               lr_scheduler=lr_scheduler(phase))
        try:
            return engine.optimizer
        finally:
            engine.destroy()

    zero2 = optimizer(base)
    assert isinstance(zero2, DeepSpeedZeroOptimizer) and zero2.overlap_comm
    assert zero2.gradient_accumulation_dtype == torch.float32 and zero2.partition_gradients
    zero1 = optimizer(dataclasses.replace(base, engine=zero_1))
    assert isinstance(zero1, DeepSpeedZeroOptimizer) and zero1.overlap_comm
    assert zero1.gradient_accumulation_dtype == torch.bfloat16
    avoided = optimizer(dataclasses.replace(base, engine=zero_1),
                        data_types={"grad_accum_dtype": "fp32"})
    assert isinstance(avoided, BF16_Optimizer)


def test_the_flows_pretrain_stage_knows_its_runs_device_before_launching():
    """The flow refuses a GPU run where torch has no CUDA before its launcher starts ranks: the
    run's device is its `pretrain` section's, the config file the entry point reads."""
    from flows.config import resolve
    from flows.stages import StageResult
    from flows.steps import pretrain_config

    def stage(path: str) -> StageResult:
        return StageResult(stage="x", path=path, config_hash="0", cached=True, seconds=0.0)

    data = {"data": {"wikipedia": "/d/wiki.xml.bz2", "books": "/d/books"},
            "finetune": {"data": ""}}
    for preset, pretrain, device in (("tiny", {}, "auto"), ("large", {}, "cuda"),
                                     ("large", {"engine": {"device": "auto"}}, "auto"),
                                     ("base", {"engine": {"device": "auto"}}, "auto")):
        flow = resolve(preset, {**data, "pretrain": pretrain})
        run = pretrain_config(flow, stage("/v"), [stage("/s128"), stage("/s512")], "/o")
        assert run.engine.device == device, (preset, pretrain)
        assert [p.train_shards for p in run.phases] == ["/s128", "/s512"]
        assert (run.data.vocab_dir, run.output_dir) == ("/v", "/o")


def test_deepspeeds_ops_are_built_by_the_virtualenvs_ninja():
    """One ninja for every process: Debian's 1.11 and pip's 1.13 hash build commands
    differently, so each would rebuild the op the other cached."""
    own = Path(sys.executable).parent / "ninja"
    if not own.is_file():
        pytest.skip(f"no ninja beside {sys.executable}")
    env = {"PATH": os.pathsep.join(["/usr/bin", "/bin"])}
    use_own_ninja(env)
    assert shutil.which("ninja", path=env["PATH"]) == str(own)
    before = env["PATH"]
    use_own_ninja(env)
    assert env["PATH"] == before


def test_an_arch_specific_cuda_arch_list_still_builds_deepspeeds_fused_adam(monkeypatch):
    """An H200 image's TORCH_CUDA_ARCH_LIST=9.0a stopped FusedAdam's JIT build on the first
    step (DeepSpeed 0.19.8 parses each entry as numbers); the launch environment's plain form
    goes through DeepSpeed's own parser."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    assert deepspeed_arch_list("9.0a") == "9.0"
    assert deepspeed_arch_list("8.0 9.0a 10.0f+PTX") == "8.0;9.0;10.0+PTX"
    assert deepspeed_arch_list("8.0;8.6;9.0+PTX") == "8.0;8.6;9.0+PTX"
    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")
    with pytest.raises(ValueError, match="'0a'"):
        builder.compute_capability_args()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", deepspeed_arch_list("8.0;9.0a;10.0f+PTX"))
    builder.compute_capability_args()
