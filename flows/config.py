"""The DAG's configuration: one typed dataclass per stage, presets `tiny`, `base`, `large`.

Paths may be local folders or URLs (`gs://...`). Overrides come as a nested mapping
(`{"pretrain": {"phase1_steps": 20}}`) from deployment parameters or the CLI (`--set
pretrain.phase1_steps=20`), validated against the dataclasses so a typo fails at once, and
converted to each field's declared type (`finetune.seeds=1,2` -> (1, 2), `vocab.cased=false` ->
False). A renamed setting (`glue.*`, now `finetune.*`) fails naming its new name. `tiny` reads the bundled sample; `base` and `large` have no default inputs (None) and
`resolve` refuses them until each is set.
"""
from __future__ import annotations

import dataclasses
import glob
import itertools
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.settings import convert_setting

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "data" / "sample"


@dataclass(frozen=True)
class DataConfig:
    wikipedia: str | None = None
    """MediaWiki pages-articles dump(s): a file, glob or folder; "" skips Wikipedia; None: unset."""
    books: str | None = None
    """Book text files (one book per file): a file, glob or folder; "" skips books; None: unset."""
    beam_args: tuple[str, ...] = ()
    """Beam pipeline options for every data job, e.g. ("--runner=DataflowRunner", "--project=p")."""


@dataclass(frozen=True)
class VocabConfig:
    vocab_size: int = 30522
    """WordPiece vocabulary size (BERT: 30,522)."""
    cased: bool = False
    """Keep case and accents (BERT-cased) instead of lower-casing."""

    def __post_init__(self):
        # Below ~1,000 the alphabet of real text (plus the reserved block) leaves no room.
        if self.vocab_size < 1000:
            raise ValueError(f"vocab.vocab_size={self.vocab_size}: must be at least 1000")


@dataclass(frozen=True)
class ShardsConfig:
    dupe_factor: int = 10
    """Passes over the corpus with different masks (BERT: 10)."""
    phase1_max_seq_length: int = 128
    """Sequence length of phase-1 instances."""
    phase1_max_predictions: int = 20
    """max_predictions_per_seq for phase 1."""
    phase2_max_seq_length: int = 512
    """Sequence length of phase-2 instances."""
    phase2_max_predictions: int = 80
    """max_predictions_per_seq for phase 2."""
    pack: bool = False
    """Pack several short instances per row (less padding)."""
    target_shard_mb: float = 64.0
    """Target size of one shard file."""
    validation_fraction: float = 0.01
    """Share of documents held out (by a hash of doc_id) for the validation shards."""
    masked_lm_prob: float = 0.15
    """Share of each instance's tokens to predict (make_shards --masked_lm_prob)."""
    mask_fraction: float = 0.8
    """Share of predicted positions shown as [MASK] (--mask_fraction; Table 8's MASK)."""
    same_fraction: float = 0.1
    """Share of predicted positions left unchanged (--same_fraction; Table 8's SAME)."""
    random_fraction: float = 0.1
    """Share of predicted positions shown as a random token (--random_fraction; Table 8's RND)."""
    do_whole_word_mask: bool = False
    """Predict all WordPiece pieces of a word together (--do_whole_word_mask)."""
    next_sentence: bool = True
    """Sentence pairs with NSP labels; false: MLM-only instances (--no_next_sentence)."""


@dataclass(frozen=True)
class PretrainConfig:
    model: str = "bert_base"
    """Model preset: bert_tiny, bert_mini, bert_base, bert_large (not used with init_from)."""
    init_from: str = ""
    """Continue pre-training from this BERT checkpoint (training/config.py `init_from`): its
    shape is the model, its vocab.txt the vocabulary (no vocabulary is trained; vocab.* unused)."""
    phase1_steps: int = 900_000
    """Optimizer steps of phase 1 (BERT: 90% of 1M at seq 128)."""
    phase2_steps: int = 100_000
    """Optimizer steps of phase 2 (BERT: 10% at seq 512)."""
    global_batch_size: int = 256
    """Sequences per optimizer step, all ranks together (BERT: 256)."""
    micro_batch_size: int = 32
    """Sequences per rank per forward pass; accumulation makes up the rest."""
    phase2_global_batch_size: int = 256
    """Sequences per optimizer step in phase 2."""
    phase2_micro_batch_size: int = 32
    """Micro batch in phase 2 (training/config.py's memory estimate: 18 GiB for BERT-large on
    an 80 GB GPU)."""
    learning_rate: float = 1e-4
    """Peak learning rate (BERT: 1e-4)."""
    warmup_steps: int = 10_000
    """Linear warmup steps of phase 1 (BERT: 10k)."""
    zero_stage: int = 2
    """DeepSpeed ZeRO stage 0-3 (2 on GPUs: its gradient reduction overlaps the backward and
    accumulates in fp32, see training/ds_config.py)."""
    precision: str = "bf16"
    """fp32, bf16 (CPU and GPU), fp16 (GPU) or auto (bf16 where the hardware multiplies in
    bf16, else fp32)."""
    launcher: str = "python"
    """python (one process), deepspeed (uses hostfile) or torchrun."""
    nproc_per_node: int = 1
    """Processes per node for the deepspeed/torchrun launchers."""
    hostfile: str = ""
    """DeepSpeed hostfile for multi-node runs."""
    extra_args: tuple[str, ...] = ()
    """Further flags for the training entry point."""

    def __post_init__(self):
        if self.launcher not in ("python", "deepspeed", "torchrun"):
            raise ValueError(f"pretrain.launcher={self.launcher!r}: python, deepspeed or torchrun")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"pretrain.zero_stage={self.zero_stage}: must be 0-3")
        if self.precision in ("bf16", "fp16") and self.zero_stage == 0:
            # training/config.py refuses it too, but only when the pretrain stage starts
            raise ValueError(f"pretrain.precision={self.precision} needs pretrain.zero_stage >= 1 "
                             "(at stage 0 DeepSpeed keeps no fp32 master weights to export)")


