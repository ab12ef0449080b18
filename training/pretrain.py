"""BERT pre-training with DeepSpeed: `bert-pretrain` / `python -m training.pretrain`.

    bert-pretrain --preset tiny --set data.vocab_dir=VOCAB --set phase1.train_shards=SHARDS_128 \
        --set phase2.train_shards=SHARDS_512 --set output_dir=runs/tiny
    torchrun --nproc_per_node 2 -m training.pretrain ...        # N ranks on one node
    deepspeed --hostfile hosts --module training.pretrain ...   # several nodes

What it trains is the objective (`--set objective.name=mlm_nsp|mlm|ltr|module:attribute`,
training/objectives.py): its model, loss and metric keys. The run's parts live beside this file:
training/preflight.py (the start-of-run checks), training/metrics.py (metric sums, summaries,
metrics.jsonl, loss_curve.png), training/checkpoint.py, and training/launch.py (the flags, the
process setup and the launch commands; it never imports this module).

The run is its phases in order (phase 2 starts from phase 1's final weights with its own data,
batch, optimizer and schedule). Steps: `build_model` -> `build_engine` (deepspeed.initialize) ->
`train_step` x steps (with `evaluate` and `save_checkpoint`) -> `export`. Started again with the
same `output_dir`, it resumes from `checkpoints/latest`: weights, optimizer, scheduler, RNG and
the loader's position, so a run killed with `kill -9` continues as if never stopped. Resuming
with a config that differs in a field that shapes the training (`config.resume_conflicts`) or
on another shard set (names, row counts and sha256 of the manifest) is refused, naming them.

Continued pre-training (`--set model.init_from=<BERT folder>`, training/init_from.py): the
checkpoint gives the model's shape, its weights (loaded before `deepspeed.initialize`, so ZeRO-3
partitions them) and, unless `data.vocab_dir` is set to the same tokens, the vocabulary the shards
must have been made with. Only a run's first phase starts there, and only while the run has no
checkpoint of its own: a restarted run resumes from `checkpoints/latest`, reading `init_from` for
the shape.

Output folder: `config.json` (resolved config), `metrics.jsonl`, `tensorboard/`,
`loss_curve.png`, `checkpoints/<tag>/` (DeepSpeed files + `training_state.json` + per-rank
`rng_rank*.pt` + `config.json`), `checkpoints/latest`, `hf/` (consolidated fp32 export), and
with `cadence.probe_every` N `probes/step-NNNNNNN/hf` (the same export every N global steps,
after that step's checkpoint: training/probes.py).

Checkpoints (training/checkpoint.py) are written to `checkpoints/.tmp-<tag>`, renamed to `<tag>`
when every rank is done, and only then is `latest` replaced (atomically); the oldest beyond
`cadence.keep_checkpoints` are deleted. Every checkpoint file is checked before DeepSpeed or torch
reads it (loadable with weights_only=True, and as its checksums.json records): a planted pickle is
refused in one line naming it, and runs no code.

Resuming on a different number of ranks: when the optimizer state is partitioned by rank
(engine.zero_stage >= 1, which bf16 and fp16 require) the checkpoint is converted once with
DeepSpeed's `ds_to_universal` (`python -m deepspeed.checkpoint.ds_to_universal --input_folder <tag>
--output_folder <tag>-universal`, done here automatically on rank 0) and loaded with `"checkpoint":
{"load_universal": true}`; the loader then skips the same share of the epoch (not the exact same
rows). With fp32 at zero_stage 0 the model-states file holds everything and loads as it is.

Validation: checked for every phase with steps left before the run's first step (`preflight`:
held-out rows for at least one micro-batch per rank, else a clear error: better to fail in
seconds than at the first evaluation hours in); a checkpoint due at a step is written before that
step's evaluation.
"""
from __future__ import annotations

import atexit
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

from common import extras

with extras.needed_by("bert-pretrain"):  # without the train extra: one line, not a traceback
    import torch
    from torch import Tensor

