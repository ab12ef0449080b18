"""The one fine-tuning loop over any task family (finetune/family.py).

The paper's recipe (section 4, appendix A.3): AdamW (weight decay 0.01 except biases and
LayerNorm, epsilon 1e-6, gradient clipping at 1.0 as the reference `optimization.py`), linear
warmup over 10% of the steps then linear decay to 0 (training/optim.py, shared with
pre-training), the learning rate picked on dev among a grid. Small tasks run every seed and
report the mean and spread at the chosen rate; larger tasks run the first seed only. bf16
autocast on a GPU by default.

    from finetune import loop
    from finetune.glue import FAMILY
    from finetune.options import FinetuneConfig
    prepared = FAMILY.prepare("rte", data_dir, tokenizer, 128, None, None, False)
    result = loop.finetune_task(FAMILY, encoder, prepared, FinetuneConfig())

A run whose loss turns NaN or infinite is recorded as diverged (`RunResult.status`) and the grid
goes on; the best rate is chosen among the finished runs. `finetune.invocation.run_tasks` keeps
every finished run in a `finetune.run_store.RunStore` and reuses it on a re-run with the same
settings.

A family's `Recipe` gives the recipe fields (`for_recipe`); everything else is the loop's
(finetune/options.py). Optional family capabilities, used when a family has them: `SizedTasks`
(which tasks are small) and `TestSets` (unlabelled test splits predicted for a leaderboard:
GLUE, SWAG) (finetune/capabilities.py). What it produces is in finetune/results.py.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from common import storage
from common.settings import SettingError
from finetune import baselines
from finetune.capabilities import TestSets, seeds_for
from finetune.family import Encoded, Family, Prepared, Scored, to_device
from finetune.options import FinetuneConfig, HeadInit, resolve_device, uses_bf16
from finetune.results import (
    RunRecord,
    RunResult,
    TaskResult,
    TestPredictions,
    select_best,
    summarise_task,
)
from model.bert import BertModel
from training.optim import LinearWarmupDecay, param_groups
from training.trackers import Trackers, open_trackers

if TYPE_CHECKING:
    from finetune.run_store import RunStore

log = logging.getLogger(__name__)


class Diverged(FloatingPointError):
    """A non-finite training loss: the step it came at and the loss."""

    def __init__(self, desc: str, loss: float, step: int):
        super().__init__(f"{desc}: loss {loss} at step {step}; lower the learning rate")
        self.loss, self.step = loss, step


# ---------------------------------------------------------------------------------------------
# Model, optimizer, schedule
# ---------------------------------------------------------------------------------------------

_SEEDING = threading.Lock()


def build_model(family: Family, encoder: BertModel, task: str, seed: int,
                device: torch.device | str = "cpu",
                head_init: HeadInit = "truncated_normal") -> nn.Module:
    """The family's task model over a copy of `encoder`'s weights on `device`; the new head
    initialised from `seed` on the CPU (the same head on any device) as `head_init` says
    (`LoopOptions.head_init`), the device's dropout stream seeded.

    Only this run's generators are seeded: `torch.manual_seed` would reseed every GPU, under
    runs that the flow trains on other GPUs from other threads at the same time.
    """
    device = torch.device(device)
    with _SEEDING:  # the CPU generator is the process's: one run seeds and draws at a time
        torch.random.default_generator.manual_seed(seed)
        model = family.build_head(encoder, task)
        if head_init == "normal":
            redraw_head_normal(model, encoder.config.initializer_range)
    if device.type == "cuda":
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)
    return model.to(device)


def redraw_head_normal(model: nn.Module, std: float) -> None:
    """The new head's weight matrices (every linear layer outside the pre-trained `bert`) drawn
    again from the untruncated N(0, std), as transformers initialises its task heads."""
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and not name.startswith("bert."):
                module.weight.normal_(0.0, std)


def build_optimizer(model: nn.Module, learning_rate: float,
                    cfg: FinetuneConfig) -> torch.optim.Optimizer:
    """AdamW over training/optim.py's groups (no decay on biases and LayerNorm)."""
    # fused: one kernel over all parameters (the default of transformers' Trainer as well).
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=learning_rate,
                             eps=cfg.adam_epsilon, fused=True)


