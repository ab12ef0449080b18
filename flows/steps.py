"""The library calls behind each flow task, kept free of Prefect so they test on their own.

Each stage function resolves its content-addressed output folder (flows/stages.py) and calls
one job: a Beam pipeline's `run(argv)`, the DeepSpeed training entry point (as a subprocess,
so the `deepspeed`/`torchrun` launchers and multi-node runs work the same way), or one
fine-tuning run (finetune/loop.py, any task family).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from flows import stages
from flows.config import DagConfig, ShardsConfig, finetune_tasks
from flows.stages import StageResult, run_stage
from pipelines import storage

logger = logging.getLogger("flows")


def describe(cfg: DagConfig) -> str:
    return json.dumps(cfg.to_dict(), indent=2, default=str)


# ---------------------------------------------------------------- settings, checked up front

def check_settings(cfg: DagConfig) -> None:
    """Build every stage's own config from the settings, as the stages will, so that a value a
    stage would refuse (hours later, for fine-tuning after pre-training) fails now, in the flow's
    setting names. The stages' configs hold the rules; this only asks them early."""
    from pipelines.instances import InstanceConfig
    from pipelines.shard_batches import ShardJobConfig
    from training import config as training_config

    for phase in (1, 2):
        options = shard_options(cfg, phase)
        keys = {"max_seq_length": f"shards.phase{phase}_max_seq_length",
                "max_predictions_per_seq": f"shards.phase{phase}_max_predictions"}
        with _in_setting_names(keys, default_section="shards"):
            InstanceConfig(**{k: options[k] for k in
                              ("max_seq_length", "max_predictions_per_seq", "dupe_factor",
                               *SHARD_ABLATION_SETTINGS) if k in options})
            ShardJobConfig(pack=cfg.shards.pack, target_shard_mb=options["target_shard_mb"],
                           validation_fraction=options["validation_fraction"])
    placeholder = StageResult("", "<stage>", "", cached=False, seconds=0.0)
    with _in_setting_names(_TRAINING_KEYS, default_section="pretrain"):
        config = training_config.from_dict(
            pretrain_overrides(cfg, placeholder, [placeholder, placeholder], cfg.output),
            base=training_config.PRESETS[_training_preset(cfg)]())
    extra_sets = _set_flags(cfg.pretrain.extra_args)
    try:  # after the file, as the training entry point applies them
        training_config.apply_overrides(config, extra_sets)
    except ValueError as error:
        raise ValueError(f"setting pretrain.extra_args={list(cfg.pretrain.extra_args)}: "
                         f"{error}") from None
    if cfg.finetune.data:
        with _in_setting_names({}, default_section="finetune"):
            for entry in finetune_tasks(cfg):
                finetune_config(cfg, entry)


def _set_flags(args: Sequence[str]) -> list[str]:
    """The `--set KEY=VALUE` values among the training entry point's flags (the others are
    checked by the entry point's own parser when the stage starts)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--set", action="append", default=[])
    return parser.parse_known_args(list(args))[0].set


_TRAINING_KEYS = {
    "phases.0.steps": "pretrain.phase1_steps", "phases.1.steps": "pretrain.phase2_steps",
    "phases.0.global_batch_size": "pretrain.global_batch_size",
    "phases.1.global_batch_size": "pretrain.phase2_global_batch_size",
    "phases.0.micro_batch_size": "pretrain.micro_batch_size",
    "phases.1.micro_batch_size": "pretrain.phase2_micro_batch_size",
    "phases.0.warmup_steps": "pretrain.warmup_steps",
    "phases.0.learning_rate": "pretrain.learning_rate",
    "phases.1.learning_rate": "pretrain.learning_rate",
    "phases.0.max_seq_length": "shards.phase1_max_seq_length",
    "phases.1.max_seq_length": "shards.phase2_max_seq_length",
}
"""training/config.py's flags for the settings of `pretrain_overrides` that are named otherwise."""