from common import logs
from common.errors import disk_full
from training import config as cfg
from training import objectives
from training.batching import static_shapes_for
from training.checkpoint import (
    CHECKPOINTS,
    CheckpointState,
    consolidated_state_dict,
    has_partitioned_state,
    load_checkpoint,
    phase_index_of,
    remove_stale_files,
    rng_untouched,
    save_checkpoint,
    shared_consolidated_state_dict,
    to_universal,
)
from training.config import PhaseConfig, PretrainConfig
from training.launch import build_parser
from training.loader import LoaderConfig, ShardLoader, validation_batches
from training.metrics import (
    METRIC_KEYS,
    MetricsLog,
    all_reduce,
    metric_keys,
    metric_sums,
    read_metrics,
    record,
    summarize,
)
from training.objectives import Objective
from training.preflight import (
    bf16_hardware,
    check_phase_inputs,
    check_resume,
    export_do_lower_case,
    is_evaluation_step,
    model_config,
    preflight,
    shard_manifest,
    with_checkpoint_vocab,
)
from training.probes import is_probe_step, write_probe_export
from training.ranks import Dist, OtherRankError, on_all_ranks
from training.remasking import MaskSchedule, Remasker

__all__ = ["METRIC_KEYS", "ShardLoader", "build_parser", "check_phase_inputs", "check_resume",
           "export_do_lower_case", "main", "metric_sums", "model_config", "read_metrics", "run",
           "with_checkpoint_vocab"]  # the names the tests and tools read here

log = logging.getLogger("training.pretrain")


# ---------------------------------------------------------------- setup

def enable_tf32() -> None:
    """fp32 matrix products and convolutions on tensor cores (TF32, 10-bit mantissa inputs,
    fp32 accumulation): what fp32 work remains on a GPU (an fp32 run, LAMB, the fp32 loss and
    softmax) runs at tensor-core speed, 8x an A100's fp32 rate, at the precision NVIDIA's BERT
    recipes train with."""
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True


def init_distributed() -> Dist:
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    from training.launch import init_process_env, init_process_group
    init_process_env()
    init_process_group(get_accelerator().communication_backend_name())
    atexit.unregister(destroy_gloo_group)  # one hook however many runs a process makes
    atexit.register(destroy_gloo_group)
    with logs.quiet_output():  # DeepSpeed prints each op it builds
        deepspeed.init_distributed()  # gloo on the CPU accelerator, nccl on GPUs
    on_gpu = get_accelerator().device_name() == "cuda"
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        enable_tf32()
    return Dist(torch.distributed.get_rank(), torch.distributed.get_world_size(), on_gpu)


def destroy_gloo_group() -> None:
    """Destroy a gloo process group while the interpreter is still whole (an atexit hook): the
    group's worker threads left to finalization can abort the exit (SIGABRT, "terminate called
    without an active exception"), turning `bert-pretrain`'s exit 2 after a one-line error into
    -6. NCCL's groups are left to their own shutdown: their destroy waits on the other ranks,
    which may be gone after a failure."""
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "gloo":
        torch.distributed.destroy_process_group()


def build_model(config: PretrainConfig, manifest: dict, state_dict: dict | None = None,
                initial: bool = False, phase: PhaseConfig | None = None):
    """The objective's model (`objectives.for_shards`: BERT's `model.heads.BertForPreTraining`,
    with the NSP head where the shards have NSP labels and the run trains NSP) on the preset
    with the run's shape, sized to the shards' vocabulary, or on `init_from`'s shape
    (training/init_from.py). `state_dict`: a previous phase's (or a checkpoint's) weights;
    `initial`: start from `init_from`'s weights instead."""
    objective = objectives.for_shards(config.objective.name, config.objective.next_sentence,
                                      manifest)
    model = objective.build_model(model_config(config, manifest, phase))
    if initial:
        from model.hf import find_starting_point
        from training.init_from import load_starting_weights
        load_starting_weights(model, find_starting_point(config.model.init_from))
    if state_dict is not None:
        missing, unexpected = model.load_state_dict(state_dict, strict=False)
        missing = [k for k in missing if k != "mlm.decoder.weight"]  # tied to the embeddings
        if missing or unexpected:
            raise ValueError(f"previous phase's weights: missing {missing}, unexpected {unexpected}")
    return model


