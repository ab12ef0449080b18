"""BERT pre-training with DeepSpeed: `bert-pretrain` / `python -m training.pretrain`.

    bert-pretrain --preset tiny --set vocab_dir=VOCAB --set phase1.train_shards=SHARDS_128 \
        --set phase2.train_shards=SHARDS_512 --set output_dir=runs/tiny
    torchrun --nproc_per_node 2 -m training.pretrain ...        # N ranks on one node
    deepspeed --hostfile hosts --module training.pretrain ...   # several nodes

The run is its phases in order (phase 2 starts from phase 1's final weights with its own data,
batch, optimizer and schedule). Steps: `build_model` -> `build_engine` (deepspeed.initialize) ->
`train_step` x steps (with `evaluate` and `save_checkpoint`) -> `export`. Started again with the
same `output_dir`, it resumes from `checkpoints/latest`: weights, optimizer, scheduler, RNG and
the loader's position, so a run killed with `kill -9` continues as if never stopped. Resuming
with a config that differs in a field that shapes the training (`config.resume_conflicts`) or
on another shard set (names, row counts and sha256 of the manifest) is refused, naming them.

Continued pre-training (`--set init_from=<BERT folder>`, training/init_from.py): the checkpoint
gives the model's shape, its weights (loaded before `deepspeed.initialize`, so ZeRO-3 partitions
them) and, unless `vocab_dir` is set to the same tokens, the vocabulary the shards must have been
made with. Only a run's first phase starts there, and only while the run has no checkpoint of
its own: a restarted run resumes from `checkpoints/latest`, reading `init_from` for the shape.

Output folder: `config.json` (resolved config), `metrics.jsonl`, `tensorboard/`,
`loss_curve.png`, `checkpoints/<tag>/` (DeepSpeed files + `training_state.json` + per-rank
`rng_rank*.pt` + `config.json`), `checkpoints/latest`, `hf/` (consolidated fp32 export).

Checkpoints (training/checkpoint.py) are written to `checkpoints/.tmp-<tag>`, renamed to `<tag>`
when every rank is done, and only then is `latest` replaced (atomically); the oldest beyond
`keep_checkpoints` are deleted. Every checkpoint file is checked before DeepSpeed or torch reads
it (loadable with weights_only=True, and as its checksums.json records): a planted pickle is
refused in one line naming it, and runs no code.

Resuming on a different number of ranks: when the optimizer state is partitioned by rank
(zero_stage >= 1, which bf16 and fp16 require) the checkpoint is converted once with DeepSpeed's
`ds_to_universal` (`python -m deepspeed.checkpoint.ds_to_universal --input_folder <tag>
--output_folder <tag>-universal`, done here automatically on rank 0) and loaded with `"checkpoint":
{"load_universal": true}`; the loader then skips the same share of the epoch (not the exact same
rows). With fp32 at zero_stage 0 the model-states file holds everything and loads as it is.

Validation: checked for every phase with steps left before the run's first step (`preflight`:
held-out rows for at least one micro-batch per rank, else a clear error: better to fail in
seconds than at the first evaluation hours in); a checkpoint due at a step is written before that
step's evaluation.
"""
from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor

from common import logs, storage
from training import config as cfg
from training.checkpoint import (
    CHECKPOINTS,
    CheckpointState,
    consolidated_state_dict,
    has_partitioned_state,
    load_checkpoint,
    read_latest,
    remove_stale_files,
    save_checkpoint,
    shared_consolidated_state_dict,
    to_universal,
)
from training.config import PhaseConfig, PretrainConfig
from training.loader import (
    LoaderConfig,
    Remasker,
    ShardLoader,
    static_shapes_for,
    validation_batches,
)
from training.ranks import Dist, OtherRankError, on_all_ranks

log = logging.getLogger("training.pretrain")
METRIC_KEYS = ("loss", "mlm_loss", "mlm_correct", "mlm_count", "nsp_loss", "nsp_correct",
               "nsp_count", "tokens", "samples", "micro_batches")


# ---------------------------------------------------------------- setup

def enable_tf32() -> None:
    """fp32 matrix products and convolutions on tensor cores (TF32, 10-bit mantissa inputs,
    fp32 accumulation): what fp32 work remains on a GPU (an fp32 run, LAMB, the fp32 loss and
    softmax) runs at tensor-core speed, 8x an A100's fp32 rate, at the precision NVIDIA's BERT
    recipes train with."""
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


def bf16_hardware(on_gpu: bool) -> bool:
    """Whether this machine multiplies bf16 matrices natively: a CUDA GPU with bf16 (Ampere and
    later), or a CPU whose oneDNN has a bf16 kernel (AVX512-BF16, AMX, or AVX-512 cores)."""
    if on_gpu:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


