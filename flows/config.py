"""The DAG's configuration, composed of the stages' own configs; presets `tiny`, `base`, `large`.

Each section is the config dataclass of the stage that uses it, so a field added to a stage's
config is a flow setting at once: `vocab` is train_vocab's `VocabConfig`, `shards.phase1` and
`shards.phase2` are make_shards' `ShardsConfig` (one per pre-training phase), `pretrain` is the
training entry point's `PretrainConfig` (its phases by name: `pretrain.phase1.steps`), and
`finetune` fine-tuning's `TasksConfig` (finetune/config.py, whose fields are also
`bert-finetune`'s flags) with the flow's own probes (`FlowTasksConfig`). `data.sources` is a
list of `SourceConfig`s (a user's own text, pipelines/documents/source.py), set whole from a
settings file's list or one field by name (`--set data.sources.poems.weight=2`). Each preset is
composed of the stages' presets of its name; `continue` (continued pre-training from `pretrain.model.init_from`, at a fine-tuning-scale
learning rate) is `base` with training/init_from.py's `continue_preset()`, and a run from
`pretrain.model.init_from` at a learning rate made for training from scratch logs one warning at
resolve.
Paths may be local folders or URLs (`gs://...`).

Overrides come as a nested mapping (`{"pretrain": {"phase1": {"steps": 20}}}`) from deployment
parameters, a settings file or the CLI (`--set pretrain.phase1.steps=20`), applied by the one
mechanism of common/settings.py: a typo fails at once, each value is converted to its field's
type, and a value a stage refuses is an error naming the setting in the flow's terms
(`setting shards.phase2.max_seq_length: must be in [5, 65535], got 4`). `shards.<field>` sets
both phases. A renamed setting fails naming its new name (`RENAMED_SETTINGS`, with
`pretrain.<flat name>` from training/config.py's table: `pretrain.zero_stage` names
`pretrain.engine.zero_stage`). `tiny` reads the
bundled sample; `base` and `large` have no default inputs (None) and `resolve` refuses them until
each is set.
"""
from __future__ import annotations

import dataclasses
import glob
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from common import settings
from finetune.config import ProbeConfig, TasksConfig
from pipelines.corpus.near_duplicates import NearDuplicateConfig
from pipelines.documents.source import SourceConfig
from pipelines.shards import config as shards_config
from pipelines.shards.config import ShardsConfig
from pipelines.vocab import wordpiece
from pipelines.vocab.wordpiece import VocabConfig
from training import config as training
from training.config import PretrainConfig

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"