def build_engine(config: PretrainConfig, phase: PhaseConfig, model, dist: Dist,
                 load_universal: bool = False):
    """`deepspeed.initialize` with the phase's DeepSpeed config; returns the engine."""
    import deepspeed

    from training.ds_config import build_ds_config, lr_scheduler
    from training.optim import param_groups

    ds_config = build_ds_config(config, phase, dist.world_size, dist.on_gpu, load_universal)
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=param_groups(model, config.optimizer.weight_decay),
        config=ds_config,
        lr_scheduler=lr_scheduler(phase, config.optimizer.schedule, config.optimizer.decay_shape))
    return engine


def mask_schedule(config: PretrainConfig, phase: PhaseConfig, dist: Dist) -> MaskSchedule | None:
    """Dynamic masking's share over the phase's steps (`data.dynamic_masked_lm_prob_end`), or
    None for a fixed share."""
    data = config.data
    if not (data.dynamic_masking and data.dynamic_masked_lm_prob_end):
        return None
    return MaskSchedule(data.dynamic_masked_lm_prob, data.dynamic_masked_lm_prob_end,
                        phase.steps, phase.gradient_accumulation_steps(dist.world_size))


def build_loader(config: PretrainConfig, phase: PhaseConfig, dist: Dist,
                 validation: bool = False) -> LoaderConfig:
    remasker, data = None, config.data
    if data.dynamic_masking and not validation:
        from common.masking import MaskingConfig
        share = data.dynamic_masked_lm_prob
        cap = int(shard_manifest(phase).get("max_predictions_per_seq") or 0) \
            if share else MaskingConfig.max_predictions_per_seq  # unused
        if not cap:
            raise ValueError(f"--set data.dynamic_masked_lm_prob={share}: the manifest of "
                             f"{phase.train_shards} records no max_predictions_per_seq to cap it")
        remasker = Remasker.from_vocab(data.vocab_dir, config.seed, data.masking(cap),
                                       recount=bool(share))
    return LoaderConfig(
        mask_schedule=mask_schedule(config, phase, dist) if not validation else None,
        source=(phase.validation_shards or phase.train_shards) if validation else phase.train_shards,
        batch_size=phase.micro_batch_size, max_seq_length=phase.max_seq_length, rank=dist.rank,
        world_size=dist.world_size, num_workers=0 if validation else data.num_workers,
        seed=config.seed, shuffle_buffer=data.shuffle_buffer,
        split="validation" if validation else "train", remasker=remasker,
        pin_memory=dist.on_gpu and not validation, attention_plan=not dist.on_gpu,
        static_shapes=static_shapes_for(shard_manifest(phase), phase.max_seq_length)
        if config.engine.uses_static_shapes(dist.on_gpu) else None)


# ---------------------------------------------------------------- steps

def batch_warmup_rows(phase: PhaseConfig, dist: Dist) -> list[int] | None:
    """The global batch of each of the phase's steps under its batch warmup, else None."""
    if not phase.batch_warmup_rows:
        return None
    from training.optim import BatchWarmup
    granule = phase.micro_batch_size * dist.world_size
    if phase.batch_warmup_rows % granule:
        raise ValueError(f"{phase.name}.batch_warmup_rows={phase.batch_warmup_rows} is not a "
                         f"multiple of micro_batch_size x ranks = {granule}")
    return BatchWarmup(phase.batch_warmup_rows, phase.global_batch_size,
                       phase.batch_warmup_tokens, phase.max_seq_length, granule).rows(phase.steps)