def build_schedule(optimizer: torch.optim.Optimizer, learning_rate: float, total_steps: int,
                   cfg: FinetuneConfig) -> LinearWarmupDecay:
    """Linear warmup over `warmup_proportion` of the steps, then linear decay to 0."""
    return LinearWarmupDecay(optimizer, learning_rate,
                             math.ceil(total_steps * cfg.warmup_proportion), total_steps)


def num_training_steps(num_units: int, cfg: FinetuneConfig) -> int:
    return math.ceil(math.ceil(num_units / cfg.batch_size) * cfg.epochs)


def batch_indices(num_units: int, batch_size: int,
                  generator: torch.Generator | None = None) -> list[list[int]]:
    """Unit indices per batch: shuffled with `generator`, in order without one."""
    order = (torch.randperm(num_units, generator=generator).tolist() if generator is not None
             else list(range(num_units)))
    return [order[i:i + batch_size] for i in range(0, num_units, batch_size)]


# ---------------------------------------------------------------------------------------------
# Training and evaluation
# ---------------------------------------------------------------------------------------------

def _progress(total: int, desc: str, enabled: bool):
    from common.logs import progress

    return progress(total=total, desc=desc, disable=not enabled, leave=False, dynamic_ncols=True)


def _device(model: nn.Module) -> torch.device:
    return next(model.parameters()).device


CPU_ROW_LENGTH = 512
"""Packed rows' default length on the CPU (`LoopOptions.row_length`)."""


def row_length(cfg: FinetuneConfig, model: nn.Module) -> int:
    """Tokens per packed row for `model` where it is (`LoopOptions.row_length`). A task model
    keeps its encoder as `bert` (model/heads.py), whose positions bound a row."""
    if cfg.row_length is not None:
        return cfg.row_length
    if _device(model).type != "cpu":
        return cfg.max_seq_length
    longest = min(CPU_ROW_LENGTH, model.bert.config.max_position_embeddings)
    return max(cfg.max_seq_length, longest)


def train_step(family: Family, model: nn.Module, batch, optimizer: torch.optim.Optimizer,
               scheduler: LinearWarmupDecay, cfg: FinetuneConfig) -> Tensor:
    """One optimizer step on one batch (moved to the model's device); returns the loss, a 0-d
    tensor on that device (reading it would wait for the step)."""
    device = _device(model)
    batch = to_device(batch, device)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(cfg, device)):
        loss = family.loss(model, batch)
    loss.backward()
    if cfg.max_grad_norm > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


LOSS_READ_EVERY = 32
"""Steps between reads of the losses from the device. A read waits for the device to finish the
step, so reading every step would keep the host from queueing the next step's kernels while the
device runs this one's (on the CPU a read costs nothing)."""


def train(family: Family, model: nn.Module, encoded: Encoded, learning_rate: float, seed: int,
          cfg: FinetuneConfig, desc: str = "",
          epoch_batches: Callable[[int], list[list[int]]] | None = None) -> list[float]:
    """Fine-tune `model` in place with the recipe; returns the loss of every step.

    The data order: `epoch_batches(epoch)` gives each epoch's batches of unit indices; by
    default one generator seeded with `seed` shuffles anew every epoch.
    """
    total = num_training_steps(len(encoded), cfg)
    optimizer = build_optimizer(model, learning_rate, cfg)
    scheduler = build_schedule(optimizer, learning_rate, total, cfg)
    if epoch_batches is None:
        generator = torch.Generator().manual_seed(seed)

        def epoch_batches(epoch: int) -> list[list[int]]:
            return batch_indices(len(encoded), cfg.batch_size, generator)
    model.train()
    losses: list[float] = []
    pending: list[Tensor] = []  # losses still on the device

    def read_losses() -> None:
        values = torch.stack(pending).float().tolist()  # one wait for the lot
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise Diverged(desc or "fine-tuning", value, len(losses) + i + 1)
        losses.extend(values)
        pending.clear()
        bar.set_postfix(loss=f"{losses[-1]:.4f}", refresh=False)

    steps, epoch, rows = 0, 0, row_length(cfg, model)
    with _progress(total, desc, cfg.progress) as bar:
        while steps < total:
            batches, epoch = epoch_batches(epoch), epoch + 1
            for indices in batches:
                if steps == total:  # a fractional last epoch stops mid-way
                    break
                batch = family.make_batch(encoded, indices, cfg.max_seq_length, train=True,
                                          row_length=rows)
                pending.append(train_step(family, model, batch, optimizer, scheduler, cfg))
                steps += 1
                bar.update(1)
                if len(pending) == LOSS_READ_EVERY:
                    read_losses()
        if pending:
            read_losses()
    return losses


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach()
    if tensor.is_floating_point() and tensor.dtype != torch.float64:
        tensor = tensor.float()  # bf16 under autocast; numpy has no bfloat16
    return tensor.cpu().numpy()


