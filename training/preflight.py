"""The start-of-run checks of `bert-pretrain` (`preflight`), and the inputs they read.

Before anything is written, all ranks agree on: the checkpoint to resume and whether the config
may resume it (`check_resume`: no field that shapes the training changed, same shard set), each
phase's validation set (`has_validation`: enough held-out rows for one micro-batch per rank,
shard files with the manifest's sha256),
and the inputs of every phase with steps left (`check_phase_inputs`: manifest, sequence length,
vocabulary, the objective's needs, complete shard files with the manifest's sha256), so that
phase 2's mistakes cannot wait for phase 1's hours. A check that fails raises one line naming
the setting or file. `shard_manifest` and `model_config` are the inputs the run builds from.
"""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import replace

import torch

from common import storage
from common.settings import SettingError
from training import config as cfg
from training import objectives
from training.checkpoint import CheckpointState, latest_tag, read_state, verified
from training.config import PhaseConfig, PretrainConfig
from training.metrics import read_metrics
from training.ranks import Dist, on_all_ranks

log = logging.getLogger("training.pretrain")


def bf16_hardware(on_gpu: bool) -> bool:
    """Whether this machine multiplies bf16 matrices natively: a CUDA GPU with bf16 (Ampere and
    later), or a CPU whose oneDNN has a bf16 kernel (AVX512-BF16, AMX, or AVX-512 cores)."""
    if on_gpu:
        return torch.cuda.is_bf16_supported(including_emulation=False)
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without oneDNN
        return False


def shard_manifest(phase: PhaseConfig) -> dict:
    """The manifest of the phase's train shards."""
    from training.shard_trust import read_shard_manifest
    if not phase.train_shards:
        raise ValueError(f"--set {phase.name}.train_shards=...: the phase has no shards")
    return read_shard_manifest(phase.train_shards)


def check_phase_inputs(config: PretrainConfig, first_phase: int = 0) -> None:
    """The shards of every phase from `first_phase` on (earlier ones are done: their shards may
    be gone), before the first step: a mistake in phase 2's inputs must not surface after
    phase 1's hours. Per phase: the manifest, the sequence length, the vocabulary (size, and
    the file's sha256 against `vocab_dir`'s: same-size vocabularies with other tokens would
    train silently on ids the tokenizer does not mean; a BPE one's merges too, which split the
    same text into other ids), what the objective needs
    (`Objective.check_shards`), complete local shard files, each with
    the manifest's sha256 and only regular, relatively named members (`verify_shard_files`;
    above `FULL_CHECK_MAX_BYTES` the loader checks each shard as it reads it instead). Across
    phases: one vocabulary, and NSP in all or none."""
    from training.shard_trust import check_shard_files, list_shards, verify_shard_files

    vocab_file, vocab_sha, vocab_size, merges = None, None, None, None
    vocab_dir, init_from = config.data.vocab_dir, config.model.init_from
    if vocab_dir:
        from common.tokenization import merges_sha256, read_vocab
        vocab_file = vocab_dir if vocab_dir.endswith(".txt") else \
            storage.join(vocab_dir, "vocab.txt")
        vocab_size, vocab_sha = len(read_vocab(vocab_dir)), storage.sha256_file(vocab_file)
        merges = merges_sha256(vocab_dir)
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
                not same_tokens(manifest["vocab"].get("path"), recorded, vocab_dir):
            if init_from:
                raise ValueError(
                    f"{where}: shards made with the vocabulary {manifest['vocab'].get('path')} "
                    f"(sha256 {recorded[:12]}), but model.init_from={init_from} has another "
                    f"({vocab_file}, sha256 {vocab_sha[:12]}): its embeddings would read token "
                    "ids it does not know. Make the shards with the checkpoint's vocab.txt")
            raise ValueError(
                f"{where}: shards made with the vocabulary {manifest['vocab'].get('path')} "
                f"(sha256 {recorded[:12]}), but data.vocab_dir={vocab_dir} holds another "
                f"({vocab_file}, sha256 {vocab_sha[:12]}): the token ids would not mean what "
                "the exported tokenizer says. Point data.vocab_dir at the shards' vocabulary")
        recorded_merges = (manifest.get("vocab") or {}).get("merges_sha256")
        if vocab_dir and recorded_merges and recorded_merges != merges:
            holder = (f"model.init_from={init_from} has" if init_from else
                      f"data.vocab_dir={vocab_dir} holds")
            theirs = f"merges sha256 {merges[:12]}" if merges else "a WordPiece vocabulary"
            raise ValueError(
                f"{where}: shards made with the BPE merges of {manifest['vocab'].get('path')} "
                f"(merges sha256 {recorded_merges[:12]}), but {holder} others ({theirs}): the "
                "same text splits into other ids. Make the shards with the run's vocabulary")
        if vocab_size and manifest.get("vocab_size") and int(manifest["vocab_size"]) != vocab_size:
            raise ValueError(f"{where}: shards made with vocab_size {manifest['vocab_size']}, "
                             f"but data.vocab_dir={vocab_dir} holds {vocab_size} tokens")
        for key, value in (("vocab_size", manifest.get("vocab_size")), ("vocab sha256", recorded),
                           ("merges sha256", recorded_merges),
                           ("nsp", bool(manifest.get("nsp", True)))):
            if value is None:  # an older manifest without it
                continue
            first = seen.setdefault(key, (phase.name, value))
            if value != first[1]:
                raise ValueError(f"{where}: shards with {key} {value}, but {first[0]}'s have "
                                 f"{first[1]}: every phase must train one model on one "
                                 "vocabulary, with next-sentence pairs in all phases or none")
        objectives.for_shards(config.objective.name, config.objective.next_sentence,
                              manifest).check_shards(manifest, where)
        shards = list_shards(phase.train_shards, "train")[0]
        check_shard_files(shards)
        verify_shard_files(shards)