def train_step(engine, batches: Iterator[dict], keys: tuple[str, ...] = METRIC_KEYS,
               rows: int | None = None) -> Tensor:
    """One optimizer step: gradient_accumulation_steps micro-batches of forward + backward.
    Returns the step's summed metrics (`metric_sums` of `keys`) on the device, not yet read.
    `rows`: this step's global batch (a batch warmup): its accumulation steps, each boundary
    marked, as DeepSpeed's own count of micro-steps assumes one batch size throughout."""
    sums = torch.zeros(len(keys), dtype=torch.float64, device=engine.device)
    if rows is not None:
        engine.set_train_batch_size(rows)
    accumulation = engine.gradient_accumulation_steps()
    for micro in range(accumulation):
        if rows is not None:
            engine.set_gradient_accumulation_boundary(micro == accumulation - 1)
        batch = to_device(next(batches), engine.device)
        out = engine(**batch)
        engine.backward(out.loss)
        engine.step()
        sums += metric_sums(out, batch, keys)
    return sums


def to_device(batch: dict[str, Tensor], device) -> dict[str, Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def evaluate(engine, config: PretrainConfig, phase: PhaseConfig, dist: Dist,
             objective: Objective) -> dict[str, float]:
    """Validation loss and accuracies over `eval_batches` micro-batches per rank."""
    engine.eval()
    keys = metric_keys(objective.metric_keys)
    sums = torch.zeros(len(keys), dtype=torch.float64, device=engine.device)
    for batch in validation_batches(build_loader(config, phase, dist, validation=True),
                                    config.cadence.eval_batches):
        batch = to_device(batch, engine.device)
        sums += metric_sums(engine(**batch), batch, keys)
    engine.train()
    return summarize(all_reduce(sums, keys), None, objective.heads)


# ---------------------------------------------------------------- the run

@dataclass
class PhaseRun:
    """One phase as it trains: what it trains on, set when the phase starts, and where it
    stands (`step`, `tag`), which `train_phase` advances."""

    index: int
    """The phase's place in `config.phases`."""
    phase: PhaseConfig
    objective: Objective
    loader: ShardLoader
    step_offset: int
    """Steps of the phases before this one: `step_offset + step` is the run's global step."""
    stop_at: int
    """The step this call stops at (<= phase.steps; fewer under `stop_after_steps`)."""
    validate: bool
    """Whether the phase has held-out rows to evaluate on (`preflight`)."""
    step: int = 0
    """Optimizer steps of this phase done so far (a resumed phase starts at its checkpoint's)."""
    tag: str | None = None
    """The last checkpoint this phase wrote, None until it writes one."""

    @property
    def global_step(self) -> int:
        return self.step_offset + self.step

    def record(self, split: str, summary: dict) -> dict:
        """The metrics.jsonl line of `summary` at the current step."""
        return record(split, self.index, self.phase, self.step, self.step_offset, summary)


def train_phase(engine, config: PretrainConfig, state: PhaseRun, metrics: MetricsLog,
                dist: Dist) -> None:
    """Steps `state.step`..`state.stop_at` of one phase, advancing `state.step` and `state.tag`.
    Stopping early (`stop_at` < phase.steps) saves a checkpoint. A step's checkpoint is
    written before its evaluation, so a failing evaluation loses no training."""
    phase, objective, loader = state.phase, state.objective, state.loader
    keys, head = metric_keys(objective.metric_keys), objective.heads[0]
    batches = iter(loader)
    window, started = 0, time.perf_counter()
    bar = logs.progress(total=phase.steps, initial=state.step, desc=phase.name,
                        disable=not dist.is_main, dynamic_ncols=True)
    rows = batch_warmup_rows(phase, dist)
    while state.step < state.stop_at:
        window = window + train_step(engine, batches, keys, rows[state.step] if rows else None)
        state.step += 1
        step = state.step
        bar.update(1)
        if step % config.cadence.log_every == 0 or step == phase.steps:
            summary = summarize(all_reduce(window, keys), time.perf_counter() - started,
                                objective.heads)
            summary["lr"] = float(engine.get_lr()[0])  # of the next step
            if rows:  # the global batch step `step` trained on
                summary["batch_rows"] = rows[step - 1]
            if loader.config.mask_schedule is not None:  # the share step `step` trained at
                summary["mask_rate"] = loader.config.mask_schedule.rate(step - 1)
            summary.update(data_epoch=loader.epoch, rows_cut=loader.rows_cut)
            metrics.write(state.record("train", summary))
            bar.set_postfix({"loss": f"{summary['loss']:.3f}",
                             f"{head}_acc": f"{summary[f'{head}_accuracy']:.3f}"})
            window, started = 0, time.perf_counter()
        probe = is_probe_step(config.cadence.probe_every, state.global_step)
        if ((config.cadence.checkpoint_every and step % config.cadence.checkpoint_every == 0)
                or step in (phase.steps, state.stop_at) or probe):
            state.tag = save_checkpoint(engine, config, state.index, phase, step, loader, dist)
        if probe:
            probe_export(config, state.tag, state.global_step, dist)
        if state.validate and is_evaluation_step(config, phase, step):
            summary = evaluate(engine, config, phase, dist, objective)
            metrics.write(state.record("validation", summary))
    bar.close()


def run(config: PretrainConfig, stop_after_steps: int | None = None) -> dict:
    """Train every phase (resuming from `output_dir` if it holds checkpoints); export at the end.

    `stop_after_steps`: stop (with a checkpoint) after that many optimizer steps of this call,
    as a preemption would; running again resumes. Returns the last checkpoint tag, the export
    folder (None if stopped early) and whether the run is complete."""
    dist = init_distributed()
    if config.engine.precision == "auto":
        precision = config.concrete_precision(bf16_hardware(dist.on_gpu))
        config = replace(config, engine=replace(config.engine, precision=precision))
        if dist.is_main:
            log.info("engine.precision=auto: training in %s on this hardware", precision)
    config = on_all_ranks(dist, lambda: with_checkpoint_vocab(config))
    if config.cadence.export_hf and not config.data.vocab_dir:
        raise ValueError("--set data.vocab_dir=...: needed to export the Hugging Face folder "
                         "(or --set cadence.export_hf=false)")
    if config.cadence.probe_every and not config.data.vocab_dir:
        raise ValueError("--set data.vocab_dir=...: needed for the probe exports (or --set "
                         "cadence.probe_every=0)")
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
                         (resume.phase_index, resume.step) if resume else None, config)
    last_tag = resume.tag if resume else None
    try:
        last_tag, complete = run_phases(config, dist, metrics, resume, last_tag,
                                        stop_after_steps, validate, redo)
    except BaseException:
        metrics.close(failed=True)  # the tracker runs end FAILED, not RUNNING
        raise
    metrics.close(loss_curve=complete)
    export_dir = None
    if dist.is_main and complete and config.cadence.export_hf:
        export_dir = export(config, ckpt_dir, last_tag)
    torch.distributed.barrier()
    return {"last_checkpoint": last_tag, "export_dir": export_dir, "complete": complete}