def init_distributed() -> Dist:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    from training.launch import init_process_env, init_process_group
    init_process_env()
    init_process_group(get_accelerator().communication_backend_name())
    with logs.quiet_output():  # DeepSpeed prints each op it builds
        deepspeed.init_distributed()  # gloo on the CPU accelerator, nccl on GPUs
    on_gpu = get_accelerator().device_name() == "cuda"
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        enable_tf32()
    return Dist(torch.distributed.get_rank(), torch.distributed.get_world_size(), on_gpu)


def shard_manifest(phase: PhaseConfig) -> dict:
    from training.loader import read_shard_manifest
    if not phase.train_shards:
        raise ValueError(f"--set {phase.name}.train_shards=...: the phase has no shards")
    return read_shard_manifest(phase.train_shards)


def check_phase_inputs(config: PretrainConfig, first_phase: int = 0) -> None:
    """The shards of every phase from `first_phase` on (earlier ones are done: their shards may
    be gone), before the first step: a mistake in phase 2's inputs must not surface after
    phase 1's hours. Per phase: the manifest, the sequence length, the vocabulary (size, and
    the file's sha256 against `vocab_dir`'s: same-size vocabularies with other tokens would
    train silently on ids the tokenizer does not mean), complete local shard files, each with
    the manifest's sha256 and only regular, relatively named members (`verify_shard_files`;
    above `FULL_CHECK_MAX_BYTES` the loader checks each shard as it reads it instead). Across
    phases: one vocabulary, and NSP in all or none."""
    from common import storage
    from training.loader import check_shard_files, list_shards, verify_shard_files

    vocab_file, vocab_sha, vocab_size = None, None, None
    if config.vocab_dir:
        from common.tokenization import read_vocab
        vocab_file = config.vocab_dir if config.vocab_dir.endswith(".txt") else \
            storage.join(config.vocab_dir, "vocab.txt")
        vocab_size, vocab_sha = len(read_vocab(config.vocab_dir)), storage.sha256_file(vocab_file)
    seen: dict[str, tuple[str, object]] = {}  # manifest key -> (first phase, its value)
    for phase in config.phases[first_phase:]:
        manifest = shard_manifest(phase)
        where = f"{phase.name}.train_shards={phase.train_shards}"
        seq = manifest.get("max_seq_length")
        if seq is not None and int(seq) != phase.max_seq_length:
            raise ValueError(f"{where}: shards of max_seq_length {seq}, but "
                             f"{phase.name}.max_seq_length is {phase.max_seq_length}")
        recorded = (manifest.get("vocab") or {}).get("sha256")
        if vocab_sha and recorded and recorded != vocab_sha and \
                not same_tokens(manifest["vocab"].get("path"), recorded, config.vocab_dir):
            if config.init_from:
                raise ValueError(
                    f"{where}: shards made with the vocabulary {manifest['vocab'].get('path')} "
                    f"(sha256 {recorded[:12]}), but init_from={config.init_from} has another "
                    f"({vocab_file}, sha256 {vocab_sha[:12]}): its embeddings would read token "
                    "ids it does not know. Make the shards with the checkpoint's vocab.txt")
            raise ValueError(
                f"{where}: shards made with the vocabulary {manifest['vocab'].get('path')} "
                f"(sha256 {recorded[:12]}), but vocab_dir={config.vocab_dir} holds another "
                f"({vocab_file}, sha256 {vocab_sha[:12]}): the token ids would not mean what "
                "the exported tokenizer says. Point vocab_dir at the shards' vocabulary")
        if vocab_size and manifest.get("vocab_size") and int(manifest["vocab_size"]) != vocab_size:
            raise ValueError(f"{where}: shards made with vocab_size {manifest['vocab_size']}, "
                             f"but vocab_dir={config.vocab_dir} holds {vocab_size} tokens")
        for key, value in (("vocab_size", manifest.get("vocab_size")), ("vocab sha256", recorded),
                           ("nsp", bool(manifest.get("nsp", True)))):
            if value is None:  # an older manifest without it
                continue
            first = seen.setdefault(key, (phase.name, value))
            if value != first[1]:
                raise ValueError(f"{where}: shards with {key} {value}, but {first[0]}'s have "
                                 f"{first[1]}: every phase must train one model on one "
                                 "vocabulary, with next-sentence pairs in all phases or none")
        shards = list_shards(phase.train_shards, "train")[0]
        check_shard_files(shards)
        verify_shard_files(shards)


