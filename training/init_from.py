"""Continued pre-training: the model's shape, starting weights and vocabulary from
`model.init_from`.

Domain-adaptive pre-training (Gururangan et al. 2020, "Don't Stop Pretraining") starts from a
released BERT and trains further on the user's corpus. The checkpoint decides everything the
weights fix: layers, hidden size, heads, intermediate size, vocabulary size, positions, token
types (`CHECKPOINT_SHAPE_FIELDS`). A setting that says otherwise is an error naming both values, never a
model silently resized. Heads the checkpoint lacks (a `BertModel` folder has no MLM transform
or NSP classifier; the MLM decoder is the tied word embedding, so only its transform and bias
are new) start from BERT's initialisation and are logged.

The weights are copied into the model before `deepspeed.initialize`, which then partitions them
(ZeRO-3) or keeps them whole, as for a fresh model. A run that finds its own
`checkpoints/latest` resumes from it and reads `init_from` for the shape only.

The learning rate: a preset made for training from scratch (tiny: 1e-3; base: 1e-4) moves a
released model's weights far from what it learned. `continue_preset()` (the flow's
`--preset continue`, and `training/configs/continue.yaml` for `bert-pretrain`) trains at 5e-5,
the top of BERT's fine-tuning range (Devlin et al. 2019, appendix A.3), with 6% of each phase's
steps as warmup (RoBERTa's fine-tuning warmup ratio, Liu et al. 2019, Table 10). A
run with `init_from` and a phase above `MAX_CONTINUE_LEARNING_RATE` logs one warning when it
starts (`warn_learning_rate`).
"""
from __future__ import annotations

import dataclasses
import logging

from torch import nn

from common import storage
from model.bert import BertConfig
from model.encoders import PRESETS as MODEL_PRESETS
from model.encoders import arch_of_preset, tells_pairs_apart
from model.hf import StartingPoint, find_starting_point, read_starting_weights, tied_keys
from training import config as training_config
from training.config import SHAPE_FIELDS, PretrainConfig

log = logging.getLogger(__name__)

CHECKPOINT_SHAPE_FIELDS = (*SHAPE_FIELDS, "vocab_size",
                           "type_vocab_size")
"""What the weights' shapes fix: a config may restate them, never change them."""
CONTINUE_LEARNING_RATE = 5e-5
"""Peak learning rate of continued pre-training (`continue_preset`)."""
MAX_CONTINUE_LEARNING_RATE = 1e-4
"""Above it, a run from `init_from` is warned: BERT-base's own pre-training rate from scratch."""
_WARNED: set[str] = set()


def continue_preset() -> PretrainConfig:
    """Continued pre-training of a released BERT (set `model.init_from`; the checkpoint decides
    the shape and vocabulary): base's two phases of 256 sequences per step, 9,000 steps at 128
    tokens and 1,000 at 512, each at `CONTINUE_LEARNING_RATE` with 6% warmup; a GPU when there is
    one (device, precision auto), else the CPU."""
    base = training_config.base()
    phases = tuple(dataclasses.replace(p, steps=steps, warmup_steps=steps * 6 // 100,
                                       learning_rate=CONTINUE_LEARNING_RATE)
                   for p, steps in zip(base.phases, (9_000, 1_000)))
    engine = dataclasses.replace(base.engine, device="auto", precision="auto", zero_stage=1,
                                 compile=False)
    cadence = dataclasses.replace(base.cadence, eval_every=1_000, checkpoint_every=1_000)
    return dataclasses.replace(base, phases=phases, engine=engine, cadence=cadence)


def learning_rate_warning(config: PretrainConfig) -> str | None:
    """The one-line warning of a run from `init_from` whose phases train above
    `MAX_CONTINUE_LEARNING_RATE`, else None."""
    high = [f"{p.name}.learning_rate={p.learning_rate:g}" for p in config.phases
            if p.learning_rate > MAX_CONTINUE_LEARNING_RATE]
    if not config.model.init_from or not high:
        return None
    return (f"model.init_from={config.model.init_from} with {', '.join(high)}: above "
            f"{MAX_CONTINUE_LEARNING_RATE:g}, a rate for training from scratch, which moves the "
            f"checkpoint far from what it learned; continued pre-training trains at about "
            f"{CONTINUE_LEARNING_RATE:g} (bert-dag --preset continue, bert-pretrain --config "
            "training/configs/continue.yaml)")


def warn_learning_rate(config: PretrainConfig) -> str | None:
    """Log `learning_rate_warning` once per process (the run checks each phase's shape at start
    and again when the phase builds its model); returns it."""
    message = learning_rate_warning(config)
    if message is not None and message not in _WARNED:
        _WARNED.add(message)
        log.warning(message)
    return message