def same_tokens(recorded_path: str | None, recorded_sha: str, vocab_dir: str) -> bool:
    """Whether the vocabulary file a manifest names is still the one it hashed and holds the
    same tokens as `vocab_dir`'s: a copy with other line endings hashes differently but is the
    same vocabulary. (A file rewritten in place since is not: its hash no longer matches.)"""
    from common.tokenization import read_vocab
    try:
        return bool(recorded_path) and storage.sha256_file(recorded_path) == recorded_sha and \
            read_vocab(recorded_path) == read_vocab(vocab_dir)
    except (OSError, ValueError):
        return False


def model_config(config: PretrainConfig, manifest: dict, phase: PhaseConfig | None = None):
    """The run's encoder config (`model.bert.BertConfig`, `model.modernbert.ModernBertConfig`):
    `init_from`'s shape, or the preset's (with the run's shape fields) with the shards'
    vocabulary size; in `phase`, with the phase's RoPE base (`PhaseConfig.rope_theta`)."""
    model = _model_config(config, manifest)
    if phase is None or not phase.rope_theta:
        return model
    if not hasattr(model, "global_rope_theta"):
        raise SettingError(f"{phase.name}.rope_theta", f"the {type(model).arch} encoder has no "
                           "rotary positions (model.arch=modernbert has)",
                           "--set {setting}: {message}")
    return model.replace(global_rope_theta=phase.rope_theta)


def _model_config(config: PretrainConfig, manifest: dict):
    if config.model.init_from:
        from training.init_from import checkpoint_model_config
        return checkpoint_model_config(config, manifest)
    vocab_size, vocab_dir = int(manifest.get("vocab_size") or 0), config.data.vocab_dir
    if vocab_dir:
        from common.tokenization import read_vocab
        tokens = len(read_vocab(vocab_dir))
        if vocab_size and tokens != vocab_size:
            raise ValueError(f"--set data.vocab_dir={vocab_dir}: {tokens} tokens, but the shards "
                             f"were made with vocab_size {vocab_size}")
        vocab_size = tokens
    if not vocab_size:
        raise ValueError("vocab_size unknown: set data.vocab_dir or write vocab_size in the "
                         "manifest")
    return config.model.build(vocab_size, vocab_multiple=64)