def same_tokens(recorded_path: str | None, recorded_sha: str, vocab_dir: str) -> bool:
    """Whether the vocabulary file a manifest names is still the one it hashed and holds the
    same tokens as `vocab_dir`'s: a copy with other line endings hashes differently but is the
    same vocabulary. (A file rewritten in place since is not: its hash no longer matches.)"""
    from common import storage
    from common.tokenization import read_vocab
    try:
        return bool(recorded_path) and storage.sha256_file(recorded_path) == recorded_sha and \
            read_vocab(recorded_path) == read_vocab(vocab_dir)
    except (OSError, ValueError):
        return False


def build_model(config: PretrainConfig, manifest: dict, state_dict: dict | None = None,
                initial: bool = False):
    """`model.heads.BertForPreTraining` of the preset with the run's shape and objective, sized
    to the shards' vocabulary, or of `init_from`'s shape (training/init_from.py); the NSP head
    only where the shards have NSP labels and the run trains NSP (`next_sentence`, never for
    objective=ltr). `state_dict`: a previous phase's (or a checkpoint's) weights; `initial`:
    start from `init_from`'s weights instead."""
    from model.heads import BertForPreTraining

    next_sentence = bool(manifest.get("nsp", True)) and config.next_sentence \
        and config.objective != "ltr"
    model = BertForPreTraining(model_config(config, manifest), next_sentence=next_sentence)
    if initial:
        from model.hf import find_starting_point
        from training.init_from import load_starting_weights
        load_starting_weights(model, find_starting_point(config.init_from))
    if state_dict is not None:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        missing = [k for k in missing if k != "mlm.decoder.weight"]  # tied to the embeddings
        if missing or unexpected:
            raise ValueError(f"previous phase's weights: missing {missing}, unexpected {unexpected}")
    return model


def model_config(config: PretrainConfig, manifest: dict):
    """The run's `model.bert.BertConfig`: `init_from`'s shape, or the preset's (with the run's
    shape fields) with the shards' vocabulary size."""
    if config.init_from:
        from training.init_from import checkpoint_model_config
        return checkpoint_model_config(config, manifest)
    vocab_size = int(manifest.get("vocab_size") or 0)
    if config.vocab_dir:
        from common.tokenization import read_vocab
        tokens = len(read_vocab(config.vocab_dir))
        if vocab_size and tokens != vocab_size:
            raise ValueError(f"--set vocab_dir={config.vocab_dir}: {tokens} tokens, but the shards "
                             f"were made with vocab_size {vocab_size}")
        vocab_size = tokens
    if not vocab_size:
        raise ValueError("vocab_size unknown: set vocab_dir or write vocab_size in the manifest")
    return config.model_config(vocab_size, vocab_multiple=64)


def build_engine(config: PretrainConfig, phase: PhaseConfig, model, dist: Dist,
                 load_universal: bool = False):
    """`deepspeed.initialize` with the phase's DeepSpeed config; returns the engine."""
    import deepspeed

    from training.ds_config import build_ds_config, lr_scheduler
    from training.optim import param_groups

    ds_config = build_ds_config(config, phase, dist.world_size, dist.on_gpu, load_universal)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model, config.weight_decay), config=ds_config,
        lr_scheduler=lr_scheduler(phase))
    return engine


def build_loader(config: PretrainConfig, phase: PhaseConfig, dist: Dist,
                 validation: bool = False) -> LoaderConfig:
    remasker = None
    if config.dynamic_masking and not validation:
        from common.masking import MaskingConfig
        cap = int(shard_manifest(phase).get("max_predictions_per_seq") or 0) \
            if config.masked_lm_prob else MaskingConfig.max_predictions_per_seq  # unused
        if not cap:
            raise ValueError(f"--set masked_lm_prob={config.masked_lm_prob}: the manifest of "
                             f"{phase.train_shards} records no max_predictions_per_seq to cap it")
        remasker = Remasker.from_vocab(config.vocab_dir, config.seed, config.masking(cap),
                                       recount=bool(config.masked_lm_prob))
    return LoaderConfig(
        source=(phase.validation_shards or phase.train_shards) if validation else phase.train_shards,
        batch_size=phase.micro_batch_size, max_seq_length=phase.max_seq_length, rank=dist.rank,
        world_size=dist.world_size, num_workers=0 if validation else config.num_workers,
        seed=config.seed, shuffle_buffer=config.shuffle_buffer,
        split="validation" if validation else "train", remasker=remasker,
        pin_memory=dist.on_gpu and not validation, attention_plan=not dist.on_gpu,
        static_shapes=static_shapes_for(shard_manifest(phase), phase.max_seq_length)
        if config.uses_static_shapes(dist.on_gpu) else None)


# ---------------------------------------------------------------- steps