@contextlib.contextmanager
def _in_setting_names(keys: dict[str, str], default_section: str) -> Iterator[None]:
    """Re-raise a stage config's ValueError with its flag (`--set phases.0.steps`, `--dupe_factor`)
    replaced by the flow setting it comes from (`pretrain.phase1_steps`, `shards.dupe_factor`)."""
    try:
        yield
    except ValueError as error:
        match = re.match(r"(?:--set |--)([\w.]+)(:?)\s*(.*)", str(error), re.DOTALL)
        if match is None:
            raise ValueError(f"{default_section} settings: {error}") from None
        flag, _, rest = match.groups()
        setting = keys.get(flag, f"{default_section}.{flag.rsplit('.', 1)[-1]}")
        raise ValueError(f"setting {setting}: {rest}") from None


def _root(cfg: DagConfig) -> str:
    return cfg.output


# ---------------------------------------------------------------- data stages (Beam)

def extract_wikipedia(cfg: DagConfig) -> StageResult | None:
    from pipelines import extract_wikipedia as job

    return _extract(cfg, "wikipedia", cfg.data.wikipedia, job)


def extract_books(cfg: DagConfig) -> StageResult | None:
    from pipelines import extract_books as job

    return _extract(cfg, "books", cfg.data.books, job)


def _extract(cfg: DagConfig, stage: str, pattern: str, job) -> StageResult | None:
    """An extraction job (its module) over `pattern`; an empty pattern skips the source."""
    if not pattern:
        return None
    config = extract_stage_config(pattern, _inputs_fingerprint(pattern), job.OUTPUT_VERSION)
    return run_stage(_root(cfg), stage, config, lambda out: job.run(
        ["--input", pattern, "--output", out, *cfg.data.beam_args]))


def extract_stage_config(pattern: str, fingerprint: str, output_version: int) -> dict[str, Any]:
    """What an extraction stage's folder is keyed on. Version 1 adds no key, so the stages
    built before versions existed keep their folders (and everything downstream of them)."""
    config: dict[str, Any] = {"input": pattern, "input_sha": fingerprint}
    if output_version != 1:
        config["output_version"] = output_version
    return config


def build_corpus(cfg: DagConfig, sources: list[StageResult]) -> StageResult:
    from pipelines import build_corpus as job

    if not sources:
        raise ValueError("no data sources: set data.wikipedia and/or data.books")
    inputs = ",".join(s.path for s in sources)
    return run_stage(_root(cfg), "corpus", {}, lambda out: job.run(
        ["--input", inputs, "--output", out, *cfg.data.beam_args]), upstream=tuple(sources))


def train_vocab(cfg: DagConfig, corpus: StageResult) -> StageResult:
    from pipelines import train_vocab as job

    config = dataclasses.asdict(cfg.vocab)
    argv = ["--input", corpus.path, "--vocab_size", str(cfg.vocab.vocab_size), "--no_progress"]
    argv += ["--cased"] if cfg.vocab.cased else []
    return run_stage(_root(cfg), "vocab", config, lambda out: job.run(
        [*argv, "--output", out, *cfg.data.beam_args]), upstream=(corpus,))


def shard_options(cfg: DagConfig, phase: int) -> dict[str, Any]:
    """make_shards' options for phase 1 or 2 (flag name -> value)."""
    s = cfg.shards
    seq, preds = ((s.phase1_max_seq_length, s.phase1_max_predictions) if phase == 1
                  else (s.phase2_max_seq_length, s.phase2_max_predictions))
    options = {"max_seq_length": seq, "max_predictions_per_seq": preds,
               "dupe_factor": s.dupe_factor, "target_shard_mb": s.target_shard_mb,
               "validation_fraction": s.validation_fraction, "do_lower_case": not cfg.vocab.cased}
    # The ablation settings enter the options (and so the stage hash) only where they differ
    # from BERT's: shard folders made before they existed keep their hashes.
    defaults = ShardsConfig()
    return {**options, **{k: getattr(s, k) for k in SHARD_ABLATION_SETTINGS
                          if getattr(s, k) != getattr(defaults, k)}}


