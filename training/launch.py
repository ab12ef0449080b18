"""Launch helpers: one process, `torchrun`, or the `deepspeed` launcher, all running
`python -m training.pretrain ...` (the `bert-pretrain` console script).

- One process: `bert-pretrain --preset tiny --set ...`; `init_process_env` fills in
  RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 and a free MASTER_PORT (without them
  DeepSpeed falls back to MPI discovery and fails).
- One node, N processes: `torchrun --nproc_per_node N -m training.pretrain ...`
  (`torchrun_command`). `launch_command` builds any of these commands from a launcher's name
  (the flow's pre-training stage starts its ranks with it).
- Several nodes: `torchrun --nnodes N --rdzv-backend c10d --rdzv-endpoint HOST:PORT ...` run
  once per node (infra/launch/torchrun_rendezvous.sh, which the Slurm script and the Kubernetes
  Job start on every node; no ssh between nodes). Or `deepspeed --hostfile hosts --no_ssh
  --node_rank I ...` on every node (`deepspeed_command`); its pdsh/ssh mode (one command
  reaching the nodes by passwordless ssh) needs ssh set up on the hosts, which the images are not.

A run that asks for GPUs (`engine.device: cuda`, as the base and large presets do;
CUDA_VISIBLE_DEVICES; a Slurm GPU allocation; `--nproc-per-node gpu`) where torch has no usable
CUDA stops with one line (`refuse_cpu_fallback`) instead of training its ranks on the CPU: the
launch scripts run `python -m training.launch check-gpus ...` before they start any rank, and
`bert-pretrain` checks again in case it was started by hand.

On CPU the backend is gloo (DeepSpeed's cpu accelerator). `init_process_env` also points
`TORCH_EXTENSIONS_DIR` into the virtualenv, so the shared-memory collective op DeepSpeed compiles
on its first `init_distributed` (~40-60 s) is built once per environment (by the virtualenv's
own ninja, `use_own_ninja`) and then loaded from the cache, and it limits torch's threads to
cores / local ranks (the deepspeed launcher does not set OMP_NUM_THREADS; torchrun does). On CPU it tunes malloc to reuse freed memory
(`keep_freed_memory`).
"""
from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

DEFAULT_MASTER_PORT = 29500
"""The rendezvous port of a multi-node launch without one (torch's and DeepSpeed's default)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def extensions_dir() -> str:
    """The C++ extension cache: inside the active virtualenv (sys.prefix)."""
    return str(Path(sys.prefix) / "torch_extensions")


def loopback_interface() -> str | None:
    """The name of this machine's loopback interface ("lo" on Linux, "lo0" on macOS)."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)


def launched() -> bool:
    """Whether a launcher (torchrun, DeepSpeed's, mpirun) started this process as a rank."""
    return "RANK" in os.environ or "OMPI_COMM_WORLD_RANK" in os.environ


def init_process_env() -> None:
    """Defaults for a process not started by a launcher, and the CPU settings (idempotent).

    A process not started by a launcher is the whole job: its collectives' sockets (gloo's,
    NCCL's bootstrap) are bound to the loopback interface, so it listens on nothing another
    machine can reach (`init_process_group` gives it no TCP store either)."""
    env = os.environ
    if not launched():
        env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
        env.setdefault("MASTER_ADDR", "127.0.0.1")
        env.setdefault("MASTER_PORT", str(free_port()))
        loopback = loopback_interface()
        if loopback is not None:
            env.setdefault("GLOO_SOCKET_IFNAME", loopback)
            env.setdefault("NCCL_SOCKET_IFNAME", loopback)
    env.setdefault("TORCH_EXTENSIONS_DIR", extensions_dir())
    use_own_ninja(env)
    if "TORCH_CUDA_ARCH_LIST" in env:
        env["TORCH_CUDA_ARCH_LIST"] = deepspeed_arch_list(env["TORCH_CUDA_ARCH_LIST"])
    import torch
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
    # torchrun sets LOCAL_WORLD_SIZE, the deepspeed launcher LOCAL_SIZE.
    local_world = int(env.get("LOCAL_WORLD_SIZE") or env.get("LOCAL_SIZE") or
                      env.get("WORLD_SIZE", "1"))
    if "OMP_NUM_THREADS" not in env and local_world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    if not torch.cuda.is_available() and env.get(MALLOC_ENV, "keep") != "default":
        keep_freed_memory()