def train_step(engine, batches: Iterator[dict]) -> Tensor:
    """One optimizer step: gradient_accumulation_steps micro-batches of forward + backward.
    Returns the step's summed metrics (`metric_sums`) on the device, not yet read."""
    sums = torch.zeros(len(METRIC_KEYS), dtype=torch.float64, device=engine.device)
    for _ in range(engine.gradient_accumulation_steps()):
        batch = to_device(next(batches), engine.device)
        out = engine(**batch)
        engine.backward(out.loss)
        engine.step()
        sums += metric_sums(out, batch)
    return sums


def to_device(batch: dict[str, Tensor], device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def metric_sums(out, batch: dict[str, Tensor]) -> Tensor:
    """One micro-batch's METRIC_KEYS as a float64 vector on the device. Summed there and read
    (`.tolist()`) once per logging step: an `.item()` per value would stall a GPU's queue
    seven times per micro-batch."""
    zero = out.loss.new_zeros((), dtype=torch.float64)  # not the loss's dtype: bf16 counts stop at 256
    nsp = (out.nsp_loss, out.nsp_correct, out.nsp_count) if out.nsp_loss is not None \
        else (zero, zero, zero)
    values = (out.loss, out.mlm_loss, out.mlm_correct, out.mlm_count, *nsp,
              batch["attention_mask"].sum(), zero + batch["input_ids"].shape[0], zero + 1)
    return torch.stack([v.detach().to(torch.float64) for v in values])


@torch.no_grad()
def evaluate(engine, config: PretrainConfig, phase: PhaseConfig, dist: Dist) -> dict[str, float]:
    """Validation loss and accuracies over `eval_batches` micro-batches per rank."""
    engine.eval()
    sums = torch.zeros(len(METRIC_KEYS), dtype=torch.float64, device=engine.device)
    for batch in validation_batches(build_loader(config, phase, dist, validation=True),
                                    config.eval_batches):
        batch = to_device(batch, engine.device)
        sums += metric_sums(engine(**batch), batch)
    engine.train()
    return summarize(all_reduce(sums), elapsed=None)


def has_validation(config: PretrainConfig, phase: PhaseConfig, dist: Dist) -> bool:
    """Whether to validate the phase: eval_batches > 0 and held-out shards exist (else skipped,
    with a warning). `preflight` asks it for every phase with steps left before the run's first
    step: shards with fewer rows than one micro-batch per rank raise here, not at the phase's
    first evaluation (where `validation_batches` would end the run)."""
    from training.loader import check_shard_files, list_shards
    if config.eval_batches == 0:
        return False
    source = build_loader(config, phase, dist, validation=True).source
    try:
        shards, _ = list_shards(source, "validation")
    except FileNotFoundError as e:
        if dist.is_main:
            log.warning("%s: no validation shards, validation skipped (%s)", phase.name, e)
        return False
    check_shard_files(shards)
    rows, needed = sum(s.num_rows for s in shards), dist.world_size * phase.micro_batch_size
    if rows < needed:
        raise ValueError(
            f"{source}: the validation shards hold {rows} rows, fewer than one micro-batch per "
            f"rank ({dist.world_size} ranks x {phase.name}.micro_batch_size "
            f"{phase.micro_batch_size} = {needed}); write more validation rows, point --set "
            f"{phase.name}.validation_shards=... elsewhere, or --set eval_batches=0")
    return True


def all_reduce(sums: Tensor) -> dict[str, float]:
    """Metric sums over all ranks, read on the host. `sums` stays on the model's device: NCCL,
    the backend on GPUs, reduces only device tensors."""
    sums = sums.clone()
    torch.distributed.all_reduce(sums)
    return dict(zip(METRIC_KEYS, sums.tolist()))


def summarize(sums: dict[str, float], elapsed: float | None) -> dict[str, float]:
    n = max(sums["micro_batches"], 1)
    out = {"loss": sums["loss"] / n, "mlm_loss": sums["mlm_loss"] / n,
           "mlm_accuracy": sums["mlm_correct"] / max(sums["mlm_count"], 1)}
    if sums["nsp_count"]:
        out.update(nsp_loss=sums["nsp_loss"] / n,
                   nsp_accuracy=sums["nsp_correct"] / sums["nsp_count"])
    if elapsed:
        out.update(tokens_per_s=sums["tokens"] / elapsed, samples_per_s=sums["samples"] / elapsed)
    return out


# ---------------------------------------------------------------- metrics

class MetricsLog:
    """metrics.jsonl + TensorBoard on rank 0."""

    def __init__(self, output_dir: str, dist: Dist, resume_from: tuple[int, int] | None):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.writer = None
        if not dist.is_main:
            return
        if resume_from is not None and os.path.exists(self.path):
            # Drop lines written after the checkpoint we resume from: they will be redone.
            kept = [r for r in read_metrics(output_dir)
                    if (r["phase_index"], r["step"]) <= resume_from]
            storage.atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        elif resume_from is None and os.path.exists(self.path):
            os.unlink(self.path)
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(os.path.join(output_dir, "tensorboard"))

    def write(self, record: dict) -> None:
        if self.writer is None:
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())
        prefix = record["split"]
        for key, value in record.items():
            if isinstance(value, (int, float)) and key not in _RECORD_KEYS:
                self.writer.add_scalar(f"{prefix}/{key}", value, record["global_step"])
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


