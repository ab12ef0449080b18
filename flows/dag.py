"""The DAG's data stages, described once: the `pretrain-bert` flow runs this list
(flows/pretrain_bert.py) and `bert-dag --plan` looks it up (flows/plan.py), so the two cannot
disagree on which stages a config has or how each is keyed.

A stage is a library call of flows/steps.py that computes its key from the config and the
stages it is handed, and reuses or builds its content-addressed folder (flows/stages.py).
`DATA_STAGES` says, in order, whether a config has each stage, what it reads (the outputs of the
stages above it) and under which output its result goes. `walk` runs the list: the flow hands
it Prefect's submit, the plan the plain call within `stages.looking_up()`, which finds each
folder by the key a run computes and builds nothing. A new data stage is one entry here and its
function in flows/steps.py.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from common import storage
from flows import steps
from flows.config import DagConfig
from flows.stages import StageResult, is_looking_up, looking_up


def _always(cfg: DagConfig) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of the DAG's data part, as the flow runs it and the plan looks it up."""
    name: str
    """Its Prefect task's name (`build-corpus`)."""
    output: str
    """What the stages below read its result as (`corpus`). A stage of an output made above
    takes its place (`decontaminate`'s corpus is the one the vocabulary and shards read)."""
    run: Callable[..., StageResult | None]
    """The library call, `run(cfg, *inputs)` with the item last where `each` fans it out; it
    returns None where the config gives it nothing to do (an input set to "")."""
    inputs: tuple[str, ...] = ()
    """The outputs it reads, handed to `run` in this order."""
    each: Callable[[DagConfig], Sequence[Any]] | None = None
    """Fan-out: one run per item (a source, a phase), all started together."""
    many: bool = False
    """Its output is a list that each stage of that output extends (the corpus's sources)."""
    when: Callable[[DagConfig], bool] = _always
    """Whether a run of the config has the stage; a stage whose inputs were not made is left
    out too (no audit, no decontamination)."""
    first: bool = False
    """Run before every other stage, so that its failure (a wrong checkpoint) comes before
    the data stages' hours."""
    retries: bool = True
    """Whether the flow retries it (a Beam job's transient I/O); not where a retry fails the
    same way."""

    def __post_init__(self):
        if self.each is not None and not self.many:
            raise ValueError(f"stage {self.name}: a fan-out stage's output is a list (many=True)")


def _continues(cfg: DagConfig) -> bool:
    return bool(cfg.pretrain.model.init_from)


def _trains_vocab(cfg: DagConfig) -> bool:
    return not cfg.pretrain.model.init_from


def _audits(cfg: DagConfig) -> bool:
    return cfg.data.audit and bool(cfg.finetune.data) and bool(steps.audited_tasks(cfg))


def _decontaminates(cfg: DagConfig) -> bool:
    return cfg.data.decontaminate


def _own_sources(cfg: DagConfig) -> list:
    return [source for source in cfg.data.all_sources() if source.generic]


def _phases(cfg: DagConfig) -> tuple[int, ...]:
    return (1, 2)  # phase N trains on shards N (flows/config.py ShardPhases)


def checkpoint_vocab(cfg: DagConfig) -> StageResult:
    """The vocab stage of continued pre-training: the checkpoint's own vocabulary (its
    embeddings are indexed by it). A plan does not download a remote checkpoint to hash it: its
    vocab stage, and the shards it keys, are then not found."""
    from flows.checkpoint_vocab import checkpoint_vocab as copy_vocab

    init_from = cfg.pretrain.model.init_from
    if is_looking_up() and storage.is_remote(init_from):
        return StageResult("vocab", storage.join(cfg.output, "vocab-?"), "not read",
                           cached=False, seconds=0.0)
    return copy_vocab(cfg.output, init_from)