@dataclass(frozen=True)
class FinetuneSettings:
    """The fine-tuning fan-out (finetune/loop.py): tasks x learning rates x seeds. The recipe
    settings left at 0 or () take each task's family recipe (the paper's)."""

    data: str | None = ""
    """Folder holding one folder per family or task (glue/ in the glue_data layout, squad/,
    swag/, conll2003/, ...: finetune/tasks.py); "" skips fine-tuning; None: unset."""
    tasks: tuple[str, ...] = ("cola", "sst-2", "mrpc", "sts-b", "qqp", "mnli", "qnli", "rte",
                              "wnli")
    """Tasks to fine-tune (task names, or a family name for all its tasks)."""
    learning_rates: tuple[float, ...] = ()
    """Peak learning rates tried, the best on dev kept; () = each family's grid."""
    seeds: tuple[int, ...] = (1, 2, 3)
    """Seeds for the small tasks (GLUE: CoLA, MRPC, STS-B, RTE, WNLI); others use the first."""
    epochs: float = 0.0
    """Fine-tuning epochs; 0 = the family's (GLUE: 3)."""
    batch_size: int = 0
    """Fine-tuning batch size; 0 = the family's (GLUE: 32)."""
    max_seq_length: int = 0
    """Tokens per sequence; 0 = the family's (GLUE: 128, SQuAD: 384)."""
    max_train_examples: int = 0
    """Cap on training examples per task (0 = all), for quick runs."""
    max_eval_examples: int = 0
    """Cap on dev examples per task (0 = all)."""
    skip_bad_rows: bool = False
    """Set malformed records aside (counted, written to finetune/dead_letter/) instead of
    failing the task's runs."""


RENAMED_SETTINGS = {"glue": "finetune"}
"""Sections renamed: old -> new (the settings inside keep their names)."""


@dataclass(frozen=True)
class DagConfig:
    name: str = "base"
    """Preset name, recorded in outputs."""
    output: str = str(REPO / "runs" / "base")
    """Root folder for every stage's output (local or gs://)."""
    data: DataConfig = field(default_factory=DataConfig)
    vocab: VocabConfig = field(default_factory=VocabConfig)
    shards: ShardsConfig = field(default_factory=ShardsConfig)
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    finetune: FinetuneSettings = field(default_factory=FinetuneSettings)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def tiny() -> DagConfig:
    """The whole DAG on the bundled sample on CPU, in minutes."""
    return DagConfig(
        name="tiny",
        output=str(REPO / "runs" / "tiny"),
        data=DataConfig(wikipedia=str(SAMPLE / "wiki"), books=str(SAMPLE / "books")),
        vocab=VocabConfig(vocab_size=4000),
        shards=ShardsConfig(dupe_factor=2, phase1_max_seq_length=128, phase1_max_predictions=20,
                            phase2_max_seq_length=256, phase2_max_predictions=40,
                            target_shard_mb=1.0, validation_fraction=0.2),
        pretrain=PretrainConfig(model="bert_tiny", phase1_steps=600, phase2_steps=60,
                                global_batch_size=32, micro_batch_size=32,
                                phase2_global_batch_size=16, phase2_micro_batch_size=16,
                                learning_rate=1e-3, warmup_steps=60, zero_stage=1,
                                precision="auto"),
        # A family's demo task is its name here and its sample folder in data/sample/.
        finetune=FinetuneSettings(data=str(SAMPLE),
                                  tasks=("rte", "mrpc", "sts-b", "sst-2", "squad1"),
                                  learning_rates=(1e-4, 5e-5), seeds=(1,), epochs=3.0,
                                  batch_size=32),
    )


# base and large run on real corpora that no image or checkout carries: their data paths have
# no default (None), and `resolve` names every one still unset.

def base() -> DagConfig:
    """BERT-base as in the paper: 1M steps of 256 sequences, 90% at 128 then 10% at 512; rows
    packed (attention runs per instance, so packing only removes padding)."""
    return DagConfig(name="base", output=str(REPO / "runs" / "base"),
                     shards=ShardsConfig(pack=True), finetune=FinetuneSettings(data=None))