@dataclass(frozen=True)
class DataConfig:
    wikipedia: str | None = None
    """MediaWiki pages-articles dump(s): a file, glob or folder; "" skips Wikipedia; None: unset.
    Shorthand for the source `{name: wikipedia, kind: wikipedia, path: ...}` in `sources`,
    at weight 1."""
    books: str | None = None
    """Book text files (one book per file): a file, glob or folder; "" skips books; None: unset.
    Shorthand for the source `{name: books, kind: books, path: ...}` in `sources`, at weight 1."""
    sources: tuple[SourceConfig, ...] = ()
    """The text sources: a list of sources (name, kind, path, text_field, id_field, title_field,
    split, weight, licence, quality; pipelines/documents/source.py, README "Your own corpus").
    Wikipedia and books are sources like the others (kind wikipedia or books, named so), with
    their weight, licence and quality; `wikipedia` and `books` above are their shorthands."""
    near_duplicates: NearDuplicateConfig | None = None
    """Near-duplicate removal in the corpus stage, after the exact one (MinHash + LSH:
    shingle_size, num_perm, bands, threshold; pipelines/corpus/near_duplicates.py), e.g.
    `--set data.near_duplicates.threshold=0.8`; None: off."""
    audit: bool = True
    """Audit the corpus for overlap with the evaluation sets the flow scores (13-gram, GPT-3's
    method; pipelines/audit_contamination.py) when fine-tuning tasks are set; the report shows
    the table."""
    decontaminate: bool = False
    """Remove the corpus passages the audit finds in an evaluation set before the vocabulary
    stage (pipelines/decontaminate.py)."""
    beam_args: tuple[str, ...] = ()
    """Beam pipeline options for every data job, e.g. ("--runner=DataflowRunner", "--project=my-project")."""

    def __post_init__(self):
        names = [s.name for s in self.all_sources()]
        settings.check(len(set(names)) == len(names), "sources",
                       f"source names repeat (data.wikipedia and data.books are the sources "
                       f"named wikipedia and books): {names}")

    def all_sources(self) -> tuple[SourceConfig, ...]:
        """Every source of the run: the shorthands' (weight 1), then `sources`."""
        shorthands = tuple(SourceConfig(name=kind, kind=kind, path=path)
                           for kind, path in (("wikipedia", self.wikipedia), ("books", self.books))
                           if path)
        return shorthands + self.sources

    def path_of(self, kind: str) -> str:
        """The input of the wikipedia or books source ("" when there is none)."""
        return next((s.path for s in self.all_sources() if s.kind == kind), "")

    def input_paths(self) -> list[tuple[str, str]]:
        """(setting, path pattern) of every source, for the checks that look at inputs."""
        given = [(f"data.{kind}", getattr(self, kind)) for kind in ("wikipedia", "books")]
        return given + [(f"data.sources.{s.name}.path", s.path) for s in self.sources]


@dataclass(frozen=True)
class ShardPhases:
    """The shards of the two pre-training phases: make_shards' config once per phase
    (pipelines/shards/config.py). Phase N of `pretrain` trains on `phaseN`'s shards, at their
    `max_seq_length`."""
    phase1: ShardsConfig = field(default_factory=lambda: shards_config.base(1))
    """Phase-1 shards (BERT: 128 tokens, 20 predictions)."""
    phase2: ShardsConfig = field(default_factory=lambda: shards_config.base(2))
    """Phase-2 shards (BERT: 512 tokens, 80 predictions)."""


@dataclass(frozen=True)
class LaunchConfig:
    """How the pre-training stage starts its ranks (flows/steps.py `launch_command`)."""
    launcher: Literal["python", "deepspeed", "torchrun"] = "python"
    """python (one process), deepspeed (uses hostfile) or torchrun."""
    nproc_per_node: int = 1
    """Processes per node for the deepspeed/torchrun launchers."""
    hostfile: str = ""
    """DeepSpeed hostfile for multi-node runs."""
    extra_args: tuple[str, ...] = ()
    """Further flags for the training entry point (`--stop_after_steps N`); its settings are
    the `pretrain.*` settings."""

    def __post_init__(self):
        settings.check_choices(self)
        settings.check(self.nproc_per_node >= 1, "nproc_per_node",
                       f"must be >= 1, got {self.nproc_per_node}")
        owned = [a for a in self.extra_args if a.split("=")[0] in ("--set", "--config", "--preset")]
        settings.check(not owned, "extra_args",
                       f"{owned[0] if owned else ''}: the training run's settings are the flow's "
                       "pretrain.* settings (--set pretrain.<field>=...)")