SHARD_ABLATION_SETTINGS = ("masked_lm_prob", "mask_fraction", "same_fraction",
                           "random_fraction", "do_whole_word_mask", "next_sentence")
"""ShardsConfig settings of the paper's ablations (make_shards flags of the same names;
next_sentence=false is --no_next_sentence)."""


def _shard_flags(options: dict[str, Any]) -> list[str]:
    return ["--no_next_sentence" if k == "next_sentence" else f"--{k}={v}"
            for k, v in options.items() if k != "next_sentence" or not v]


def make_shards(cfg: DagConfig, corpus: StageResult, vocab: StageResult, phase: int) -> StageResult:
    from pipelines import make_shards as job

    s = cfg.shards
    options = shard_options(cfg, phase)
    if "do_lower_case" in vocab.manifest:  # a checkpoint's vocabulary (flows/checkpoint_vocab.py)
        options["do_lower_case"] = vocab.manifest["do_lower_case"]
    seq = options["max_seq_length"]
    argv = ["--input", corpus.path, "--vocab", vocab.path]
    argv += _shard_flags(options)
    argv += ["--pack"] if s.pack else []
    return run_stage(_root(cfg), f"shards{seq}", {**options, "pack": s.pack}, lambda out: job.run(
        [*argv, "--output", out, *cfg.data.beam_args]), upstream=(corpus, vocab))


def _inputs_fingerprint(pattern: str) -> str:
    """Names, sizes and mtimes of the input files: a changed input gives a new stage folder."""
    try:
        files = storage.expand_inputs(pattern)
    except FileNotFoundError:
        return "missing"
    if any(storage.is_remote(f) for f in files):
        return storage.config_hash(files)  # remote: names only (stat is a round trip each)
    return storage.config_hash([(f, os.path.getsize(f), int(os.path.getmtime(f))) for f in files])


# ---------------------------------------------------------------- pre-training (DeepSpeed)

