"""Two hosts on this machine: pre-training across two network namespaces through the project's
own multi-node launch (infra/launch/torchrun_rendezvous.sh: torchrun's c10d rendezvous, one
rank per node, gloo), against the same run as 2 ranks on one host and 1 rank.

Each "node" is a network namespace with its own veth end, address (198.18.0.1 and .2: RFC 2544's
benchmarking range, on no real network), hostname (a UTS namespace) and /etc/hosts naming both
(`ip netns exec` mounts /etc/netns/<ns>/hosts over /etc/hosts), as two real hosts would resolve
each other. The rendezvous endpoint is node 0 by name; nothing else than those two addresses and
loopback is used. The namespaces and their files are always removed (try/finally).

The DeepSpeed launcher over pdsh/ssh (infra/launch/deepspeed_multinode.sh, for hosts set up for
ssh; the images have no ssh) runs across the same two namespaces too: an sshd in each, a key
made for the test, `pdsh` from node 0 to both.

The runs have both phases, so they also check that phase 2's starting weights, consolidated once
on rank 0 and shared through a file (`checkpoint.shared_consolidated_state_dict`), are the weights
each rank would consolidate on its own: phase 2's losses equal the 1-rank run's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.shard_fixtures import book_shards
from training import checkpoint, pretrain
from training import config as cfg
from training.config import PhaseConfig
from training.launch import torchrun_command

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "infra" / "launch" / "torchrun_rendezvous.sh"
ADDRESSES = ("198.18.0.1", "198.18.0.2")
RDZV_PORT = 29400
CONSOLIDATED_ONCE = "consolidating 00-phase1-step00000004 once, on rank 0, for 2 ranks"


@dataclasses.dataclass(frozen=True)
class Host:
    namespace: str
    hostname: str
    address: str


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


@contextlib.contextmanager
def two_hosts() -> Iterator[tuple[Host, Host]]:
    """Two namespaces joined by a veth pair, each with an address, a hostname and a hosts file;
    removed on exit whatever happened. Skips, saying why, where they cannot be made."""
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` is not installed (iproute2 / util-linux)")
    tag = f"bd{os.getpid() % 100_000}"
    hosts = tuple(Host(f"{tag}n{i}", f"{tag}-node-{i}", ADDRESSES[i]) for i in range(2))
    veths = tuple(f"{tag}v{i}" for i in range(2))
    hosts_file = "127.0.0.1 localhost\n" + "".join(f"{h.address} {h.hostname}\n" for h in hosts)
    try:
        made = ip("netns", "add", hosts[0].namespace, check=False)
        if made.returncode != 0:
            pytest.skip(f"the kernel refuses a network namespace here: {made.stderr.strip()}")
        ip("netns", "add", hosts[1].namespace)
        made = ip("link", "add", veths[0], "type", "veth", "peer", "name", veths[1], check=False)
        if made.returncode != 0:
            pytest.skip(f"the kernel refuses a veth pair here: {made.stderr.strip()}")
        for host, veth in zip(hosts, veths):
            ip("link", "set", veth, "netns", host.namespace)
            ip("-n", host.namespace, "addr", "add", f"{host.address}/30", "dev", veth)
            ip("-n", host.namespace, "link", "set", veth, "up")
            ip("-n", host.namespace, "link", "set", "lo", "up")
            folder = Path("/etc/netns") / host.namespace
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text(hosts_file)
        yield hosts
    finally:
        for host in hosts:
            ip("netns", "del", host.namespace, check=False)  # takes its veth end along
            shutil.rmtree(Path("/etc/netns") / host.namespace, ignore_errors=True)
        ip("link", "del", veths[0], check=False)  # in case it never left this namespace
        assert not {h.namespace for h in hosts} & set(ip("netns", "list").stdout.split())


def rank_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT",
                        "CUDA_VISIBLE_DEVICES")}
    env.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
               PYTHONPATH=str(REPO), PYTHON=sys.executable,
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return env


def run_two_nodes(hosts: tuple[Host, Host], config_file: Path) -> list[str]:
    """infra/launch/torchrun_rendezvous.sh once in each namespace, under that node's hostname,
    the rendezvous at node 0 by name; returns both nodes' logs."""
    env = {**rank_env(), "NNODES": "2", "NPROC_PER_NODE": "1", "MAX_RESTARTS": "0",
           "RDZV_ENDPOINT": f"{hosts[0].hostname}:{RDZV_PORT}", "RUN_ID": "netns-two-nodes",
           "LOGLEVEL": "INFO"}
    nodes = [subprocess.Popen(
        ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c",
         'hostname "$0" && exec "$@"', host.hostname, "bash", str(SCRIPT),
         "--config", str(config_file)],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for host in hosts]
    try:
        logs = [node.communicate(timeout=900)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.wait()
    assert [node.returncode for node in nodes] == [0, 0], "\n=====\n".join(
        log[-4000:] for log in logs)
    return logs


def two_phase_config(shards, output: Path, num_workers: int) -> cfg.PretrainConfig:
    phases = (
        PhaseConfig(name="phase1", train_shards=str(shards.shards_128), max_seq_length=128,
                    micro_batch_size=4, global_batch_size=8, steps=4, warmup_steps=1,
                    learning_rate=2e-3),
        PhaseConfig(name="phase2", train_shards=str(shards.shards_512), max_seq_length=512,
                    micro_batch_size=2, global_batch_size=4, steps=2, warmup_steps=1,
                    learning_rate=1e-3),
    )
    return cfg.PretrainConfig(
        model=cfg.ModelConfig(preset="bert_tiny", dropout=0.0),
        engine=cfg.EngineConfig(zero_stage=2),
        data=cfg.PretrainDataConfig(vocab_dir=str(shards.vocab_dir), num_workers=num_workers,
                                    shuffle_buffer=16),
        cadence=cfg.CadenceConfig(log_every=1, eval_every=0, eval_batches=0, checkpoint_every=0,
                                  export_hf=False),
        output_dir=str(output), phases=phases, seed=11)


def losses(output: Path) -> dict[str, list[float]]:
    records = [r for r in pretrain.read_metrics(str(output)) if r["split"] == "train"]
    return {phase: [r["loss"] for r in records if r["phase"] == phase]
            for phase in ("phase1", "phase2")}


def final_weights(output: Path) -> dict[str, torch.Tensor]:
    ckpt = output / "checkpoints"
    return checkpoint.consolidated_state_dict(str(ckpt), (ckpt / "latest").read_text().strip())


def assert_same_run(output: Path, reference: Path, atol: float) -> None:
    got, want = losses(output), losses(reference)
    assert [len(got["phase1"]), len(got["phase2"])] == [4, 2]
    for phase in ("phase1", "phase2"):
        torch.testing.assert_close(torch.tensor(got[phase]), torch.tensor(want[phase]),
                                   rtol=0, atol=atol)
    theirs = final_weights(reference)
    for key, value in final_weights(output).items():
        torch.testing.assert_close(value, theirs[key], rtol=0, atol=atol)


def write_config(config: cfg.PretrainConfig, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg.to_dict(config)))
    return path