RENAMED_SETTINGS = {
    "glue": "finetune",
    "vocab.cased": "vocab.do_lower_case (the opposite: cased=true is do_lower_case=false)",
    "shards.phase1_max_seq_length": "shards.phase1.max_seq_length",
    "shards.phase1_max_predictions": "shards.phase1.max_predictions_per_seq",
    "shards.phase2_max_seq_length": "shards.phase2.max_seq_length",
    "shards.phase2_max_predictions": "shards.phase2.max_predictions_per_seq",
    "pretrain.phase1_steps": "pretrain.phase1.steps",
    "pretrain.phase2_steps": "pretrain.phase2.steps",
    "pretrain.global_batch_size": "pretrain.phase1.global_batch_size",
    "pretrain.micro_batch_size": "pretrain.phase1.micro_batch_size",
    "pretrain.phase2_global_batch_size": "pretrain.phase2.global_batch_size",
    "pretrain.phase2_micro_batch_size": "pretrain.phase2.micro_batch_size",
    "pretrain.learning_rate": "pretrain.phase1.learning_rate and pretrain.phase2.learning_rate",
    "pretrain.warmup_steps": "pretrain.phase1.warmup_steps (phase 2: pretrain.phase2.warmup_steps)",
    "pretrain.launcher": "launch.launcher",
    "pretrain.nproc_per_node": "launch.nproc_per_node",
    "pretrain.hostfile": "launch.hostfile",
    "pretrain.extra_args": "launch.extra_args (settings in it: pretrain.<field>)",
    **{f"pretrain.{old}": f"pretrain.{new}" for old, new in training.RENAMED_SETTINGS.items()},
    **{f"pretrain.{old}": f"pretrain.{new}" for old, new in training.RENAMED_FIELDS.items()},
}
"""Settings renamed (dotted key, or a whole section): old -> new."""

FLOW_SET = {"pretrain.data.vocab_dir": "the vocab stage's folder",
            "pretrain.output_dir": "the pretrain stage's folder",
            "train_shards": "the shards stage's folder",
            "validation_shards": "the shards stage's folder",
            "max_seq_length": "shards.phase<N>.max_seq_length",
            "finetune.device": "each run takes a free device of the pool, flows/devices.py",
            "finetune.progress": "off: the mapped runs share one log"}
"""Settings the flow fills in: from its stages (the pretrain phase fields by their last name),
and where each fine-tuning run goes."""


@dataclass(frozen=True)
class FlowTasksConfig(TasksConfig):
    """The flow's fine-tuning: `bert-finetune`'s settings (`TasksConfig`) and the probes, which
    only a flow runs (beside its pre-training), so `bert-finetune` has no flag for them."""
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    """Probes of pre-training's intermediate exports (`pretrain.cadence.probe_every`)."""


@dataclass(frozen=True)
class DecayConfig:
    """A decay (WSD's anneal) from one kept checkpoint of the pre-training run, which then is
    the stable phase (`pretrain.optimizer.schedule=wsd`, its last phase's `decay_steps` 0): the
    learning rate falls from that phase's peak to 0 over `steps`, in
    `pretrain.optimizer.decay_shape`, on the run's last shards or on other sources. Each decay
    is a stage keyed by its checkpoint and data: the data stages, the stable run and another
    decay's folders are reused."""
    name: str = "decay"
    """The decay's name: its run's phase name and its row in the report."""
    from_step: int = 0
    """Global step of the stable run's kept checkpoint to decay from (0 = its last)."""
    steps: int = 1000
    """Optimizer steps of the decay (the stable run's last phase's batch and length)."""
    sources: tuple[SourceConfig, ...] = ()
    """Text to decay on (your domain: jsonl, csv, tsv, text, parquet sources as in
    `data.sources`), made into shards with the run's vocabulary and its last phase's shard
    settings; empty = the stable run's last phase's shards."""

    def __post_init__(self):
        settings.check(bool(self.name) and "/" not in self.name, "name",
                       "a non-empty name without '/'")
        settings.check(self.from_step >= 0, "from_step", ">= 0 (0 = the last kept checkpoint)")
        settings.check(self.steps > 0, "steps", "positive")
        for source in self.sources:
            settings.check(source.generic, "sources", f"{source.name}: a decay reads jsonl, csv, "
                           f"tsv, text or parquet sources, not {source.kind}")