def pretrain_overrides(cfg: DagConfig, vocab: StageResult, shards: list[StageResult],
                       output_dir: str) -> dict[str, Any]:
    """The training entry point's config file (training/config.py), from the DAG config."""
    p = cfg.pretrain
    phase1_warmup = min(p.warmup_steps, p.phase1_steps)
    return {
        "model": "" if p.init_from else p.model, "init_from": p.init_from,
        "vocab_dir": vocab.path, "output_dir": output_dir,
        "zero_stage": p.zero_stage, "precision": p.precision,
        "phases": [
            {"name": "phase1", "train_shards": shards[0].path,
             "max_seq_length": cfg.shards.phase1_max_seq_length,
             "micro_batch_size": p.micro_batch_size, "global_batch_size": p.global_batch_size,
             "steps": p.phase1_steps, "warmup_steps": phase1_warmup,
             "learning_rate": p.learning_rate},
            {"name": "phase2", "train_shards": shards[1].path,
             "max_seq_length": cfg.shards.phase2_max_seq_length,
             "micro_batch_size": p.phase2_micro_batch_size,
             "global_batch_size": p.phase2_global_batch_size,
             "steps": p.phase2_steps, "warmup_steps": max(1, p.phase2_steps // 10),
             "learning_rate": p.learning_rate},
        ],
    }


def launch_command(cfg: DagConfig, config_file: str) -> list[str]:
    """The command that starts training: one process, `torchrun`, or `deepspeed` (multi-node)."""
    p = cfg.pretrain
    entry = ["--preset", _training_preset(cfg), "--config", config_file, *p.extra_args]
    bindir = os.path.dirname(sys.executable)
    if p.launcher == "torchrun":
        return [os.path.join(bindir, "torchrun"), f"--nproc_per_node={p.nproc_per_node}",
                "-m", "training.pretrain", *entry]
    if p.launcher == "deepspeed":
        hostfile = ["--hostfile", p.hostfile] if p.hostfile else []
        return [os.path.join(bindir, "deepspeed"), *hostfile, f"--num_gpus={p.nproc_per_node}",
                "--module", "training.pretrain", *entry]
    return [sys.executable, "-m", "training.pretrain", *entry]


def training_device(cfg: DagConfig, overrides: dict[str, Any]) -> str:
    """The training run's `device` (training/config.py): its preset's, after the config file's
    and `pretrain.extra_args`' `--set`s, as the entry point will resolve it."""
    from training import config as training_config
    from training.pretrain import build_parser

    settings = build_parser().parse_known_args(list(cfg.pretrain.extra_args))[0].set
    preset = training_config.PRESETS[_training_preset(cfg)]()
    return training_config.apply_overrides(training_config.from_dict(overrides, preset),
                                           settings).device


def _training_preset(cfg: DagConfig) -> str:
    return cfg.name if cfg.name in ("tiny", "base", "large") else "base"


def pretrain(cfg: DagConfig, vocab: StageResult, shards: list[StageResult],
             log: Callable[[str], None] = print) -> StageResult:
    """Run both phases; a re-run after a failure resumes from the last checkpoint."""
    config = {"pretrain": dataclasses.asdict(cfg.pretrain), "phase1_seq": cfg.shards.phase1_max_seq_length,
              "phase2_seq": cfg.shards.phase2_max_seq_length}

    def build(out: str) -> None:
        config_file = storage.join(out, "launch_config.json")
        overrides = pretrain_overrides(cfg, vocab, shards, out)
        storage.atomic_write_json(config_file, overrides)
        # a GPU preset where torch has no CUDA: one line now, not N ranks training on the CPU
        from training.launch import refuse_cpu_fallback
        refuse_cpu_fallback(training_device(cfg, overrides))
        started = time.monotonic()
        run_subprocess(launch_command(cfg, config_file), log=log)
        metrics = _last_metrics(out)
        storage.write_manifest(out, {"stage": "pretrain", "config": config,
                                     "seconds": time.monotonic() - started,
                                     "hf_dir": storage.join(out, "hf"), "final_metrics": metrics})

    return run_stage(_root(cfg), "pretrain", config, build, upstream=(vocab, *shards))


def _last_metrics(out: str) -> dict:
    path = os.path.join(out, "metrics.jsonl")
    if not os.path.exists(path):
        return {}
    last: dict[str, dict] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            last[record.get("split", "train")] = record
    return last


# Runs in the child before the real command: ask Linux for SIGTERM when the flow process dies
# (even by SIGKILL), then exec the command. Done by exec rather than `preexec_fn`, which is
# unsafe in the threads Prefect runs tasks in.
_EXEC_WITH_PDEATHSIG = (
    "import ctypes, os, signal, sys\n"
    "try:\n    ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM)\n"
    "except OSError:\n    pass\n"
    "os.execvp(sys.argv[1], sys.argv[1:])\n"
)


_RENDEZVOUS_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                         "MASTER_PORT")