@torch.inference_mode()
def predict(family: Family, model: nn.Module, encoded: Encoded,
            cfg: FinetuneConfig) -> dict[str, np.ndarray]:
    """The family's raw outputs of every unit of `encoded`, in unit order: name -> (N, ...)."""
    model.eval()
    device = _device(model)
    # Batches of similar length (sorted) waste the least; outputs do not depend on the order.
    order = np.argsort(encoded.lengths, kind="stable")
    rows = row_length(cfg, model)
    parts: dict[str, list[Tensor]] = {}  # on the device: one copy to the host at the end
    for start in range(0, len(order), cfg.eval_batch_size):
        indices = order[start:start + cfg.eval_batch_size].tolist()
        batch = to_device(family.make_batch(encoded, indices, cfg.max_seq_length, train=False,
                                            row_length=rows), device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=uses_bf16(cfg, device)):
            outputs = family.outputs(model, batch)
        for name, value in outputs.items():
            parts.setdefault(name, []).append(value)
    restore = np.empty_like(order)
    restore[order] = np.arange(len(order))  # position of unit i in the sorted order
    return {name: _numpy(torch.cat(values))[restore] for name, values in parts.items()}


def evaluate(family: Family, model: nn.Module, prepared: Prepared,
             cfg: FinetuneConfig) -> dict[str, Scored]:
    """Every dev split of the task scored by the family, by split name."""
    return {split: family.score(prepared, split, predict(family, model, encoded, cfg))
            for split, encoded in prepared.dev.items()}


def merge_scored(scored: Mapping[str, Scored]) -> tuple[dict[str, float], float, dict[str, str]]:
    """(metrics, score, files) of a run from its dev splits: the splits' metrics side by side
    (a family names them apart, MNLI "accuracy_m"/"accuracy_mm"), the mean of their scores, and
    their files (a name two splits both write is prefixed with the split). Splits that do not
    select (`Scored.selects`: a labelled test split) are reported, not averaged."""
    metrics: dict[str, float] = {}
    files: dict[str, str] = {}
    for split, one in scored.items():
        metrics.update(one.metrics)
        for name, text in one.files.items():
            files[f"{split}_{name}" if len(scored) > 1 and name in files else name] = text
    return metrics, statistics.fmean(s.score for s in scored.values() if s.selects), files


def constant_of(scored: Mapping[str, Scored]) -> str:
    """The dev splits' one constant prediction when every split that selects has one."""
    selecting = [s for s in scored.values() if s.selects]
    return selecting[0].constant if all(s.constant for s in selecting) else ""