@dataclass(frozen=True)
class DagConfig:
    name: str = "base"
    """Preset name, recorded in outputs."""
    output: str = str(REPO / "runs" / "base")
    """Root folder for every stage's output (local or gs://)."""
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=wordpiece.base)
    shards: ShardPhases = field(default_factory=ShardPhases)
    pretrain: PretrainConfig = field(default_factory=training.base)
    launch: LaunchConfig = field(default_factory=LaunchConfig)
    finetune: FlowTasksConfig = field(default_factory=FlowTasksConfig)
    decays: tuple[DecayConfig, ...] = ()
    """Decays from the pre-training run's kept checkpoints (`DecayConfig`): a list, each by its
    name (`--set decays.domain.steps=200`)."""

    def __post_init__(self):
        phases, shards = self.pretrain.phases, (self.shards.phase1, self.shards.phase2)
        settings.check(len(phases) == 2, "pretrain.phases",
                       f"the flow makes shards for two phases, got {[p.name for p in phases]}")
        if self.decays:
            names = [d.name for d in self.decays]
            settings.check(len(set(names)) == len(names), "decays", f"names repeat: {names}")
            settings.check(self.pretrain.optimizer.schedule == "wsd" and
                           not phases[-1].decay_steps, "decays", "decay a stable phase: "
                           "pretrain.optimizer.schedule=wsd and pretrain."
                           f"{phases[-1].name}.decay_steps=0 (got schedule="
                           f"{self.pretrain.optimizer.schedule}, decay_steps="
                           f"{phases[-1].decay_steps})")
        # phase N trains on shards N: the shards set the length, so it is set once
        object.__setattr__(self, "pretrain", dataclasses.replace(self.pretrain, phases=tuple(
            dataclasses.replace(p, max_seq_length=s.max_seq_length)
            for p, s in zip(phases, shards))))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tiny() -> DagConfig:
    """The whole DAG on the bundled sample on CPU, in minutes: each stage's tiny preset."""
    return DagConfig(
        name="tiny",
        output=str(REPO / "runs" / "tiny"),
        data=DataConfig(wikipedia=str(SAMPLE / "wiki"), books=str(SAMPLE / "books"), sources=(
            # a user's own corpus: JSONL records with an id, a title and the text
            SourceConfig(name="poems", kind="jsonl", path=str(SAMPLE / "jsonl"),
                         id_field="id", title_field="title",
                         licence="public domain (Project Gutenberg)"),)),
        vocab=wordpiece.tiny(),
        shards=ShardPhases(shards_config.tiny(1), shards_config.tiny(2)),
        # probes at global steps 200, 400 and 600 (phase 1's end), flows/probes.py
        pretrain=dataclasses.replace(training.tiny(), cadence=dataclasses.replace(
            training.tiny().cadence, probe_every=200)),
        # A family's demo task is its name here and its sample folder in data/sample/.
        finetune=FlowTasksConfig(
            data=str(SAMPLE), tasks=("rte", "mrpc", "sts-b", "sst-2", "squad1"),
            learning_rates=(1e-4, 5e-5), seeds=(1,), epochs=3.0, batch_size=32,
            probe=ProbeConfig(max_train_examples=64, max_eval_examples=64)),
    )


def modernbert_tiny() -> DagConfig:
    """The demo's DAG with the modern encoder (`modernbert_tiny`, model/modernbert.py) and its
    recipe: MLM-only shards (no next-sentence pairs) at ModernBERT's 30% masking, 128 tokens a
    row then 1,024 (past BERT's 512: rotary positions have no table), pre-training without
    dropout, the same fine-tuning fan-out."""
    dag = tiny()

    def modern(shards: ShardsConfig, length: int) -> ShardsConfig:
        return dataclasses.replace(shards, next_sentence=False, masked_lm_prob=0.3,
                                   max_seq_length=length,
                                   max_predictions_per_seq=round(0.3 * length))

    phase1, phase2 = dag.pretrain.phases
    pretrain = dataclasses.replace(
        dag.pretrain, model=training.ModelConfig(preset="modernbert_tiny", dropout=0.0),
        objective=dataclasses.replace(dag.pretrain.objective, next_sentence=False),
        phases=(phase1, dataclasses.replace(phase2, micro_batch_size=8, global_batch_size=8)))
    return dataclasses.replace(
        dag, name="modernbert_tiny", output=str(REPO / "runs" / "modernbert_tiny"),
        shards=ShardPhases(modern(dag.shards.phase1, 128), modern(dag.shards.phase2, 1024)),
        pretrain=pretrain)