def _accelerator() -> str:
    """DS_ACCELERATOR for the trainers: the caller's setting, else what torch finds here (a
    fixed "cpu" would put a GPU machine's ranks on the CPU with gloo)."""
    if "DS_ACCELERATOR" in os.environ:
        return os.environ["DS_ACCELERATOR"]
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def run_subprocess(command: list[str], log: Callable[[str], None] = print,
                   env: dict[str, str] | None = None) -> None:
    """Run `command`, streaming its output to `log`; stop its whole process group on cancel."""
    log("$ " + " ".join(command))
    # A launched training job makes its own rendezvous: a RANK or MASTER_PORT left in this
    # process's environment (by an in-process run, say) would send it to a port in use.
    inherited = {k: v for k, v in os.environ.items() if k not in _RENDEZVOUS_VARIABLES}
    env = {**inherited, "DS_ACCELERATOR": _accelerator(), "PYTHONUNBUFFERED": "1", **(env or {})}
    # The stage's build lock goes with it: its folder stays locked while the job writes to it,
    # even if this process is killed first.
    proc = subprocess.Popen([sys.executable, "-c", _EXEC_WITH_PDEATHSIG, *command],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, pass_fds=stages.held_lock_fds())
    previous = signal.getsignal(signal.SIGTERM) if _main_thread() else None
    if _main_thread():
        # Prefect cancels a flow run by terminating its process: take the trainers down too.
        signal.signal(signal.SIGTERM, lambda *_: (_stop(proc), sys.exit(143)))
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            log(line.rstrip())
        code = proc.wait()
    finally:
        _stop(proc)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code != 0:
        raise RuntimeError(f"{command[0]} exited with status {code}")


def _main_thread() -> bool:
    import threading
    return threading.current_thread() is threading.main_thread()


def _stop(proc: subprocess.Popen, grace: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def export_hf(cfg: DagConfig, run: StageResult) -> StageResult:
    """The pre-training run's consolidated fp32 Hugging Face folder, checked by loading it."""
    hf_dir = run.manifest.get("hf_dir") or storage.join(run.path, "hf")

    def build(out: str) -> None:
        import transformers

        model = transformers.BertForPreTraining.from_pretrained(hf_dir)
        transformers.AutoTokenizer.from_pretrained(hf_dir)
        storage.write_manifest(out, {"stage": "export", "hf_dir": hf_dir,
                                     "parameters": sum(p.numel() for p in model.parameters())})

    result = run_stage(_root(cfg), "export", {}, build, upstream=(run,))
    return dataclasses.replace(result, path=hf_dir)


# ---------------------------------------------------------------- fine-tuning fan-out

@dataclass(frozen=True)
class FinetuneJob:
    """One fine-tuning run of the fan-out."""
    family: str
    task: str
    """The task's registry name ("rte", "squad1")."""
    learning_rate: float
    seed: int


def finetune_jobs(cfg: DagConfig) -> list[FinetuneJob]:
    """tasks x learning rates x seeds (several seeds only for a family's small tasks, as the
    paper), each task with its family's recipe and the settings given."""
    from finetune.loop import seeds_for

    if not cfg.finetune.data:
        return []
    jobs = []
    for entry in finetune_tasks(cfg):
        ft = finetune_config(cfg, entry)
        jobs += [FinetuneJob(entry.family.name, entry.task, lr, seed)
                 for lr in ft.learning_rates for seed in seeds_for(entry.family, entry.task, ft)]
    return jobs


def finetune_config(cfg: DagConfig, entry):
    """The loop's settings for one task: its family's recipe, then the settings given (0 and
    () leave the recipe's)."""
    from finetune.loop import for_recipe

    f = cfg.finetune
    given = {"learning_rates": f.learning_rates, "epochs": f.epochs,
             "batch_size": f.batch_size, "max_seq_length": f.max_seq_length}
    return for_recipe(entry.family.recipe(entry.task),
                      **{k: v for k, v in given.items() if v}, seeds=f.seeds,
                      max_train_examples=f.max_train_examples or None,
                      max_eval_examples=f.max_eval_examples or None,
                      skip_bad_rows=f.skip_bad_rows, progress=False)


def fine_tuning_devices(num_gpus: int | None = None) -> list[str]:
    """Where fine-tuning runs train: every GPU torch sees, else the CPU."""
    if num_gpus is None:
        import torch

        num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(num_gpus)] or ["cpu"]