def run_one(family: Family, encoder: BertModel, prepared: Prepared, learning_rate: float,
            seed: int, cfg: FinetuneConfig, trackers: Trackers | None = None
            ) -> tuple[RunResult, nn.Module]:
    """Fine-tune a fresh task model for one (rate, seed) and score it on dev; `trackers` get
    the loss of every step (`train/loss`) and the dev metrics (`dev/<name>`, at the last
    step)."""
    task = prepared.task
    model = build_model(family, encoder, task, seed, resolve_device(cfg.device), cfg.head_init)
    start = time.perf_counter()
    losses = train(family, model, prepared.train, learning_rate, seed, cfg,
                   desc=f"{task} lr={learning_rate:g} seed={seed}")
    trained = time.perf_counter()
    scored = evaluate(family, model, prepared, cfg)
    metrics, score, files = merge_scored(scored)
    tail = losses[-max(1, len(losses) // 10):]
    result = RunResult(task, learning_rate, seed, metrics, score, len(losses),
                       float(np.mean(tail)), trained - start, time.perf_counter() - trained,
                       files, baseline=baselines.merge({k: (s.baseline, s.selects)
                                                        for k, s in scored.items()}),
                       constant=constant_of(scored))
    log.info("%s lr=%g seed=%d: %s", task, learning_rate, seed,
             ", ".join(f"{k}={100 * v:.2f}" for k, v in metrics.items()))
    if result.constant:
        log.warning("%s lr=%g seed=%d: dev predictions are constant (%s): nothing learned",
                    task, learning_rate, seed, result.constant)
    if trackers:
        for step, loss in enumerate(losses, start=1):
            trackers.log_metrics({"train/loss": loss}, step)
        trackers.log_metrics({f"dev/{k}": v for k, v in metrics.items()}, len(losses))
    return result, model


def run_name(task: str, learning_rate: float, seed: int) -> str:
    """A run's name in the trackers, as its file in `<output>/runs/` starts."""
    return f"{task.lower()}-lr{learning_rate:g}-seed{seed}"


def tracked_run(family: Family, encoder: BertModel, prepared: Prepared, learning_rate: float,
                seed: int, cfg: FinetuneConfig, tracker_dir: str,
                name: str | None = None) -> tuple[RunResult, nn.Module]:
    """`run_one` as a run of its own in each tracker of `cfg.report_to` (files under
    `tracker_dir`, named `name` or `run_name`): the loop's config, its metrics, and its
    results.json and dev prediction files as artifacts."""
    name = name or run_name(prepared.task, learning_rate, seed)
    with open_trackers(cfg.report_to, tracker_dir, name, dataclasses.asdict(cfg),
                       tensorboard_subfolder=name) as trackers:
        result, model = run_one(family, encoder, prepared, learning_rate, seed, cfg, trackers)
        trackers.log_files({"results.json": storage.json_text(dataclasses.asdict(result)),
                            **result.files})
    return result, model


def has_test_sets(family: Family, prepared: Prepared) -> bool:
    return isinstance(family, TestSets) and bool(family.test_splits(prepared))


def predict_test_sets(family: Family, model: nn.Module, prepared: Prepared,
                      cfg: FinetuneConfig) -> tuple[TestPredictions, ...]:
    """Leaderboard predictions for every test split the family read (none for most)."""
    if not isinstance(family, TestSets):
        return ()
    return tuple(family.test_predictions(prepared, split, predict(family, model, encoded, cfg))
                 for split, encoded in family.test_splits(prepared).items())


# ---------------------------------------------------------------------------------------------
# The learning-rate x seed grid
# ---------------------------------------------------------------------------------------------

def finetune_task(family: Family, encoder: BertModel, prepared: Prepared,
                  cfg: FinetuneConfig, store: RunStore | None = None) -> TaskResult:
    """The learning-rate grid x seeds for one task; the rate with the best mean dev score wins,
    and its best seed's test-set predictions are the task's (`select_best`).

    A run whose loss diverges is recorded as diverged and the grid goes on; FloatingPointError
    when every run diverged. With a `store` (finetune/run_store.py), each run is kept there as
    it finishes and a run it holds is reused, not trained: a re-run after a crash trains only
    the runs missing.

    Test sets are predicted once a rate (all its seeds) is done and its best seed is the best
    run so far, and kept with that run: a rate not best then never becomes the overall best
    later (`select_best` keeps the first rate on ties), so the final best run always has its
    predictions, after at most one prediction per rate. The weights of the current rate's best
    seed are kept in memory until then; a reused run has none, and is trained again (the same
    seed gives the same run) only if its rate becomes the best.
    """
    limit = encoder.config.max_position_embeddings
    if cfg.row_length is not None and cfg.row_length > limit:
        raise SettingError("row_length", f"must be <= the model's max_position_embeddings "
                           f"{limit}, got {cfg.row_length}")
    seeds = seeds_for(family, prepared.task, cfg)
    predicts_test = has_test_sets(family, prepared)
    start = time.perf_counter()
    records: list[RunRecord] = []
    for learning_rate in cfg.learning_rates:
        best_index, best_weights = None, None  # the rate's best seed so far
        for last, seed in enumerate(seeds, start=1 - len(seeds)):
            record, model, trained = stored_run(family, encoder, prepared, learning_rate, seed,
                                                cfg, store)
            records.append(record)
            unsaved = {len(records) - 1} if trained else set()
            if predicts_test and record.result.finished and (
                    best_index is None or record.result.score > records[best_index].result.score):
                best_index, best_weights = len(records) - 1, None if model is None else \
                    {k: v.detach().clone() for k, v in model.state_dict().items()}
            del model
            finished = [r.result for r in records if r.result.finished]
            if last == 0 and best_index is not None and not records[best_index].predictions \
                    and select_best(finished).best_run is records[best_index].result:
                records[best_index] = with_test_predictions(family, encoder, prepared, cfg,
                                                            records[best_index], best_weights)
                unsaved.add(best_index)
            for index in sorted(unsaved) if store is not None else ():
                store.save(records[index], learning_rate, records[index].result.seed)
    runs = [record.result for record in records]
    if not any(run.finished for run in runs):
        raise FloatingPointError(
            f"{prepared.task}: every run diverged (learning rates "
            f"{', '.join(f'{lr:g}' for lr in cfg.learning_rates)}; seeds "
            f"{', '.join(map(str, seeds))}); lower the learning rates")
    best = select_best(runs).best_run
    predictions = next(record.predictions for record in records if record.result is best)
    return summarise_task(prepared.task, runs, prepared.num_train_examples,
                          dict(prepared.num_dev_examples), len(prepared.bad_records),
                          time.perf_counter() - start, predictions, prepared.bad_records,
                          family.name)


def with_test_predictions(family: Family, encoder: BertModel, prepared: Prepared,
                          cfg: FinetuneConfig, record: RunRecord,
                          weights: dict | None) -> RunRecord:
    """`record` with its run's test-set predictions: from its kept `weights`, or, for a run
    reused from the store, from the run trained again."""
    run = record.result
    if weights is None:
        log.info("%s lr=%g seed=%d: trained again to predict the test sets", prepared.task,
                 run.learning_rate, run.seed)
        _, model = run_one(family, encoder, prepared, run.learning_rate, run.seed, cfg)
    else:
        model = build_model(family, encoder, prepared.task, run.seed,
                            resolve_device(cfg.device), cfg.head_init)
        model.load_state_dict(weights)
    return RunRecord(run, predict_test_sets(family, model, prepared, cfg))


def stored_run(family: Family, encoder: BertModel, prepared: Prepared, learning_rate: float,
               seed: int, cfg: FinetuneConfig, store: RunStore | None
               ) -> tuple[RunRecord, nn.Module | None, bool]:
    """The run of (`learning_rate`, `seed`) from `store` when it holds it (no model), else
    trained by `finish_run` (with its model; None if it diverged), for the caller to keep;
    and whether it was trained here."""
    if store is not None:
        record = store.load(learning_rate, seed)
        if record is not None:
            log.info("%s lr=%g seed=%d: reused (%s) from %s", prepared.task, learning_rate,
                     seed, record.result.status, store.path(learning_rate, seed))
            return record, None, False
    tracker_dir = os.path.dirname(store.folder) if store is not None else "."
    return (*finish_run(family, encoder, prepared, learning_rate, seed, cfg, tracker_dir), True)


def finish_run(family: Family, encoder: BertModel, prepared: Prepared, learning_rate: float,
               seed: int, cfg: FinetuneConfig, tracker_dir: str = "."
               ) -> tuple[RunRecord, nn.Module | None]:
    """One (rate, seed) run to its end: trained and scored on dev, with its model; a loss that
    diverges ends it as a diverged record (no model). The trackers of `cfg.report_to` keep
    their files under `tracker_dir` (`tracked_run`)."""
    start = time.perf_counter()
    try:
        result, model = tracked_run(family, encoder, prepared, learning_rate, seed, cfg,
                                    tracker_dir)
    except Diverged as error:
        log.warning("%s: the run is recorded as diverged", error)
        return RunRecord(RunResult(prepared.task, learning_rate, seed, {}, math.nan, error.step,
                                   error.loss, time.perf_counter() - start, 0.0,
                                   status="diverged")), None
    return RunRecord(result), model