_RECORD_KEYS = ("phase_index", "step", "global_step")


def read_metrics(output_dir: str) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def plot_loss_curve(output_dir: str) -> str:
    """loss_curve.png: training and validation loss and MLM accuracy over global steps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(output_dir)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    for split, style in (("train", "-"), ("validation", "o--")):
        rows = [r for r in records if r["split"] == split]
        steps = [r["global_step"] for r in rows]
        ax_loss.plot(steps, [r["loss"] for r in rows], style, label=f"{split} loss")
        ax_acc.plot(steps, [r["mlm_accuracy"] for r in rows], style, label=f"{split} MLM acc")
    for ax, title in ((ax_loss, "loss (MLM + NSP)"), (ax_acc, "masked-LM accuracy")):
        ax.set_xlabel("optimizer step (all phases)")
        ax.set_title(title)
        ax.legend()
    path = os.path.join(output_dir, "loss_curve.png")
    with storage.atomic_open(path, "wb") as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return path


# ---------------------------------------------------------------- the run

def train_phase(engine, config: PretrainConfig, phase_index: int, phase: PhaseConfig,
                loader: ShardLoader, step: int, step_offset: int, metrics: MetricsLog,
                dist: Dist, stop_at: int, validate: bool) -> tuple[str | None, int]:
    """Steps `step`..`stop_at` (<= phase.steps) of one phase; returns the last checkpoint tag
    and the step reached. Stopping early (`stop_at` < phase.steps) saves a checkpoint. A step's
    checkpoint is written before its evaluation, so a failing evaluation loses no training."""
    batches = iter(loader)
    tag = None
    window, started = 0, time.perf_counter()
    bar = logs.progress(total=phase.steps, initial=step, desc=phase.name, disable=not dist.is_main,
               dynamic_ncols=True)
    while step < stop_at:
        window = window + train_step(engine, batches)
        step += 1
        bar.update(1)
        if step % config.log_every == 0 or step == phase.steps:
            summary = summarize(all_reduce(window), time.perf_counter() - started)
            summary["lr"] = float(engine.get_lr()[0])  # of the next step
            summary.update(data_epoch=loader.epoch, rows_cut=loader.rows_cut)
            metrics.write(_record("train", phase_index, phase, step, step_offset, summary))
            bar.set_postfix(loss=f"{summary['loss']:.3f}", mlm_acc=f"{summary['mlm_accuracy']:.3f}")
            window, started = 0, time.perf_counter()
        if ((config.checkpoint_every and step % config.checkpoint_every == 0)
                or step in (phase.steps, stop_at)):
            tag = save_checkpoint(engine, config, phase_index, phase, step, loader, dist)
        if validate and is_evaluation_step(config, phase, step):
            summary = evaluate(engine, config, phase, dist)
            metrics.write(_record("validation", phase_index, phase, step, step_offset, summary))
    bar.close()
    return tag, step


def is_evaluation_step(config: PretrainConfig, phase: PhaseConfig, step: int) -> bool:
    return bool(config.eval_every and step % config.eval_every == 0) or step == phase.steps


def validation_missing(config: PretrainConfig, resume: CheckpointState, dist: Dist) -> bool:
    """Whether the run was stopped between the resumed step's checkpoint and its evaluation
    (a kill, a failing validation shard): then that evaluation is redone before training on
    (if the phase has validation shards). Rank 0 reads metrics.jsonl and tells the others,
    since evaluation is collective."""
    missing = [False]
    if dist.is_main and config.eval_batches and resume.phase_index < len(config.phases) and \
            is_evaluation_step(config, config.phases[resume.phase_index], resume.step):
        path = os.path.join(config.output_dir, "metrics.jsonl")
        records = read_metrics(config.output_dir) if os.path.exists(path) else []
        missing[0] = not any(r["split"] == "validation" and r["phase_index"] == resume.phase_index
                             and r["step"] == resume.step for r in records)
    torch.distributed.broadcast_object_list(missing, src=0)
    return missing[0]


def _record(split: str, phase_index: int, phase: PhaseConfig, step: int, offset: int,
            summary: dict) -> dict:
    return {"split": split, "phase_index": phase_index, "phase": phase.name, "step": step,
            "global_step": offset + step, **summary}


def run(config: PretrainConfig, stop_after_steps: int | None = None) -> dict:
    """Train every phase (resuming from `output_dir` if it holds checkpoints); export at the end.

    `stop_after_steps`: stop (with a checkpoint) after that many optimizer steps of this call,
    as a preemption would; running again resumes. Returns the last checkpoint tag, the export
    folder (None if stopped early) and whether the run is complete."""
    dist = init_distributed()
    if config.precision == "auto":
        config = replace(config, precision=config.concrete_precision(bf16_hardware(dist.on_gpu)))
        if dist.is_main:
            log.info("precision=auto: training in %s on this hardware", config.precision)
    config = on_all_ranks(dist, lambda: with_checkpoint_vocab(config))
    if config.export_hf and not config.vocab_dir:
        raise ValueError("--set vocab_dir=...: needed to export the Hugging Face folder "
                         "(or --set export_hf=false)")
    ckpt_dir = os.path.join(config.output_dir, CHECKPOINTS)
    resume, validate, redo = preflight(config, dist, ckpt_dir)
    if dist.is_main:
        log.info("config: %s (BERT_LOG_LEVEL=DEBUG prints it)",
                 os.path.join(config.output_dir, "config.json"))
        log.debug("resolved config:\n%s", cfg.describe(config, dist.world_size))
        remove_stale_files(ckpt_dir)
        os.makedirs(ckpt_dir, exist_ok=True)
        cfg.save(config, os.path.join(config.output_dir, "config.json"))
    torch.distributed.barrier()
    if resume and dist.is_main:
        log.info("resuming from %s/%s (phase %s step %d, saved on %d ranks)", ckpt_dir,
                 resume.tag, resume.phase, resume.step, resume.world_size)
    metrics = MetricsLog(config.output_dir, dist,
                         (resume.phase_index, resume.step) if resume else None)
    last_tag = resume.tag if resume else None
    step_offset, budget, complete = 0, stop_after_steps, True
    for index, phase in enumerate(config.phases):
        here = resume is not None and resume.phase_index == index
        if resume is not None and (resume.phase_index > index or
                                   (here and resume.step >= phase.steps and not redo)):
            step_offset += phase.steps
            continue  # phase already done
        if budget is not None and budget <= 0:
            complete = False
            break
        last_tag, done = run_phase(config, index, phase, dist, metrics, step_offset,
                                   resume if here else None, last_tag, budget, validate[index],
                                   redo_validation=here and redo)
        if budget is not None:
            budget -= done
        if done < phase.steps - (resume.step if here else 0):
            complete = False
            break
        step_offset += phase.steps
    metrics.close()
    export_dir = None
    if dist.is_main and complete:
        plot_loss_curve(config.output_dir)
        if config.export_hf:
            export_dir = export(config, ckpt_dir, last_tag)
    torch.distributed.barrier()
    return {"last_checkpoint": last_tag, "export_dir": export_dir, "complete": complete}


def with_checkpoint_vocab(config: PretrainConfig) -> PretrainConfig:
    """With `init_from` and no `vocab_dir`, the checkpoint's vocabulary folder (if it has a
    vocab.txt): the shards are checked against it and the export carries it. A `vocab_dir`
    given as well must hold the checkpoint's tokens, in its order."""
    if not config.init_from:
        return config
    from common.tokenization import read_vocab
    from model.hf import find_starting_point
    from training.init_from import checkpoint_vocab_dir
    own = checkpoint_vocab_dir(find_starting_point(config.init_from))
    if own is None:
        return config
    if not config.vocab_dir:
        return replace(config, vocab_dir=own)
    if read_vocab(config.vocab_dir) != read_vocab(own):
        raise ValueError(f"--set vocab_dir={config.vocab_dir} holds other tokens than "
                         f"init_from={config.init_from}'s vocabulary ({own}/vocab.txt): the "
                         "checkpoint's embeddings are indexed by its own; leave vocab_dir out")
    return config