class DevicePool:
    """Devices lent to one run at a time: the flow maps fine-tuning runs onto threads, and two runs
    on one device would only share its cores or its memory. A run takes whichever device is
    free, so uneven runs keep every device busy."""

    def __init__(self, devices: Sequence[str]):
        self._free: queue.Queue[str] = queue.Queue()
        for device in devices:
            self._free.put(device)

    @contextlib.contextmanager
    def take(self) -> Iterator[str]:
        device = self._free.get()
        try:
            yield device
        finally:
            self._free.put(device)


_POOL: DevicePool | None = None
_POOL_GUARD = threading.Lock()


def _device_pool() -> DevicePool:
    global _POOL
    with _POOL_GUARD:
        if _POOL is None:
            _POOL = DevicePool(fine_tuning_devices())
        return _POOL


def finetune_run(cfg: DagConfig, model: StageResult, job: FinetuneJob) -> dict:
    """Fine-tune one (task, learning rate, seed) on a free device; its dev result, prediction
    files and test predictions.

    Content-addressed like every stage (the device is not part of the key): a re-run reuses a
    finished fine-tuning run."""
    from finetune.tasks import get_task

    entry = get_task(job.task)
    ft, data = finetune_config(cfg, entry), os.path.join(cfg.finetune.data, entry.data_folder)
    recipe = {k: v for k, v in dataclasses.asdict(ft).items() if k not in ("progress", "device")}
    config = {"job": dataclasses.asdict(job), "data": data, "recipe": recipe}
    name = f"{job.family}-{job.task.lower()}-lr{job.learning_rate:g}-seed{job.seed}"

    def build(out: str) -> None:
        # reading needs no device; the runs of one task waiting for a device share one reading
        ready = _PREPARED.get((model.path, job.task, data, ft),
                              lambda: _Prepared(*_prepare_one(model, entry.family, job.task,
                                                              data, ft)))
        with _device_pool().take() as device:
            result = _finetune_one(entry.family, ready.encoder, ready.prepared, job,
                                   dataclasses.replace(ft, device=device))
        storage.write_manifest(out, result)

    stage = run_stage(_root(cfg), name, config, build, upstream=(model,))
    return {**stage.manifest, "cached": stage.cached}


@dataclass
class _Prepared:
    """One task's tokenized splits and the encoder they were checked against."""
    encoder: Any
    prepared: Any


class SharedPreparations:
    """Values built once per key and shared by the threads that hold them at the same time.

    The fan-out maps every (task, rate, seed) onto a thread, and each reads and tokenizes its
    task before it waits for a device: minutes per MNLI copy, and every waiting copy held in
    memory. Here the first run of a task prepares it while the others wait on that key alone;
    the entry lives while any run holds it (weak reference), so a finished task frees its memory.
    A preparation that fails fails the runs already waiting for it at once (a malformed row
    found after minutes of reading is not read again by each of them); a run that comes later
    tries again.
    """

    @dataclass
    class _Key:
        lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
        waiting: int = 0
        failure: str | None = None

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._keys: dict[Any, SharedPreparations._Key] = {}
        self._values: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

    def get(self, key: Any, build: Callable[[], Any]) -> Any:
        with self._guard:
            entry = self._keys.setdefault(key, self._Key())
            entry.waiting += 1
        try:
            with entry.lock:
                if entry.failure is not None:  # a fresh error: the first one's frames stay its own
                    raise RuntimeError(f"{entry.failure} (reading the task failed for the run "
                                       "before this one)")
                value = self._values.get(key)
                if value is None:
                    try:
                        value = build()
                    except Exception as error:
                        entry.failure = f"{type(error).__name__}: {error}"
                        raise
                    self._values[key] = value
                return value
        finally:
            with self._guard:
                entry.waiting -= 1
                if entry.waiting == 0:  # nobody waits: a later run starts afresh
                    del self._keys[key]


_PREPARED = SharedPreparations()