def run_phases(config: PretrainConfig, dist: Dist, metrics: MetricsLog,
               resume: CheckpointState | None, last_tag: str | None,
               stop_after_steps: int | None, validate: list[bool], redo: bool
               ) -> tuple[str | None, bool]:
    """Every phase not done yet, in order; (the last checkpoint tag, whether all are done)."""
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
    return last_tag, complete


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
    from_init = bool(config.model.init_from) and resume is None and previous_tag is None
    manifest = shard_manifest(phase)
    objective = objectives.for_shards(config.objective.name, config.objective.next_sentence,
                                      manifest)
    model = build_model(config, manifest, initial, initial=from_init, phase=phase)
    if config.engine.compile and dist.on_gpu:
        # the whole model as one graph where every batch has one shape, but not under ZeRO-3,
        # whose hooks gather each module's parameters inside the forward; else per layer
        from model.compiling import compile_layers, compile_model
        if config.engine.compiles_whole_model(dist.on_gpu) and \
                config.engine.uses_static_shapes(dist.on_gpu):
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
    start = 0
    if resume is not None:
        start = load_checkpoint(engine, config, resume, loader, dist, universal)
    state = PhaseRun(index, phase, objective, loader, step_offset,
                     stop_at=phase.steps if budget is None else min(phase.steps, start + budget),
                     validate=validate, step=start)
    if resume is not None:
        # killed between the checkpoint and its probe export: write the export first
        if is_probe_step(config.cadence.probe_every, state.global_step):
            probe_export(config, resume.tag, state.global_step, dist)
        if redo_validation:
            metrics.write(state.record("validation",
                                       evaluate(engine, config, phase, dist, objective)))
    train_phase(engine, config, state, metrics, dist)
    engine.destroy()
    return state.tag or (resume.tag if resume else previous_tag), state.step - start