def large() -> DagConfig:
    """BERT-large on a GPU node: 8 GPUs, ZeRO-2, bf16. Several nodes: launch through infra/slurm
    or infra/k8s (torchrun rendezvous); `pretrain.hostfile` (DeepSpeed over ssh) works only on
    hosts with ssh between them, not from the images."""
    return DagConfig(
        name="large", output=str(REPO / "runs" / "large"), shards=ShardsConfig(pack=True),
        pretrain=PretrainConfig(model="bert_large", micro_batch_size=32, phase2_micro_batch_size=32,
                                launcher="deepspeed", nproc_per_node=8),
        finetune=FinetuneSettings(data=None),
    )


PRESETS = {"tiny": tiny, "base": base, "large": large}


def resolve(preset: str, overrides: dict[str, Any] | None = None,
            data_only: bool = False) -> DagConfig:
    """The preset with nested overrides applied; unknown keys, unset paths and values a stage
    would refuse are errors. `data_only`: the run stops after the shards (`check_output`)."""
    if preset not in PRESETS:
        raise ValueError(f"preset={preset!r}: choose one of {sorted(PRESETS)}")
    cfg = _apply(PRESETS[preset](), overrides or {}, prefix="")
    missing = unset_settings(cfg)
    if missing:
        raise ValueError(
            f"preset {preset!r} needs {', '.join(missing)}: set each to a file, glob, folder or "
            f"gs:// URL (finetune.data: a local folder), e.g. --set {missing[0]}=/data/..., or "
            "to '' to skip that input")
    data = cfg.finetune.data
    if data and "://" in data:
        raise ValueError(f"finetune.data={data!r}: the fine-tuning readers take a local folder "
                         "(copy the data onto the volume, e.g. /data/finetune with glue/ inside)")
    if data:
        finetune_tasks(cfg)
    check_output(cfg, data_only)
    from flows.steps import check_settings  # steps imports this module

    check_settings(cfg)
    return cfg


def finetune_tasks(cfg: DagConfig) -> list:
    """The registry entries (finetune/tasks.py) of `finetune.tasks`; an unknown name is an
    error in the setting's terms."""
    from finetune.tasks import parse_tasks

    try:
        return parse_tasks(",".join(cfg.finetune.tasks)) if cfg.finetune.tasks else []
    except ValueError as e:
        raise ValueError(f"setting finetune.tasks={','.join(cfg.finetune.tasks)}: "
                         f"{str(e).removeprefix('--tasks: ')}") from None


def check_output(cfg: DagConfig, data_only: bool) -> None:
    """The run root suits the stages that will write to it.

    Beam jobs write through `pipelines.storage` (local or gs://), so the data stages take
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
    for key, value in (("data.wikipedia", cfg.data.wikipedia), ("data.books", cfg.data.books)):
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
    local = [("data.wikipedia", cfg.data.wikipedia), ("data.books", cfg.data.books)]
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


def unset_settings(obj, prefix: str = "") -> list[str]:
    """Dotted keys of the settings still None (the paths base and large leave to the user)."""
    missing = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            missing += unset_settings(value, prefix=f"{prefix}{f.name}.")
        elif value is None:
            missing.append(f"{prefix}{f.name}")
    return missing


def _apply(obj, overrides: dict[str, Any], prefix: str):
    fields = {f.name: f for f in dataclasses.fields(obj)}
    hints = typing.get_type_hints(type(obj))
    changes = {}
    for key, value in overrides.items():
        if not prefix and key in RENAMED_SETTINGS:
            raise ValueError(renamed_message(key, value))
        if key not in fields:
            raise ValueError(f"unknown setting '{prefix}{key}'; known: {sorted(fields)}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ValueError(f"setting {prefix}{key!r} takes a mapping, got {value!r}")
            changes[key] = _apply(current, value, prefix=f"{prefix}{key}.")
        else:
            changes[key] = convert_setting(f"setting {prefix}{key}", value, hints[key])
    return dataclasses.replace(obj, **changes)


def renamed_message(section: str, value: Any) -> str:
    """The error for a renamed section: each setting given, with its new name."""
    new = RENAMED_SETTINGS[section]
    keys = list(value) if isinstance(value, dict) and value else ["..."]
    names = ", ".join(f"{section}.{k} is now {new}.{k}" for k in keys)
    note = (f" ({new}.data is the folder holding glue/, squad/, ...: the old {section}.data "
            f"folder goes in its glue/)" if section == "glue" and "data" in keys else "")
    return f"setting {section!r} was renamed {new!r}: {names}{note}"


def parse_set_flags(pairs: list[str]) -> dict[str, Any]:
    """`["pretrain.phase1_steps=20", "finetune.tasks=rte,mrpc"]` -> nested overrides mapping.

    Values stay strings here; `resolve` converts each to its field's type."""
    overrides: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--set {pair!r}: expected key=value")
        node = overrides
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise TypeError(f"--set {pair!r}: {p} is a setting, not a section")
        node[leaf] = raw
    return overrides