def _prepare_one(model: StageResult, family, task: str, data: str, ft):
    """(encoder, the task's encoded splits) for one run, checked against each other."""
    from finetune.checkpoint import check_model_fits, load_encoder, load_tokenizer
    from finetune.loop import ModelChecks

    encoder, tokenizer = load_encoder(model.path), load_tokenizer(model.path)
    # the export writes both from one run, but a hand-edited folder would fail deep in torch
    check_model_fits(encoder, tokenizer, ft.max_seq_length, model.path, model.path)
    if isinstance(family, ModelChecks):
        family.check_model(encoder, task, model.path)
    return encoder, family.prepare(task, data, tokenizer, ft.max_seq_length,
                                   ft.max_train_examples, ft.max_eval_examples, ft.skip_bad_rows)


def _finetune_one(family, encoder, prepared, job: FinetuneJob, ft) -> dict:
    from finetune import loop

    result, trained = loop.run_one(family, encoder, prepared, job.learning_rate, job.seed, ft)
    predictions = loop.predict_test_sets(family, trained, prepared, ft)
    return {"job": dataclasses.asdict(job), "result": dataclasses.asdict(result),
            "predictions": [dataclasses.asdict(p) for p in predictions],
            "num_train": prepared.num_train_examples, "bad_rows": len(prepared.bad_records),
            "bad_records": [dataclasses.asdict(b) for b in prepared.bad_records],
            "num_dev": dict(prepared.num_dev_examples)}


def outcome(job: FinetuneJob, state) -> dict:
    """A mapped run's result, or its failure, for the report."""
    if state.is_completed():
        return state.result()
    return {"job": dataclasses.asdict(job), "error": str(state.message or state.name)}


def finetune_best(cfg: DagConfig, model: StageResult, outcomes: list[dict],
                  out: str | None = None) -> dict:
    """Per task, the learning rate with the best mean dev score over seeds; one table over
    every family, the prediction files, in `out` (default `<root>/finetune`; a sweep gives each
    variant its own)."""
    from finetune import loop, report
    from finetune.tasks import get_task

    failed = [o for o in outcomes if "error" in o]
    done = [o for o in outcomes if "error" not in o]
    tasks, configs = [], {}
    for name in dict.fromkeys(o["job"]["task"] for o in done):
        runs = [o for o in done if o["job"]["task"] == name]
        tasks.append(_task_result(runs))
        configs[tasks[-1].task] = finetune_config(cfg, get_task(name))
    # one task's settings stand for all in results.json's "config"; each is in "task_configs"
    shared = next(iter(configs.values()), loop.FinetuneConfig(progress=False))
    result = loop.FinetuneResult(tuple(tasks), model.path, shared, configs=configs)
    out = out or storage.join(_root(cfg), "finetune")
    files = report.write_report(result, out)
    dead_letters = [p for k, p in files.items() if k.startswith("dead_letter")]
    if dead_letters:
        logger.warning("fine-tuning: %d malformed record(s) set aside (finetune.skip_bad_rows) "
                       "in %s", sum(t.bad_rows for t in tasks), ", ".join(dead_letters))
    return {"table": report.markdown_table(result), "glue_score": report.glue_score(result),
            "failed": failed, "files": files, "output": out}


