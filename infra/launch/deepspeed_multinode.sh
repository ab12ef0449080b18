#!/usr/bin/env bash
# Multi-node pre-training with the DeepSpeed launcher, which starts the ranks over pdsh/ssh.
#
#   cp infra/launch/hostfile.example hostfile        # then list your nodes in it
#   HOSTFILE=hostfile infra/launch/deepspeed_multinode.sh --preset large --config run.yaml
#
# Every argument goes to `bert-pretrain` (python -m training.pretrain) unchanged.
# For hosts set up for ssh, not for the images: they have no sshd, pdsh or keys, and their
# multi-node launch is torchrun_rendezvous.sh (also what Slurm and Kubernetes start).
# Needs: pdsh and passwordless ssh from this node to every host of the hostfile, the same
# checkout and virtualenv (or the same image) at the same path on every node, and the
# environment each rank needs in ~/.deepspeed_env (see deepspeed_env.example).
#
# Environment:
#   HOSTFILE        hostfile, "<host> slots=<gpus>" per line     (default: /job/hostfile)
#   MASTER_ADDR     rendezvous host                               (default: first host listed)
#   MASTER_PORT     rendezvous port                               (default: 29500)
#   LAUNCHER        deepspeed multi-node backend: pdsh, openmpi, mpich, slurm (default: pdsh)
#   DEEPSPEED_ARGS  more launcher flags, e.g. "--num_nodes 2 --num_gpus 4"
#   DRY_RUN=1       print the command instead of running it
set -euo pipefail

HOSTFILE=${HOSTFILE:-/job/hostfile}
MASTER_PORT=${MASTER_PORT:-29500}
LAUNCHER=${LAUNCHER:-pdsh}

die() { echo "deepspeed_multinode.sh: $*" >&2; exit 2; }

[[ -r "$HOSTFILE" ]] || die "hostfile $HOSTFILE is not readable (set HOSTFILE)"
line_no=0
hosts=()
while IFS= read -r line || [[ -n "$line" ]]; do
  line_no=$((line_no + 1))
  line=${line%%#*}
  [[ "$line" =~ ^[[:space:]]*$ ]] && continue
  [[ "$line" =~ ^[[:space:]]*([^[:space:]]+)[[:space:]]+slots=[1-9][0-9]*[[:space:]]*$ ]] \
    || die "$HOSTFILE line $line_no: expected '<host> slots=<n>', got '$line'"
  hosts+=("${BASH_REMATCH[1]}")
done < "$HOSTFILE"
(( ${#hosts[@]} > 0 )) || die "$HOSTFILE lists no hosts"
MASTER_ADDR=${MASTER_ADDR:-${hosts[0]}}

extra=()
if [[ -n "${DEEPSPEED_ARGS:-}" ]]; then
  read -r -a extra <<< "$DEEPSPEED_ARGS"
fi
cmd=(deepspeed --hostfile "$HOSTFILE" --launcher "$LAUNCHER"
     --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" "${extra[@]}"
     --module training.pretrain "$@")

if [[ "${DRY_RUN:-0}" == 1 ]]; then
  printf '%q ' "${cmd[@]}"
  echo
  exit 0
fi
exec "${cmd[@]}"
