"""Continued pre-training: the model's shape, starting weights and vocabulary from `init_from`.

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
"""
from __future__ import annotations

import logging

from torch import nn

from common import storage
from model.bert import PRESETS as MODEL_PRESETS
from model.bert import BertConfig
from model.hf import StartingPoint, find_starting_point, read_starting_weights
from training.config import SHAPE_FIELDS, PretrainConfig

log = logging.getLogger(__name__)

CHECKPOINT_SHAPE_FIELDS = (*SHAPE_FIELDS, "vocab_size", "max_position_embeddings",
                           "type_vocab_size")
"""What the weights' shapes fix: a config may restate them, never change them."""


def checkpoint_model_config(config: PretrainConfig, manifest: dict,
                            start: StartingPoint | None = None) -> BertConfig:
    """The model's `BertConfig` for a run with `init_from`: the checkpoint's, with the run's
    dropout and the GPU-friendly row padding; an error naming both values where the preset
    (when one is named), the shards' vocabulary, the vocabulary folder or a phase's sequence
    length contradicts the checkpoint."""
    start = start or find_starting_point(config.init_from)
    shape = start.config
    where = f"init_from={config.init_from} ({start.config_file})"
    for name in SHAPE_FIELDS:  # the run's shape fields (0 = not set)
        value = getattr(config, name)
        if value and value != getattr(shape, name):
            raise ValueError(f"--set {name}={value}, but {where} has {name}="
                             f"{getattr(shape, name)}: a checkpoint's shape cannot change")
    if config.model:
        preset = MODEL_PRESETS[config.model]()
        for name in SHAPE_FIELDS:
            if not getattr(config, name) and getattr(preset, name) != getattr(shape, name):
                raise ValueError(
                    f"--set model={config.model} has {name}={getattr(preset, name)}, but "
                    f"{where} has {name}={getattr(shape, name)}: leave model out (--set "
                    "model= or no model setting) to take the checkpoint's shape")
    shards_vocab = int(manifest.get("vocab_size") or 0)
    if shards_vocab and shards_vocab != shape.vocab_size:
        raise ValueError(f"the shards were made with vocab_size {shards_vocab}, but {where} has "
                         f"vocab_size {shape.vocab_size}: make the shards with the checkpoint's "
                         "vocab.txt")
    if config.vocab_dir:
        from common.tokenization import read_vocab
        tokens = len(read_vocab(config.vocab_dir))
        if tokens != shape.vocab_size:
            raise ValueError(f"--set vocab_dir={config.vocab_dir} holds {tokens} tokens, but "
                             f"{where} has vocab_size {shape.vocab_size}")
    for phase in config.phases:
        if phase.max_seq_length > shape.max_position_embeddings:
            raise ValueError(f"--set {phase.name}.max_seq_length={phase.max_seq_length}, but "
                             f"{where} has max_position_embeddings "
                             f"{shape.max_position_embeddings}")
    if shape.type_vocab_size < 2:
        raise ValueError(f"{where} has type_vocab_size {shape.type_vocab_size}; BERT's inputs "
                         "need 2 token types (sentences A and B)")
    return shape.replace(hidden_dropout_prob=config.dropout,
                         attention_probs_dropout_prob=config.dropout, vocab_multiple=64,
                         is_decoder=config.objective == "ltr")


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
    fresh = [k for k in result.missing_keys if k != "mlm.decoder.weight"]  # tied to `word`
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