# base and large run on real corpora that no image or checkout carries: their data paths have
# no default (None), and `resolve` names every one still unset.

def base() -> DagConfig:
    """BERT-base as in the paper: 1M steps of 256 sequences, 90% at 128 then 10% at 512; rows
    packed (attention runs per instance, so packing only removes padding)."""
    return DagConfig(name="base", output=str(REPO / "runs" / "base"),
                     finetune=FlowTasksConfig(data=None))


def large() -> DagConfig:
    """BERT-large on a GPU node: 8 GPUs, ZeRO-2, bf16. Several nodes: launch through infra/slurm
    or infra/k8s (torchrun rendezvous); `launch.hostfile` (DeepSpeed over ssh) works only on
    hosts with ssh between them, not from the images."""
    return DagConfig(
        name="large", output=str(REPO / "runs" / "large"), vocab=wordpiece.large(),
        shards=ShardPhases(shards_config.large(1), shards_config.large(2)),
        pretrain=training.large(), launch=LaunchConfig(launcher="deepspeed", nproc_per_node=8),
        finetune=FlowTasksConfig(data=None),
    )


def continue_pretraining() -> DagConfig:
    """Continued (domain-adaptive) pre-training of a released BERT on your corpus: set
    `pretrain.model.init_from` (the checkpoint decides the shape; the vocab stage copies its
    vocabulary) and the data. Pre-training as `training.init_from.continue_preset()`: 9,000 +
    1,000 steps of 256 sequences at lr 5e-5 (a fine-tuning-scale rate, not the 1e-4 of training
    from scratch), 6% warmup, on a GPU when there is one."""
    from training.init_from import continue_preset

    return DagConfig(name="continue", output=str(REPO / "runs" / "continue"),
                     pretrain=continue_preset(), finetune=FlowTasksConfig(data=None))


PRESETS = {"tiny": tiny, "modernbert_tiny": modernbert_tiny, "base": base, "large": large,
           "continue": continue_pretraining}
PRESET_NEEDS = {"continue": ("pretrain.model.init_from",)}
"""Settings (besides the inputs) that a preset cannot run without."""