def checkpoint_model_config(config: PretrainConfig, manifest: dict,
                            start: StartingPoint | None = None) -> BertConfig:
    """The model's `BertConfig` for a run with `init_from`: the checkpoint's, with the run's
    dropout and the GPU-friendly row padding; an error naming both values where the preset
    (when one is named), the shards' vocabulary, the vocabulary folder or a phase's sequence
    length contradicts the checkpoint."""
    model = config.model
    start = start or find_starting_point(model.init_from)
    warn_learning_rate(config)
    shape = start.config
    where = f"model.init_from={model.init_from} ({start.config_file})"
    named = model.arch or (arch_of_preset(model.preset) if model.preset else "")
    if named and named != type(shape).arch:
        raise ValueError(f"{where} holds a {type(shape).arch} encoder, but the run's model is "
                         f"{named} (model.arch / model.preset): leave them out to take the "
                         "checkpoint's")
    for name, value in model.shape().items():  # the run's shape fields set (0 = not set)
        if value != getattr(shape, name):
            raise ValueError(f"--set model.{name}={value}, but {where} has {name}="
                             f"{getattr(shape, name)}: a checkpoint's shape cannot change")
    if model.preset:
        preset = MODEL_PRESETS[model.preset]()
        for name in SHAPE_FIELDS:
            if not getattr(model, name) and getattr(preset, name) != getattr(shape, name):
                raise ValueError(
                    f"--set model.preset={model.preset} has {name}={getattr(preset, name)}, but "
                    f"{where} has {name}={getattr(shape, name)}: leave the preset out (--set "
                    "model.preset= or no model.preset setting) to take the checkpoint's shape")
    shards_vocab = int(manifest.get("vocab_size") or 0)
    if shards_vocab and shards_vocab != shape.vocab_size:
        raise ValueError(f"the shards were made with vocab_size {shards_vocab}, but {where} has "
                         f"vocab_size {shape.vocab_size}: make the shards with the checkpoint's "
                         "vocab.txt")
    if config.data.vocab_dir:
        from common.tokenization import read_vocab
        tokens = len(read_vocab(config.data.vocab_dir))
        if tokens != shape.vocab_size:
            raise ValueError(f"--set data.vocab_dir={config.data.vocab_dir} holds {tokens} tokens, "
                             f"but {where} has vocab_size {shape.vocab_size}")
    for phase in config.phases:
        if phase.max_seq_length > shape.max_position_embeddings:
            raise ValueError(f"--set {phase.name}.max_seq_length={phase.max_seq_length}, but "
                             f"{where} has max_position_embeddings "
                             f"{shape.max_position_embeddings}")
    if not tells_pairs_apart(shape):
        raise ValueError(f"{where} has type_vocab_size {shape.type_vocab_size}; BERT's inputs "
                         "need 2 token types (sentences A and B)")
    return model.build(shape.vocab_size, base=shape, vocab_multiple=64)


def load_starting_weights(model: nn.Module, start: StartingPoint) -> list[str]:
    """Copy the checkpoint's weights into `model` (a fresh `BertForPreTraining` of its shape);
    returns the parameters it had none for (they keep their initialisation; logged). Encoder
    weights must all be there. Word-embedding rows past the vocabulary (the padding to a
    multiple of 64) keep their initialisation: no token id reaches them."""
    state, ignored = read_starting_weights(start)
    own = model.state_dict()
    word = "bert.embeddings.word.weight"
    if word in state and state[word].shape != own[word].shape:
        vocab_size = model.config.vocab_size
        padded = own[word].clone()
        padded[:vocab_size] = state[word][:vocab_size]
        state[word] = padded  # (embedding_rows, H)
    result = model.load_state_dict(state, strict=False)
    tied = tied_keys(model)  # the decoder (`word`); ModernBERT's MLM transform (its pooler)
    fresh = [k for k in result.missing_keys if k not in tied]
    encoder = [k for k in fresh if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if encoder:
        raise ValueError(f"{start.weights_file}: encoder weights missing from the checkpoint: "
                         f"{encoder}")
    unused = sorted(set(result.unexpected_keys) | set(ignored))
    if fresh:
        log.info("init_from %s: no weights for %s; initialised as BERT does", start.folder,
                 ", ".join(fresh))
    if unused:  # e.g. NSP weights when the shards are MLM-only, another task's classifier
        log.info("init_from %s: not used by this model: %s", start.folder, ", ".join(unused))
    log.info("init_from %s: %d tensors loaded from %s", start.folder,
             len(state) - len(result.unexpected_keys), start.weights_file)
    return fresh


def checkpoint_vocab_dir(start: StartingPoint) -> str | None:
    """The checkpoint's vocabulary folder (its `vocab.txt` beside the weights), or None."""
    return start.folder if storage.exists(storage.join(start.folder, "vocab.txt")) else None


def checkpoint_do_lower_case(start: StartingPoint) -> bool:
    """Whether the checkpoint's tokenizer lower-cases: its `tokenizer_config.json`'s
    `do_lower_case`, else BERT's convention by the folder's name ("...-cased": False, else
    True)."""
    from common.tokenization import recorded_lower_case
    recorded = recorded_lower_case(start.folder)
    if recorded is not None:
        return recorded
    name = start.folder.rstrip("/").rpartition("/")[2].lower()
    return "uncased" in name or "cased" not in name


def initial_weights_digest(start: StartingPoint) -> str:
    """sha256 of the checkpoint's config file and weights file: its identity, for content-
    addressed outputs (another checkpoint at the same path is another starting point)."""
    return storage.config_hash([storage.sha256_file(start.config_file),
                                storage.sha256_file(start.weights_file)])