def init_process_group(backend: str) -> None:
    """torch.distributed for a job of one process, which DeepSpeed's `init_distributed` then
    takes as it is: an in-memory store instead of the TCP store `env://` would start (torch's
    TCPStore listens on every interface, with no setting for its address). A launched rank
    keeps `env://`: its peers must reach the store, bound to the interfaces the launcher
    names (MASTER_ADDR, GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME; infra/README.md)."""
    import torch.distributed as dist
    if dist.is_initialized() or os.environ.get("WORLD_SIZE") != "1":
        return  # mpirun's ranks set WORLD_SIZE later, in DeepSpeed's MPI discovery
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)


def use_own_ninja(env) -> None:
    """Put this interpreter's bin folder first on PATH when it has a `ninja` (the virtualenv's,
    from pip). torch builds DeepSpeed's ops with the first `ninja` on PATH into the cache in the
    virtualenv, and ninja 1.11 (Debian's) and 1.13 (pip's) hash build commands differently:
    processes that find different ones rebuild the cached op for each other on every start
    (~1.5 CPU-minutes for the shared-memory op here)."""
    bindir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if (Path(bindir) / "ninja").is_file() and path.split(os.pathsep)[0] != bindir:
        env["PATH"] = bindir + (os.pathsep + path if path else "")


def deepspeed_arch_list(value: str) -> str:
    """TORCH_CUDA_ARCH_LIST as DeepSpeed 0.19.8's JIT op builder reads it.

    Hopper and Blackwell images often list arch-specific targets ("9.0a", "10.0f"), which torch's
    extension builder accepts but DeepSpeed's does not: building FusedAdam on the first step
    stops with `invalid literal for int() with base 10: '0a'` (seen on an H200 whose image sets
    such a list). FusedAdam uses no arch-specific instructions, so the plain target ("9.0")
    builds the same op. "+PTX" and the separators (";" or spaces) stay as they are.
    """
    def plain(arch: str) -> str:
        number, plus, ptx = arch.partition("+")
        return number.rstrip("abcdefghijklmnopqrstuvwxyz") + plus + ptx
    return ";".join(dict.fromkeys(plain(a) for a in value.replace(" ", ";").split(";") if a))


MALLOC_ENV = "BERT_MALLOC"
"""Set to "default" to leave glibc's malloc settings alone in CPU training (see
`keep_freed_memory`)."""
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4
KEEP_FREE_BYTES = 2**31 - 1
"""Free memory at the top of the heap that malloc keeps rather than returns (mallopt's most)."""


def keep_freed_memory() -> bool:
    """Have glibc's malloc keep freed memory for reuse (CPU training: 5-13% off a step here).

    A training step allocates and frees the same large activations and gradients every step.
    By default glibc gives blocks over a threshold (128 KB, rising with the blocks freed, at
    most 32 MB) fresh pages from the kernel and returns them on free, and it returns the heap's
    free top above twice that threshold: every step faults its memory in again, a page fault
    and a zeroing per 4 KB page (BERT-base's 94 MB embedding gradient alone is 23k faults).
    Serving every block from the heap (no mmap) and keeping its free memory stops that.
    Blocks a thread's own arena cannot hold still get mmap (glibc's fallback).

    The cost: the process keeps what it freed, and with steps of changing shapes its heap
    fragments. Resident memory settles above the old peak: 1.65 GB against a 1.48 GB peak
    (and ~1.1 GB between steps) for 2 BERT-base layers at 64-512 tokens over 120 steps.
    `BERT_MALLOC=default` in the environment keeps glibc's settings.

    Returns whether both settings took; False on other systems (musl, macOS, Windows).
    """
    import ctypes

    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, KEEP_FREE_BYTES) == 1


SLURM_GPU_VARIABLES = ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
                       "SLURM_GPUS_PER_NODE", "SLURM_GPUS")
"""What Slurm sets in a job or step that was allocated GPUs (--gpus*, --gres=gpu)."""
NO_DEVICES = ("", "-1", "none", "NoDevFiles")
"""CUDA_VISIBLE_DEVICES values that hide every GPU (NoDevFiles: what Slurm writes for none)."""