def preflight(config: PretrainConfig, dist: Dist,
              ckpt_dir: str) -> tuple[CheckpointState | None, list[bool], bool]:
    """The start-of-run checks, agreed by all ranks, before anything is written: the
    checkpoint to resume (and whether the config may resume it), each phase's validation set,
    and the inputs of every phase with steps left (earlier phases' shards may be gone), so
    that phase 2's mistakes cannot wait for phase 1. Returns the checkpoint, whether to
    validate each phase, and whether the resumed step owes its evaluation (killed between its
    checkpoint and its evaluation; then the resumed phase's inputs are checked too)."""
    resume = on_all_ranks(dist, lambda: read_latest(ckpt_dir),
                          agree="the checkpoint to resume from")
    if resume:
        on_all_ranks(dist, lambda: check_resume(config, ckpt_dir, resume))

    def has_validation_on_all_ranks(index: int) -> bool:
        phase = config.phases[index]
        return on_all_ranks(dist, functools.partial(has_validation, config, phase, dist),
                            agree=f"whether {phase.name} has validation shards")

    first = first_unfinished_phase(config, resume)
    validate = [index >= first and has_validation_on_all_ranks(index)
                for index in range(len(config.phases))]
    redo = False
    if resume is not None and validation_missing(config, resume, dist):
        if resume.phase_index < first:  # a finished phase that owes its last evaluation
            validate[resume.phase_index] = has_validation_on_all_ranks(resume.phase_index)
        redo = validate[resume.phase_index]
    checked_from = resume.phase_index if redo else first
    on_all_ranks(dist, lambda: check_phase_inputs(config, checked_from))
    if config.init_from:  # the shape and the shards' vocabulary against the checkpoint
        on_all_ranks(dist, lambda: [model_config(config, shard_manifest(phase))
                                    for phase in config.phases[checked_from:]])
    if config.export_hf:  # a casing contradiction must stop the run now, not at its export
        on_all_ranks(dist, lambda: export_do_lower_case(shard_manifest(config.phases[-1]),
                                                        config.vocab_dir))
    return resume, validate, redo