def resolve(preset: str, overrides: dict[str, Any] | None = None,
            data_only: bool = False) -> DagConfig:
    """The preset with nested overrides applied; unknown keys, unset paths and values a stage
    would refuse are errors. `data_only`: the run stops after the shards (`check_output`)."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r}: choose one of {sorted(PRESETS)}")
    _refuse_renamed_and_flow_set(overrides or {})
    overrides = _both_phases(dict(overrides or {}))
    pretrain = overrides.get("pretrain")
    if isinstance(pretrain, dict):
        overrides = {**overrides, "pretrain": settings.merge(
            pretrain, training.checkpoint_decides_shape(pretrain))}
    cfg = settings.apply(PRESETS[preset](), overrides)
    start = cfg.pretrain.model.init_from
    if start and "://" not in start and not os.path.isabs(start):
        # the pretrain stage is keyed on the setting: one checkpoint, one key, however named
        model = dataclasses.replace(cfg.pretrain.model, init_from=os.path.abspath(start))
        cfg = dataclasses.replace(cfg, pretrain=dataclasses.replace(cfg.pretrain, model=model))
    needed = [key for key in PRESET_NEEDS.get(preset, ()) if not settings.setting_at(cfg, key)]
    if needed:
        raise ValueError(f"preset {preset!r} needs {', '.join(needed)}, e.g. --set "
                         f"{needed[0]}=/models/bert-base-uncased (a BERT folder: config.json, "
                         "weights, vocab.txt)")
    from training.init_from import warn_learning_rate

    warn_learning_rate(cfg.pretrain)
    missing = unset_settings(cfg)
    if missing:
        raise ValueError(
            f"preset {preset!r} needs {', '.join(missing)}: set each to a file, glob, folder or "
            f"gs:// URL (finetune.data: a local folder), e.g. --set {missing[0]}=/data/..., or "
            "to '' to skip that input (data.wikipedia and data.books: or list a source of that "
            "kind in data.sources)")
    data = cfg.finetune.data
    if data and "://" in data:
        raise ValueError(f"finetune.data={data!r}: the fine-tuning readers take a local folder "
                         "(copy the data onto the volume, e.g. /data/finetune with glue/ inside)")
    if data:  # each task's loop config, as its runs will build it after pre-training
        for entry in finetune_tasks(cfg):
            try:
                cfg.finetune.for_task(entry)
            except settings.SettingError as error:
                raise error.within("finetune.") from None
    check_output(cfg, data_only)
    return cfg


def _both_phases(overrides: dict[str, Any]) -> dict[str, Any]:
    """`shards.<field>` (not a phase) set on both phases' shards."""
    shards = overrides.get("shards")
    if not isinstance(shards, dict):
        return overrides
    phases = {name: value for name, value in shards.items() if name in ("phase1", "phase2")}
    common = {k: v for k, v in shards.items() if k not in ("phase1", "phase2")}
    known = {f.name for f in dataclasses.fields(ShardsConfig)}
    for key in common.keys() - known:
        raise settings.SettingError(f"shards.{key}", "unknown field (known: phase1, phase2 "
                                    f"and, for both, {sorted(known)})",
                                    "setting {setting}: {message}")
    if not common:
        return overrides
    return {**overrides, "shards": {  # a phase's own value wins; a non-mapping fails in apply
        name: {**common, **phases.get(name, {})} if isinstance(phases.get(name, {}), dict)
        else phases[name] for name in ("phase1", "phase2")}}


def _refuse_renamed_and_flow_set(overrides: dict[str, Any]) -> None:
    for section, value in overrides.items():
        if section in RENAMED_SETTINGS:
            raise ValueError(renamed_message(section, value))
    for key in settings.dotted(overrides):
        new = RENAMED_SETTINGS.get(key)
        if new in FLOW_SET:  # `pretrain.vocab_dir`: the user sets neither name
            raise ValueError(f"setting {key}: the flow sets it ({FLOW_SET[new]})")
        if new:
            raise ValueError(f"setting {key} was renamed: it is now {new}")
        parts = key.split(".")
        if key in FLOW_SET or (parts[0] == "pretrain" and len(parts) >= 3
                               and parts[-1] in FLOW_SET):
            source = FLOW_SET.get(key) or FLOW_SET[parts[-1]]
            raise ValueError(f"setting {key}: the flow sets it ({source})")


def finetune_tasks(cfg: DagConfig) -> list:
    """The registry entries (finetune/tasks.py) of `finetune.tasks`; an unknown name is an
    error in the setting's terms."""
    try:
        return cfg.finetune.task_entries() if cfg.finetune.tasks else []
    except ValueError as e:
        raise ValueError(f"setting finetune.tasks={','.join(cfg.finetune.tasks)}: "
                         f"{str(e).removeprefix('--tasks: ')}") from None


def check_output(cfg: DagConfig, data_only: bool) -> None:
    """The run root suits the stages that will write to it.

    Beam jobs write through `common.storage` (local or gs://), so the data stages take
    either. Pre-training writes DeepSpeed checkpoints and fine-tuning its tables with plain file
    I/O: a gs:// root would fail there, hours in. Dataflow's workers, for their part, cannot write
    to the flow machine's disk."""
    remote = "://" in cfg.output
    if remote and not data_only:
        raise ValueError(
            f"output={cfg.output!r}: pre-training and fine-tuning need a local or mounted folder "
            "(the deployments use /data/runs/<preset>); a gs:// root takes the data stages alone "
            "(--data_only, or the data-* deployments)")
    if not runs_on_dataflow(cfg.data.beam_args):
        return
    if not remote:
        raise ValueError(
            f"data.beam_args run Beam on Dataflow, whose workers cannot write to {cfg.output} "
            "on this machine: set output to a gs:// folder and run the data stages alone "
            "(--data_only)")
    for key, value in cfg.data.input_paths():
        local = [path for path in (value or "").split(",") if path and "://" not in path]
        if local:
            raise ValueError(f"setting {key}={value!r}: Dataflow's workers cannot read {local[0]} "
                             "on this machine: copy it to gs://")