def gpu_request(device: str, env: Mapping[str, str], nproc_per_node: str = "") -> str | None:
    """Why a launch asks for GPUs (the first reason found), or None when it does not: the
    config's `engine.device: cuda`, a launcher told to start one rank per GPU, CUDA_VISIBLE_DEVICES
    naming devices, or a Slurm GPU allocation."""
    if device == "cuda":
        return "engine.device: cuda, as the base and large presets set"
    if nproc_per_node == "gpu":
        return "--nproc-per-node gpu"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() not in NO_DEVICES:
        return f"CUDA_VISIBLE_DEVICES={visible}"
    for name in SLURM_GPU_VARIABLES:
        value = env.get(name, "").strip()
        if value and value not in ("0", "(null)"):
            return f"Slurm allocated GPUs ({name}={value})"
    return None


def cuda_missing() -> str | None:
    """Why torch cannot use CUDA here, or None when it can."""
    import torch
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is built without CUDA"
    if not torch.cuda.is_available():
        return (f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable GPU "
                "(no device visible, or no NVIDIA driver)")
    return None


def refuse_cpu_fallback(device: str, env: Mapping[str, str] | None = None,
                        nproc_per_node: str = "") -> None:
    """Raise a one-line ValueError when the launch asks for GPUs and torch has no usable
    CUDA: DeepSpeed would otherwise pick its CPU accelerator and train every rank on the CPU
    over gloo, orders of magnitude slower, with nothing saying so."""
    reason = gpu_request(device, os.environ if env is None else env, nproc_per_node)
    if reason is None:
        return
    missing = cuda_missing()
    if missing is not None:
        raise ValueError(f"this run asks for GPUs ({reason}), but {missing}; stopped before "
                         "training. Run it where torch has CUDA and sees the GPUs, or for a CPU "
                         "run set engine.device=auto and ask for no GPU")


def refuse_cpu_fallback_in_rank(device: str) -> None:
    """`refuse_cpu_fallback` in a rank that is already running: CUDA_VISIBLE_DEVICES is left
    out, since DeepSpeed's launcher sets it for every rank it starts, CPU ranks too; the user's
    own is checked by the launch scripts (`check-gpus`) and the flow before any rank starts."""
    refuse_cpu_fallback(device, {k: v for k, v in os.environ.items()
                                 if k != "CUDA_VISIBLE_DEVICES"})


REPORTER_WAIT_S = 120.0
"""How long a rank that refuses to start, but does not report it, waits for the launcher."""


def exit_refused(message: str, prog: str = "bert-pretrain") -> NoReturn:
    """Stop a rank that refuses to start, which every rank of the launch does, with `message`
    printed once per node: by local rank 0, then exit 2.

    A launcher (torchrun, DeepSpeed's) ends the other ranks as soon as one exits. So the other
    ranks do not exit first: they wait for the launcher to end them when the reporting rank
    has printed and exited. Had one exited first, the launcher could end the reporter before
    it printed, and the user would see no line at all."""
    if local_rank() == "0":
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
        raise SystemExit(2)
    wait_for_launcher()


def local_rank() -> str:
    """This process's rank on its node, as torchrun, DeepSpeed, Open MPI or Slurm set it."""
    for name in ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "RANK"):
        if name in os.environ:
            return os.environ[name]
    return "0"


def wait_for_launcher() -> NoReturn:
    """Exit 2 without a word, after waiting for the launcher to end this rank: another rank
    reports the error, and this rank exiting first could have the launcher end that one
    before it prints. The wait is a bound, should the reporting rank never get that far."""
    time.sleep(REPORTER_WAIT_S)
    raise SystemExit(2)


PRETRAIN_DESCRIPTION = "BERT pre-training with DeepSpeed: `bert-pretrain` / `python -m training.pretrain`."


def build_parser() -> argparse.ArgumentParser:
    """`bert-pretrain`'s flags: here, where both the ranks (training/pretrain.py `main`) and the
    launch scripts' check (`main` below) read them, so neither module imports the other's."""
    from common import logs
    from common.settings import settings_help
    from training import config as cfg

    epilog = ("settings (--set KEY=VALUE or a --config file; defaults: the tiny preset's, "
              "training/config.py):\n" + "\n".join(settings_help(cfg.tiny())))
    parser = argparse.ArgumentParser(prog="bert-pretrain", description=PRETRAIN_DESCRIPTION,
                                     epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(cfg.PRESETS),
                        help="starting configuration (training/config.py)")
    parser.add_argument("--config", help="YAML or JSON file of overrides")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a setting, e.g. engine.zero_stage=2 or phase1.steps=300")
    parser.add_argument("--stop_after_steps", type=int, default=None,
                        help="stop with a checkpoint after N optimizer steps of this invocation "
                             "(preemption drills); run again to resume")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    from training.forecast import add_plan_flags
    add_plan_flags(parser)
    logs.add_verbose_flag(parser)
    return parser


