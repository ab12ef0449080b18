#!/usr/bin/env bash
# Pre-training with torchrun's c10d rendezvous: run the same command on every node.
#
#   NNODES=2 NPROC_PER_NODE=8 RDZV_ENDPOINT=node-1:29400 RUN_ID=bert-large-1 \
#     infra/launch/torchrun_rendezvous.sh --preset large --config run.yaml
#
# Every argument goes to `bert-pretrain` (python -m training.pretrain) unchanged. The nodes
# find each other through the rendezvous endpoint (a host:port all can reach; the node whose
# hostname or IP address it names hosts the c10d store, so name one node by a name that node
# resolves to itself), so no ssh between nodes is needed: Slurm (infra/slurm) and
# Kubernetes (infra/k8s/pretrain-job.yaml) start this script once per node.
#
# Environment:
#   RDZV_ENDPOINT   host:port of the rendezvous                       (required)
#   NNODES          nodes, or MIN:MAX for an elastic job                (default: 1)
#   NPROC_PER_NODE  ranks per node: a number, or gpu / cpu / auto      (default: gpu)
#   RUN_ID          the same on every node of one run                   (default: bert-pretrain)
#   MAX_RESTARTS    restarts of the whole group after a rank fails; training resumes from its
#                   last checkpoint                                     (default: 3)
#   LOCAL_ADDR      this node's address as the others reach it (torchrun --local-addr); needed
#                   where the hostname does not resolve to it         (default: the hostname)
#   PYTHON          the interpreter of the GPU check below              (default: python)
#   DRY_RUN=1       print the command instead of running it
#
# Before starting any rank it checks that a run asking for GPUs (engine.device: cuda in the preset
# or config, NPROC_PER_NODE=gpu, CUDA_VISIBLE_DEVICES, a Slurm GPU allocation) has a torch that can
# use them, and stops with one line otherwise (`python -m training.launch check-gpus`).
set -euo pipefail

: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port, the same on every node}"
[[ "$RDZV_ENDPOINT" =~ ^[^:[:space:]]+:[0-9]+$ ]] \
  || { echo "torchrun_rendezvous.sh: RDZV_ENDPOINT must be host:port, got '$RDZV_ENDPOINT'" >&2; exit 2; }
NNODES=${NNODES:-1}
NPROC_PER_NODE=${NPROC_PER_NODE:-gpu}
RUN_ID=${RUN_ID:-bert-pretrain}
MAX_RESTARTS=${MAX_RESTARTS:-3}

local_addr=()
if [[ -n "${LOCAL_ADDR:-}" ]]; then
  local_addr=(--local-addr "$LOCAL_ADDR")
fi
cmd=(torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE"
     --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RUN_ID"
     --max-restarts "$MAX_RESTARTS" "${local_addr[@]}" --module training.pretrain "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
"${PYTHON:-python}" -m training.launch check-gpus --nproc-per-node "$NPROC_PER_NODE" -- "$@"
exec "${cmd[@]}"