def first_unfinished_phase(config: PretrainConfig, resume: CheckpointState | None) -> int:
    """Index of the first phase with steps left (len(phases) when the run is complete)."""
    if resume is None:
        return 0
    if resume.phase_index < len(config.phases) and \
            resume.step < config.phases[resume.phase_index].steps:
        return resume.phase_index
    return min(resume.phase_index + 1, len(config.phases))


def check_resume(config: PretrainConfig, ckpt_dir: str, resume: CheckpointState) -> None:
    """Refuse to resume `resume` under a config or shard set that would change the training."""
    from training.loader import read_shard_manifest, shard_set_digest
    saved_path = os.path.join(ckpt_dir, resume.tag, "config.json")
    try:
        saved = cfg.load_saved(saved_path)
    except ValueError as e:  # e.g. bf16 at ZeRO stage 0, refused since this checkpoint was made
        raise ValueError(f"{saved_path}: this checkpoint's config is no longer accepted ({e}); "
                         "resume it with the version of this code that wrote it, or start a "
                         "new output_dir") from None
    conflicts = cfg.resume_conflicts(saved, config)
    if resume.train_shards and first_unfinished_phase(config, resume) == resume.phase_index:
        phase = config.phases[resume.phase_index]  # still to be trained on: same shards
        manifest = read_shard_manifest(phase.train_shards)
        if shard_set_digest(manifest, phase.train_shards) != resume.train_shards:
            conflicts.append(f"phases.{resume.phase_index}.train_shards: {phase.train_shards} "
                             "lists other shards (names, row counts or sha256) than the run's")
    if conflicts:
        raise ValueError(
            f"{ckpt_dir}/{resume.tag}: cannot resume, the config differs from the checkpoint's "
            "in fields that shape the training:\n  " + "\n  ".join(conflicts) +
            "\nPut them back, or start a new output_dir (free to change on resume: "
            f"{', '.join(cfg.RESUME_FREE_FIELDS)})")


def run_phase(config: PretrainConfig, index: int, phase: PhaseConfig, dist: Dist,
              metrics: MetricsLog, step_offset: int, resume: CheckpointState | None,
              previous_tag: str | None, budget: int | None,
              validate: bool, redo_validation: bool = False) -> tuple[str, int]:
    """Build, (resume,) train one phase; returns the last checkpoint tag and steps run.
    `redo_validation`: evaluate the resumed step first (its record was never written)."""
    ckpt_dir = os.path.join(config.output_dir, CHECKPOINTS)
    torch.manual_seed(config.seed + index)  # identical initial weights on every rank
    initial = None
    if resume is None and previous_tag is not None:
        initial = shared_consolidated_state_dict(ckpt_dir, previous_tag, dist)
    # The run's own checkpoint (resume) or previous phase wins over init_from: init_from is
    # where a new run starts, read only before its first checkpoint exists.
    from_init = bool(config.init_from) and resume is None and previous_tag is None
    model = build_model(config, shard_manifest(phase), initial, initial=from_init)
    if config.compile and dist.on_gpu:
        # the whole model as one graph where every batch has one shape, but not under ZeRO-3,
        # whose hooks gather each module's parameters inside the forward; else per layer
        from model.bert import compile_layers, compile_model
        if config.uses_static_shapes(dist.on_gpu) and config.compiles_whole_model(dist.on_gpu):
            compile_model(model)
        else:
            compile_layers(model.bert)
    universal = (resume is not None and resume.world_size != dist.world_size
                 and has_partitioned_state(ckpt_dir, resume.tag))
    if universal:
        to_universal(ckpt_dir, resume.tag, dist)
    engine = build_engine(config, phase, model, dist, load_universal=universal)
    torch.manual_seed(config.seed + 1000 * (index + 1) + dist.rank)  # dropout differs per rank
    loader = ShardLoader(build_loader(config, phase, dist))
    step = 0
    if resume is not None:
        step = load_checkpoint(engine, config, resume, loader, dist, universal)
        if redo_validation:
            summary = evaluate(engine, config, phase, dist)
            metrics.write(_record("validation", index, phase, step, step_offset, summary))
    stop_at = phase.steps if budget is None else min(phase.steps, step + budget)
    tag, reached = train_phase(engine, config, index, phase, loader, step, step_offset, metrics,
                               dist, stop_at, validate)
    engine.destroy()
    return tag or (resume.tag if resume else previous_tag), reached - step