@pytest.fixture(scope="module")
def shards(shared_data, tmp_path_factory):
    """The books' shards (tests/support/shard_fixtures.py), shared with tests/training/."""
    return book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")


@pytest.fixture(scope="module")
def two_ranks_one_host(shards, tmp_path_factory) -> tuple[Path, str]:
    """Both phases on 2 gloo ranks x 1 DataLoader worker, torchrun on loopback: the output
    folder and the ranks' log."""
    out = tmp_path_factory.mktemp("two_ranks")
    config = write_config(two_phase_config(shards, out / "run", num_workers=1), out / "run.yaml")
    proc = subprocess.run(torchrun_command(2, ["--config", str(config)]), check=False, cwd=REPO,
                          env=rank_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out / "run", proc.stderr


def test_phase2_weights_consolidated_once_give_the_one_rank_losses(shards, two_ranks_one_host,
                                                                   tmp_path):
    """Phase 2 starts from phase 1's ZeRO-2 shards consolidated once, on rank 0, and shared
    through a file that is then removed: 2 ranks x 1 worker and 1 rank x 2 workers read the
    same global batches, so both phases' losses and the final weights agree (1e-5: the
    reductions add in another order)."""
    local, log = two_ranks_one_host
    assert log.count(CONSOLIDATED_ONCE) == 1, log[-4000:]
    assert not list((local / "checkpoints").glob(".fp32-*"))
    one = tmp_path / "one"
    pretrain.run(two_phase_config(shards, one, num_workers=2))
    print("1 rank", losses(one), "\n2 ranks, one host", losses(local))
    assert_same_run(local, one, atol=1e-5)


@pytest.mark.slow
def test_two_nodes_in_two_network_namespaces_train_as_two_ranks_on_one_host(shards,
                                                                            two_ranks_one_host,
                                                                            tmp_path):
    """Node 0 and node 1, one rank each, meet at the rendezvous on node 0 by name and train
    both phases over the veth pair with gloo: the losses and final weights of 2 ranks on one
    host (1e-6), phase 2's weights consolidated once for both nodes."""
    local, _ = two_ranks_one_host
    nodes = tmp_path / "nodes"
    config = write_config(two_phase_config(shards, nodes, num_workers=1), tmp_path / "nodes.yaml")
    with two_hosts() as hosts:
        logs = run_two_nodes(hosts, config)
    print("2 nodes", losses(nodes), "\n2 ranks, one host", losses(local))
    for log in logs:
        assert "group_world_size=2" in log
    assert sorted(int(log.split("group_rank=")[1].split()[0].strip(",")) for log in logs) == [0, 1]
    assert "".join(logs).count(CONSOLIDATED_ONCE) == 1
    assert_same_run(nodes, local, atol=1e-6)


@contextlib.contextmanager
def sshd_on(hosts: tuple[Host, Host], folder: Path) -> Iterator[Path]:
    """An sshd on port 2222 of each host's address (root, one test key, no passwords, no PAM);
    yields the client key. Stopped on exit."""
    for tool in ("/usr/sbin/sshd", "ssh-keygen", "pdsh"):
        if shutil.which(tool) is None:
            pytest.skip(f"`{tool}` is not installed (apt-get install openssh-server pdsh)")
    for name in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / name)],
                       check=True, timeout=60)
    shutil.copy(folder / "client.pub", folder / "authorized_keys")
    made_run_dir = not os.path.isdir("/run/sshd")  # sshd's privilege-separation directory
    os.makedirs("/run/sshd", exist_ok=True)
    daemons = []
    try:
        for host in hosts:
            conf = folder / f"sshd-{host.hostname}.conf"
            conf.write_text(f"Port 2222\nListenAddress {host.address}\nHostKey {folder / 'host'}\n"
                            f"PidFile {folder / host.hostname}.pid\n"
                            f"AuthorizedKeysFile {folder / 'authorized_keys'}\n"
                            "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
                            "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n")
            daemons.append(subprocess.Popen(
                ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c",
                 'hostname "$0" && exec /usr/sbin/sshd -D -e -f "$1"', host.hostname, str(conf)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(2)
        assert all(d.poll() is None for d in daemons), "an sshd did not start"
        yield folder / "client"
    finally:
        for daemon in daemons:
            daemon.terminate()
        for daemon in daemons:
            daemon.wait(timeout=30)
        if made_run_dir:
            shutil.rmtree("/run/sshd", ignore_errors=True)


@pytest.mark.slow
def test_deepspeed_pdsh_launch_over_ssh_between_two_namespaces(shards, two_ranks_one_host,
                                                              tmp_path):
    """infra/launch/deepspeed_multinode.sh on node 0 with a hostfile of both nodes: pdsh
    reaches each over ssh and starts its rank; the losses of 2 ranks on one host (1e-6)."""
    local, _ = two_ranks_one_host
    run = tmp_path / "run"
    config = write_config(two_phase_config(shards, run, num_workers=1), tmp_path / "run.yaml")
    keys = tmp_path / "keys"
    keys.mkdir()
    with two_hosts() as hosts, sshd_on(hosts, keys) as key:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{h.hostname} slots=1\n" for h in hosts))
        # what each rank needs beyond the PYTHON* variables DeepSpeed forwards itself
        env_file = tmp_path / "deepspeed_env"
        env_file.write_text("DS_ACCELERATOR=cpu\nOMP_NUM_THREADS=1\nHF_HUB_OFFLINE=1\n")
        env = {**rank_env(), "HOSTFILE": str(hostfile), "DS_ENV_FILE": str(env_file),
               "DEEPSPEED_ARGS": "--ssh_port 2222 --no_ssh_check",
               "PDSH_SSH_ARGS_APPEND": f"-i {key} -o StrictHostKeyChecking=no "
                                       "-o UserKnownHostsFile=/dev/null -o BatchMode=yes"}
        node0 = hosts[0]
        proc = subprocess.run(
            ["ip", "netns", "exec", node0.namespace, "unshare", "--uts", "sh", "-c",
             'hostname "$0" && exec "$@"', node0.hostname, "bash",
             str(REPO / "infra" / "launch" / "deepspeed_multinode.sh"), "--config", str(config)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
    log = proc.stdout + proc.stderr
    for rank, host in enumerate(hosts):
        assert f"{host.hostname}: " in log and f"node_rank={rank}" in log
    assert log.count(CONSOLIDATED_ONCE) == 1
    print("pdsh, 2 nodes", losses(run))
    assert_same_run(run, local, atol=1e-6)