def plan(config, args: argparse.Namespace, parser: argparse.ArgumentParser) -> NoReturn:
    """`bert-pretrain --plan`: the forecast (training/forecast.py), before any rank, DeepSpeed
    or process group starts; a bad flag is one line and exit 2."""
    from training.forecast import pretrain_plan
    try:
        code = pretrain_plan(config, args)
    except ValueError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    raise SystemExit(code)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m training.launch check-gpus [--nproc-per-node N] -- BERT_PRETRAIN_ARGS`: the
    launch scripts' check before they start any rank; exits 2 with one line on stderr."""
    parser = argparse.ArgumentParser(prog="python -m training.launch")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check-gpus", help="stop a GPU launch where torch has no CUDA")
    check.add_argument("--nproc-per-node", default="")
    check.add_argument("pretrain_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    pretrain_args = args.pretrain_args[1:] if args.pretrain_args[:1] == ["--"] \
        else args.pretrain_args
    if {"-h", "--help"} & set(pretrain_args):
        return 0  # the ranks print the help
    known, _ = build_parser().parse_known_args(pretrain_args)
    from training import config as cfg
    try:
        config = cfg.resolve(known.preset, known.config, known.set)
        refuse_cpu_fallback(config.engine.device, nproc_per_node=args.nproc_per_node)
    except ValueError as e:
        print(f"bert-pretrain: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0


def module_args(args: Sequence[str]) -> list[str]:
    return ["-m", "training.pretrain", *args]


LAUNCHERS = ("python", "torchrun", "deepspeed")
"""What `launch_command` starts the ranks with (the flow's `launch.launcher`)."""


def launch_command(launcher: str, args: Sequence[str], nproc_per_node: int = 1,
                   hostfile: str | None = None, python: str = sys.executable) -> list[str]:
    """The one builder of the command that starts `bert-pretrain ARGS` (the flow's pre-training
    stage and the tests use it): `python` one process, `torchrun` `nproc_per_node` processes on
    this node (`torchrun_command`), `deepspeed` `nproc_per_node` per node, on the hostfile's
    nodes when given (`deepspeed_command`)."""
    if launcher == "torchrun":
        return torchrun_command(nproc_per_node, args, python=python)
    if launcher == "deepspeed":
        return deepspeed_command(args, hostfile=hostfile or None, num_gpus=nproc_per_node,
                                 python=python)
    if launcher != "python":
        raise ValueError(f"launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}")
    return [python, *module_args(args)]


def torchrun_command(nproc_per_node: int, args: Sequence[str], master_port: int | None = None,
                     python: str = sys.executable) -> list[str]:
    """`torchrun --nproc_per_node N -m training.pretrain ARGS` (one node)."""
    return [python, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc_per_node),
            "--master_port", str(master_port or free_port()), *module_args(args)]


def deepspeed_command(args: Sequence[str], hostfile: str | None = None,
                      num_gpus: int | None = None, master_addr: str | None = None,
                      master_port: int | None = None, node_rank: int | None = None,
                      python: str = sys.executable) -> list[str]:
    """`deepspeed [--hostfile H] --module training.pretrain ARGS`.

    With a hostfile the launcher reaches the other nodes by passwordless ssh (pdsh); with
    `node_rank` it instead runs only this node's ranks (`--no_ssh --node_rank N`), the way a
    Slurm or Kubernetes job starts the same command on every node. Without a hostfile: one node,
    `num_gpus` processes (CPU ranks on a CPU machine)."""
    cmd = [python, "-m", "deepspeed.launcher.runner"]
    if hostfile:
        cmd += ["--hostfile", hostfile]
    if node_rank is not None:
        cmd += ["--no_ssh", "--node_rank", str(node_rank)]
    if num_gpus:
        cmd += ["--num_gpus", str(num_gpus)]
    if master_addr:
        cmd += ["--master_addr", master_addr]
    if master_port is None:
        # every node must name the same port: a random one only works on a single node
        master_port = DEFAULT_MASTER_PORT if node_rank is not None else free_port()
    cmd += ["--master_port", str(master_port), "--no_local_rank",
            "--module", "training.pretrain", *args]
    return cmd


if __name__ == "__main__":
    sys.exit(main())