def export(config: PretrainConfig, ckpt_dir: str, tag: str) -> str:
    """Consolidated fp32 weights of `tag` -> `<output_dir>/hf` (transformers folder)."""
    from model.hf import export_hf_folder

    manifest = shard_manifest(config.phases[-1])
    model = build_model(config, manifest, consolidated_state_dict(ckpt_dir, tag))
    out = os.path.join(config.output_dir, "hf")
    export_hf_folder(model, config.vocab_dir, out,
                     do_lower_case=export_do_lower_case(manifest, config.vocab_dir))
    log.info("exported %s to %s", tag, out)
    return out


def export_do_lower_case(manifest: dict, vocab_dir: str) -> bool:
    """Whether the exported tokenizer lower-cases: as the shards were made (make_shards records
    --do_lower_case), else as the vocabulary folder says. A cased model must not get a
    lower-casing tokenizer, whichever of the two knows it; if both know and disagree, refuse."""
    from model.hf import vocab_do_lower_case

    shards = manifest.get("options", {}).get("job", {}).get("do_lower_case")
    folder = (vocab_do_lower_case(vocab_dir)
              if storage.exists(storage.join(vocab_dir, "tokenizer_config.json")) else None)
    if shards is not None and folder is not None and shards != folder:
        raise ValueError(f"the shards were made with do_lower_case={shards} but {vocab_dir}/"
                         f"tokenizer_config.json says do_lower_case={folder}: export would give "
                         "the model a tokenizer other than the one its data had")
    return next((v for v in (shards, folder) if v is not None), True)


def build_parser() -> argparse.ArgumentParser:
    from common.settings import settings_help

    epilog = ("settings (--set KEY=VALUE or a --config file; defaults: the tiny preset's, "
              "training/config.py):\n" + "\n".join(settings_help(cfg.tiny())))
    parser = argparse.ArgumentParser(prog="bert-pretrain", description=__doc__.split("\n\n")[0],
                                     epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="tiny", choices=sorted(cfg.PRESETS),
                        help="starting configuration (training/config.py)")
    parser.add_argument("--config", help="YAML or JSON file of overrides")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. zero_stage=2 or phase1.steps=300")
    parser.add_argument("--stop_after_steps", type=int, default=None,
                        help="stop with a checkpoint after N optimizer steps of this invocation "
                             "(preemption drills); run again to resume")
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    logs.add_verbose_flag(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    """`bert-pretrain`: our checks' errors (a bad setting, a missing or mismatched input) print
    one line and exit 2; anything else, or BERT_DEBUG=1, keeps its traceback."""
    from common.errors import USER_ERRORS, debug_requested, is_user_error

    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(args.verbose)
    try:
        config = cfg.resolve(args.preset, args.config, args.set)
    except USER_ERRORS as e:
        if debug_requested() or not is_user_error(e):
            raise
        parser.error(str(e))
    from training.launch import exit_refused, refuse_cpu_fallback_in_rank, wait_for_launcher
    try:  # the launch scripts checked before starting the ranks; `torchrun` by hand did not
        refuse_cpu_fallback_in_rank(config.device)
    except ValueError as e:
        exit_refused(str(e))
    try:
        result = run(config, args.stop_after_steps)
    except USER_ERRORS as e:
        if debug_requested() or not is_user_error(e):
            raise
        if isinstance(e, OtherRankError):  # the failing rank reports it: one line in all
            wait_for_launcher()
        rank = os.environ.get("RANK", "0")
        print(f"bert-pretrain: error{f' (rank {rank})' if rank != '0' else ''}: {e}",
              file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    if int(os.environ.get("RANK", "0")) == 0:
        log.info("done: %s", result)


if __name__ == "__main__":
    main()