def _task_result(runs: list[dict]):
    """The task's summary by `loop.select_best` (the CLI's rule): the prediction files and
    test predictions are those of the best seed at the best learning rate."""
    from finetune import loop

    results = [loop.RunResult(**o["result"]) for o in runs]
    name = results[0].task  # the family's own spelling ("RTE")
    # A rate that lost seeds to failed runs would be judged on fewer of them: compare only the
    # rates with every seed that any rate completed (the failures are in finetune_best's
    # "failed").
    seeds = Counter(r.learning_rate for r in results)
    complete = [r for r in results if seeds[r.learning_rate] == max(seeds.values())]
    if len(complete) < len(results):
        logger.warning("%s: learning rate(s) %s lost seeds to failed runs and are not compared",
                    name, sorted({r.learning_rate for r in results} -
                                 {r.learning_rate for r in complete}))
    best = loop.select_best(complete)
    best_run = next(o for o, r in zip(runs, results) if r is best.best_run)
    return loop.summarise_task(
        name, complete, num_train_examples=best_run["num_train"],
        num_dev_examples=best_run["num_dev"], bad_rows=best_run.get("bad_rows", 0),
        seconds=sum(r.train_seconds + r.eval_seconds for r in results),
        test_predictions=tuple(loop.TestPredictions(**p) for p in best_run["predictions"]),
        # every run of a task read the same files: one run's rows set aside are the task's
        bad_records=tuple(_bad_record(b) for b in best_run.get("bad_records", ())),
        family=best_run["job"]["family"])


def _bad_record(fields: dict):
    """A record set aside, back from a run's manifest (with its raw text where it has one)."""
    from finetune.glue.data import BadRow
    from pipelines.jobs import BadRecord

    return BadRow(**fields) if "text" in fields else BadRecord(**fields)


# ---------------------------------------------------------------- report

def report(cfg: DagConfig, stages: list[StageResult], finetune: dict | None,
           filename: str = "report.md", folder: str | None = None) -> dict:
    """`report.md` in `folder` (default: the run folder): stage timings, data statistics, loss
    curve, the fine-tuning table (every family's tasks, the GLUE score).
    (A data-only run writes `report-data.md`: the full run's report stays.)"""
    rows = [{"stage": s.stage, "cached": s.cached, "seconds": round(s.seconds, 1),
             "output": s.path} for s in stages]
    stats = _data_statistics(stages)
    pretrain = next((s for s in stages if s.stage == "pretrain"), None)
    loss_curve = os.path.join(pretrain.path, "loss_curve.png") if pretrain else ""
    lines = [f"# pretrain-bert report ({cfg.name})", "", "## Stages", "",
             "| stage | cached | seconds | output |", "|---|---|---:|---|"]
    lines += [f"| {r['stage']} | {'yes' if r['cached'] else 'no'} | {r['seconds']} | "
              f"`{r['output']}` |" for r in rows]
    lines += ["", "## Data", ""] + [f"- {k}: {v}" for k, v in stats.items()]
    if pretrain:
        lines += ["", "## Pre-training", ""]
        for split, record in pretrain.manifest.get("final_metrics", {}).items():
            shown = {k: v for k, v in record.items() if isinstance(v, (int, float))}
            lines.append(f"- last {split}: " + ", ".join(f"{k}={v:.4g}" for k, v in shown.items()))
        if os.path.exists(loss_curve):
            lines.append(f"\n![loss curve]({loss_curve})")
    if finetune:
        lines += ["", "## Fine-tuning (dev)", "", finetune["table"]]
        lines += [f"- FAILED {f['job']}: {f['error']}" for f in finetune["failed"]]
    text = "\n".join(lines) + "\n"
    path = storage.join(folder or _root(cfg), filename)
    storage.atomic_write_text(path, text)
    return {"markdown": text, "path": path, "stages": rows, "loss_curve": loss_curve,
            "finetune_table": finetune["table"] if finetune else "", "statistics": stats}


def _data_statistics(stages: list[StageResult]) -> dict[str, Any]:
    stats: dict[str, Any] = {}
    for s in stages:
        counts = s.manifest.get("counts") or s.manifest.get("totals") or {}
        for key, value in counts.items():
            if isinstance(value, (int, float)):
                stats[f"{s.stage}.{key}"] = value
    return stats


def image_markdown(png_path: str) -> str:
    """A PNG inlined as a data URI, so the Prefect UI shows it without a file server."""
    import base64

    with open(png_path, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    return f"![{os.path.basename(png_path)}](data:image/png;base64,{data})"