def has_validation(config: PretrainConfig, phase: PhaseConfig, dist: Dist) -> bool:
    """Whether to validate the phase: cadence.eval_batches > 0 and held-out shards exist (else
    skipped, with a warning). `preflight` asks it for every phase with steps left before the run's
    first step: shards with fewer rows than one micro-batch per rank, or corrupt or hostile ones
    (`verify_shard_files`, as the train shards), raise here, not at the phase's first
    evaluation (where `validation_batches` would end the run, after checkpoints)."""
    from training.shard_trust import check_shard_files, list_shards, verify_shard_files
    if config.cadence.eval_batches == 0:
        return False
    source = phase.validation_shards or phase.train_shards
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
            f"{phase.name}.validation_shards=... elsewhere, or --set cadence.eval_batches=0")
    verify_shard_files(shards)
    return True


def is_evaluation_step(config: PretrainConfig, phase: PhaseConfig, step: int) -> bool:
    every = config.cadence.eval_every
    return bool(every and step % every == 0) or step == phase.steps


def validation_missing(config: PretrainConfig, resume: CheckpointState, dist: Dist) -> bool:
    """Whether the run was stopped between the resumed step's checkpoint and its evaluation
    (a kill, a failing validation shard): then that evaluation is redone before training on
    (if the phase has validation shards). Rank 0 reads metrics.jsonl and tells the others,
    since evaluation is collective."""
    missing = [False]
    if dist.is_main and config.cadence.eval_batches and \
            resume.phase_index < len(config.phases) and \
            is_evaluation_step(config, config.phases[resume.phase_index], resume.step):
        path = os.path.join(config.output_dir, "metrics.jsonl")
        records = read_metrics(config.output_dir) if os.path.exists(path) else []
        missing[0] = not any(r["split"] == "validation" and r["phase_index"] == resume.phase_index
                             and r["step"] == resume.step for r in records)
    torch.distributed.broadcast_object_list(missing, src=0)
    return missing[0]


def with_checkpoint_vocab(config: PretrainConfig) -> PretrainConfig:
    """With `model.init_from` and no `data.vocab_dir`, the checkpoint's vocabulary folder (if
    it has a vocab.txt): the shards are checked against it and the export carries it. A
    `data.vocab_dir` given as well must hold the checkpoint's tokens, in its order."""
    init_from, vocab_dir = config.model.init_from, config.data.vocab_dir
    if not init_from:
        return config
    from common.tokenization import read_vocab
    from model.hf import find_starting_point
    from training.init_from import checkpoint_vocab_dir
    own = checkpoint_vocab_dir(find_starting_point(init_from))
    if own is None:
        return config
    if not vocab_dir:
        return replace(config, data=replace(config.data, vocab_dir=own))
    if read_vocab(vocab_dir) != read_vocab(own):
        raise ValueError(f"--set data.vocab_dir={vocab_dir} holds other tokens than "
                         f"model.init_from={init_from}'s vocabulary ({own}/vocab.txt): the "
                         "checkpoint's embeddings are indexed by its own; leave data.vocab_dir "
                         "out")
    return config


def preflight(config: PretrainConfig, dist: Dist,
              ckpt_dir: str) -> tuple[CheckpointState | None, list[bool], bool]:
    """The start-of-run checks, agreed by all ranks, before anything is written: the
    checkpoint to resume (and whether the config may resume it), each phase's validation set,
    and the inputs of every phase with steps left (earlier phases' shards may be gone), so
    that phase 2's mistakes cannot wait for phase 1. Returns the checkpoint, whether to
    validate each phase, and whether the resumed step owes its evaluation (killed between its
    checkpoint and its evaluation; then the resumed phase's inputs are checked too)."""
    tag = on_all_ranks(dist, lambda: latest_tag(ckpt_dir), agree="the checkpoint to resume from")
    resume = None
    if tag is not None:
        # before anything in it is read: its config.json names the objective, which may be a
        # module to import
        verified(os.path.join(ckpt_dir, tag), dist)
        resume = on_all_ranks(dist, lambda: read_state(ckpt_dir, tag),
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
    if config.model.init_from:  # the shape and the shards' vocabulary against the checkpoint
        on_all_ranks(dist, lambda: [model_config(config, shard_manifest(phase))
                                    for phase in config.phases[checked_from:]])
    if config.cadence.export_hf:  # a casing contradiction must stop the run now, not at export
        on_all_ranks(dist, lambda: export_do_lower_case(shard_manifest(config.phases[-1]),
                                                        config.data.vocab_dir))
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
    from training.shard_trust import read_shard_manifest, shard_set_digest
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
