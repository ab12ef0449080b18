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
#   DRY_RUN=1       print the command instead of running it
set -euo pipefail

: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT=host:port, the same on every node}"
[[ "$RDZV_ENDPOINT" =~ ^[^:[:space:]]+:[0-9]+$ ]] \
  || { echo "torchrun_rendezvous.sh: RDZV_ENDPOINT must be host:port, got '$RDZV_ENDPOINT'" >&2; exit 2; }
NNODES=${NNODES:-1}
NPROC_PER_NODE=${NPROC_PER_NODE:-gpu}
RUN_ID=${RUN_ID:-bert-pretrain}
MAX_RESTARTS=${MAX_RESTARTS:-3}

cmd=(torchrun --nnodes "$NNODES" --nproc-per-node "$NPROC_PER_NODE"
     --rdzv-backend c10d --rdzv-endpoint "$RDZV_ENDPOINT" --rdzv-id "$RUN_ID"
     --max-restarts "$MAX_RESTARTS" --module training.pretrain "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