def runs_on_dataflow(beam_args: tuple[str, ...]) -> bool:
    """Whether Beam options name the Dataflow runner (`--runner=DataflowRunner`, `--runner
    dataflow`: Beam matches runner names without case, with or without "Runner", and the last
    `--runner` given wins)."""
    joined = " ".join(beam_args).replace("=", " ").split()
    runners = [value for flag, value in itertools.pairwise(joined) if flag == "--runner"]
    return bool(runners) and runners[-1].lower().endswith(("dataflow", "dataflowrunner"))


def check_inputs_exist(cfg: DagConfig, data_only: bool = False) -> None:
    """Local input folders exist, checked where the flow runs (the worker, whose volumes the
    paths name) before the first stage: a missing fine-tuning folder must not surface
    only after pre-training. Remote inputs are checked by the jobs that read them; a data-only
    run reads no fine-tuning data."""
    local = [*cfg.data.input_paths(), ("pretrain.model.init_from", cfg.pretrain.model.init_from)]
    local += [] if data_only else [("finetune.data", cfg.finetune.data)]
    for key, value in local:
        for path in (value or "").split(","):
            if path and "://" not in path and not (os.path.exists(path) or glob.glob(path)):
                raise FileNotFoundError(f"setting {key}={value!r}: {path} matches no file or "
                                        "folder here")
    if cfg.finetune.data and not data_only:
        check_finetune_files(cfg)


def check_finetune_files(cfg: DagConfig) -> None:
    """Every task's family folder is there. (A task's own files are checked by its runs: one
    task without data fails its runs, not the others'.)"""
    data, missing = cfg.finetune.data, {}
    for entry in finetune_tasks(cfg):
        if not os.path.isdir(os.path.join(data, entry.data_folder)):
            missing.setdefault(entry.data_folder, []).append(entry.task)
    if missing:
        raise FileNotFoundError(f"setting finetune.data={data!r}: " + "; ".join(
            f"no {folder}/ folder (for {', '.join(tasks)})" for folder, tasks in missing.items()))


INPUT_PATHS = ("data.wikipedia", "data.books", "finetune.data")
"""The settings base and large leave unset (None) for the user: the run's inputs."""


def unset_settings(cfg: DagConfig) -> list[str]:
    """The input paths still None. data.wikipedia and data.books are set by a source of their
    kind in `data.sources` too (they are its shorthands); a run without one sets them to ""."""
    listed = {f"data.{source.kind}" for source in cfg.data.sources}
    return [key for key in INPUT_PATHS
            if key not in listed and settings.setting_at(cfg, key) is None]


def parse_set_flags(pairs: list[str]) -> dict[str, Any]:
    """`["pretrain.phase1.steps=20", "finetune.tasks=rte,mrpc"]` -> nested overrides mapping
    (values stay text; `resolve` converts each to its field's type)."""
    return settings.parse_assignments(pairs)


def renamed_message(section: str, value: Any) -> str:
    """The error for a renamed section: each setting given, with its new name."""
    new = RENAMED_SETTINGS[section]
    keys = list(value) if isinstance(value, dict) and value else ["..."]
    names = ", ".join(f"{section}.{k} is now {new}.{k}" for k in keys)
    note = (f" ({new}.data is the folder holding glue/, squad/, ...: the old {section}.data "
            f"folder goes in its glue/)" if section == "glue" and "data" in keys else "")
    return f"setting {section!r} was renamed {new!r}: {names}{note}"