DATA_STAGES: tuple[Stage, ...] = (
    Stage("extract-wikipedia", "sources", steps.extract_wikipedia, many=True),
    Stage("extract-books", "sources", steps.extract_books, many=True),
    Stage("extract-documents", "sources", steps.extract_documents, each=_own_sources,
          many=True),
    Stage("build-corpus", "corpus", steps.build_corpus, inputs=("sources",)),
    Stage("audit-contamination", "audit", steps.audit_contamination, inputs=("corpus",),
          when=_audits),
    Stage("decontaminate", "corpus", steps.decontaminate, inputs=("corpus", "audit"),
          when=_decontaminates),
    Stage("checkpoint-vocab", "vocab", checkpoint_vocab, when=_continues, first=True,
          retries=False),
    Stage("train-vocab", "vocab", steps.train_vocab, inputs=("corpus",), when=_trains_vocab),
    Stage("make-shards", "shards", steps.make_shards, inputs=("corpus", "vocab"), each=_phases,
          many=True),
)
"""The data stages in the DAG's order (a `data_only` run stops after them)."""


class Pending(Protocol):
    """A started stage run: Prefect's future, or the plan's finished call."""

    def result(self) -> StageResult | None: ...


Submit = Callable[[Stage, tuple], Pending]
"""Starts one run of a stage with its arguments (`cfg, *inputs[, item]`)."""

Made = dict[str, StageResult | list[StageResult] | None]
"""Each output's result (a list for a `many` output; None where no stage made it), in the
order the description first names the outputs."""


def walk(cfg: DagConfig, stages: Sequence[Stage], submit: Submit) -> Made:
    """Run `stages` for `cfg` through `submit`. Stages of one list output that follow each
    other run together (the extractions, each phase's shards); any other stage starts once
    those above it have ended, so a failure stops the walk before the next stage."""
    made: Made = {stage.output: None for stage in stages}
    made.update({stage.output: [] for stage in stages if stage.many})
    pending: list[tuple[Stage, list[Pending]]] = []
    previous = None
    for stage in [*(s for s in stages if s.first), *(s for s in stages if not s.first)]:
        if not (previous and previous.many and stage.many and previous.output == stage.output):
            _settle(pending, made)
        previous = stage
        if not stage.when(cfg) or any(made[name] is None for name in stage.inputs):
            continue
        args = (cfg, *(made[name] for name in stage.inputs))
        items = [(item,) for item in stage.each(cfg)] if stage.each else [()]
        pending.append((stage, [submit(stage, (*args, *item)) for item in items]))
    _settle(pending, made)
    return made


def _settle(pending: list[tuple[Stage, list[Pending]]], made: Made) -> None:
    """Wait for the started runs and file their results under their outputs."""
    for stage, runs in pending:
        results = [result for result in (run.result() for run in runs) if result is not None]
        if stage.many:
            made[stage.output] = [*made[stage.output], *results]
        elif results:
            made[stage.output] = results[0]
    pending.clear()


def stage_list(made: Made) -> list[StageResult]:
    """Every stage result, output by output: the report's data rows."""
    return [result for value in made.values() if value is not None
            for result in (value if isinstance(value, list) else [value])]


@dataclasses.dataclass(frozen=True)
class _Done:
    value: StageResult | None

    def result(self) -> StageResult | None:
        return self.value


def _call(stage: Stage, args: tuple) -> Pending:
    return _Done(stage.run(*args))


@dataclasses.dataclass(frozen=True)
class DataStages:
    """The data stages a run of a config uses, as `DATA_STAGES` gives them."""
    sources: list[StageResult]
    corpus: StageResult
    """The corpus the vocabulary and shards read: the decontaminated one where the flow makes it."""
    vocab: StageResult
    shards: list[StageResult]
    found: tuple[StageResult, ...] = ()
    """Every stage of the run (the audit too), in the report's order."""


def look_up_data_stages(cfg: DagConfig, stages: Sequence[Stage] | None = None) -> DataStages:
    """The folders the flow's data stages would use, built or not (`cached`), found by their
    keys (`stages.looking_up`): nothing runs; the inputs' names, sizes and times are read, and
    the manifests. `stages`: `DATA_STAGES`, the flow's."""
    with looking_up():
        made = walk(cfg, DATA_STAGES if stages is None else stages, _call)
    return DataStages(made["sources"], made["corpus"], made["vocab"], made["shards"],
                      tuple(stage_list(made)))