def probe_export(config: PretrainConfig, tag: str, global_step: int, dist: Dist) -> None:
    """The export of `tag` for the flow's probes (training/probes.py), on rank 0. A full disk
    stops every rank (the next checkpoint could not be written either); any other failure is
    logged and training goes on: probes are a view of the run, and the watcher skips the step."""
    ckpt_dir = os.path.join(config.output_dir, CHECKPOINTS)

    def write() -> None:
        try:
            write_probe_export(config.output_dir, global_step, tag,
                               lambda out: export(config, ckpt_dir, tag, out))
        except Exception as error:  # noqa: BLE001 (whatever broke the export, training goes on)
            full = disk_full(error)  # ours, or ENOSPC wrapped in a library's own error
            if full is not None:
                raise full from None
            log.warning("probe export of step %d failed, training goes on without it: %s: %s",
                        global_step, type(error).__name__, error)

    on_all_ranks(dist, lambda: dist.is_main and write())


def export(config: PretrainConfig, ckpt_dir: str, tag: str, out: str | None = None) -> str:
    """Consolidated fp32 weights of `tag` -> `out` (default `<output_dir>/hf`), a
    transformers folder. It draws nothing from the run's random streams (a probe export runs
    between two training steps)."""
    from model.hf import export_hf_folder

    phase = config.phases[phase_index_of(tag)]  # its RoPE base is the export's
    manifest = shard_manifest(config.phases[-1])
    with rng_untouched():  # building the model initialises its weights from the global RNG
        model = build_model(config, manifest, consolidated_state_dict(ckpt_dir, tag),
                            phase=phase)
        final, out = out is None, out or os.path.join(config.output_dir, "hf")
        export_hf_folder(model, config.data.vocab_dir, out,
                         do_lower_case=export_do_lower_case(manifest, config.data.vocab_dir))
    # a probe export's own line (training/probes.py) names its folder once it is in place
    log.log(logging.INFO if final else logging.DEBUG, "exported %s to %s", tag, out)
    return out


@extras.reports_missing("bert-pretrain")
def main(argv: list[str] | None = None) -> None:
    """`bert-pretrain`: our checks' errors (a bad setting, a missing or mismatched input) print
    one line and exit 2; anything else, or BERT_DEBUG=1, keeps its traceback."""
    from common.errors import USER_ERRORS, debug_requested, exit_with_error, is_user_error

    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(args.verbose)
    try:
        config = cfg.resolve(args.preset, args.config, args.set)
    except USER_ERRORS as e:
        if debug_requested() or not is_user_error(e):
            raise
        exit_with_error(parser.prog, str(e))
    if args.plan:
        from training.launch import plan
        plan(config, args, parser)
    from training.launch import exit_refused, refuse_cpu_fallback_in_rank, wait_for_launcher
    try:  # the launch scripts checked before starting the ranks; `torchrun` by hand did not
        refuse_cpu_fallback_in_rank(config.engine.device)
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
