"""Hugging Face interop and our own checkpoint format, for every encoder of the registry
(model/encoders.py): each encoder's adapter knows transformers' key names, this file the files.

- `load_hf_checkpoint(folder)`: a `transformers` folder of a registered encoder (`config.json`
  with its `model_type` + `model.safetensors` or `pytorch_model.bin`; the bare encoder's keys or
  a pre-training / masked-LM model's) -> our `BertForPreTraining` on that encoder, or
  `BertForNextToken` where its config attends left to right (`is_decoder`: a `BertLMHeadModel`)
  (heads absent from the checkpoint keep their fresh initialisation).
- `export_hf_folder(model, vocab_dir, out_dir)`: -> a folder that transformers'
  `AutoModelFor...from_pretrained` and `AutoTokenizer.from_pretrained` load, lower-casing or
  not as the vocabulary folder's `tokenizer_config.json` says.
- `save_checkpoint(model, folder)` / `load_checkpoint(folder)`: our keys in
  `bert.safetensors` + `bert_config.json` (the encoder's config with its `arch`, and the head).

A model's head says what it is (`kind`, `options()`: model/heads.py `HEADS`); a folder's
config says which encoder it holds (`model_type`, or our `arch`).
"""
from __future__ import annotations

import io
import logging
import pickle
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import Tensor, nn

from common import storage
from common.tokenization import read_merges, read_vocab, save_tokenizer_folder
from model.encoders import (
    ENCODERS,
    HFAdapter,
    build_encoder,
    config_from_dict,
    config_to_dict,
    encoder_of,
)
from model.heads import HEADS, BertForNextToken, BertForPreTraining

log = logging.getLogger(__name__)

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CHECKPOINT_WEIGHTS = "bert.safetensors"
CHECKPOINT_CONFIG = "bert_config.json"
WORD_EMBEDDINGS = "bert.embeddings.word.weight"
"""Our key of the word embeddings, whatever the encoder (the registry's contract)."""


def read_hf_weights(folder: str) -> tuple[dict[str, Tensor], str]:
    """The state dict of a HF folder (safetensors preferred) and the file it came from."""
    for name in HF_WEIGHT_FILES:
        path = storage.join(folder, name)
        if storage.exists(path):
            with storage.open_read(path, "rb") as f:
                data = f.read()
            if name.endswith(".safetensors"):
                return load_safetensors_bytes(data), path
            try:
                return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True), path
            except (pickle.UnpicklingError, EOFError):  # torch's message: a page of advice
                raise ValueError(f"{path}: not a plain state dict of tensors, refused by "
                                 "torch.load(weights_only=True) (unpickling more could run "
                                 "code); save the weights as model.safetensors") from None
    raise FileNotFoundError(f"{folder}: no {' or '.join(HF_WEIGHT_FILES)}")


def read_hf_config(config_path: str) -> tuple[Any, HFAdapter]:
    """Our config of a `transformers` config.json, and its encoder's adapter; a model no
    encoder of ours is, or a value ours cannot hold, raises ValueError naming the file."""
    values = storage.read_json(config_path)
    model_type = values.get("model_type", "bert")  # configs before transformers 2 have none
    adapters = {entry.hf.MODEL_TYPE: entry.hf for entry in ENCODERS.values()}
    if model_type not in adapters:
        raise ValueError(f"{config_path}: model_type {model_type!r}, not one of "
                         f"{', '.join(sorted(adapters))}")
    adapter = adapters[model_type]
    try:
        return adapter.config_from_hf(values), adapter
    except (ValueError, TypeError) as error:  # TypeError: a value of the wrong type ("384")
        raise ValueError(f"{config_path}: {error}") from None


def load_hf_checkpoint(folder: str, next_sentence: bool | None = None
                       ) -> BertForPreTraining | BertForNextToken:
    """Our `BertForPreTraining` (its `.config` is the encoder's config) from a `transformers`
    folder, or `BertForNextToken` where the config attends left to right (`is_decoder`).
    `next_sentence`: None = as the encoder's checkpoints have it (BERT's NSP head; ModernBERT's
    masked LM only; the left-to-right LM's none).

    Encoder weights must all be present; missing head weights (a bare encoder checkpoint has no
    MLM head) keep their initialisation and are logged.
    """
    config, adapter = read_hf_config(storage.join(folder, "config.json"))
    hf_state, path = read_hf_weights(folder)
    state, ignored = adapter.state_from_hf(hf_state)
    if config.is_decoder:  # a BertLMHeadModel: the left-to-right LM, which has no NSP head
        if next_sentence:
            raise ValueError(f"{folder}: a left-to-right model (is_decoder) has no "
                             "next-sentence head; load it with next_sentence=False")
        model = BertForNextToken(config)
    else:
        model = BertForPreTraining(config, next_sentence=adapter.NEXT_SENTENCE
                                   if next_sentence is None else next_sentence)
    _check_tied_decoder(hf_state, state, path, adapter)
    _load_into(model, state, path, ignored, adapter)
    return model


def load_hf_encoder(folder: str) -> nn.Module:
    """Our encoder from a `transformers` folder (any head keys are ignored)."""
    return load_hf_checkpoint(folder).bert


def _check_tied_decoder(hf_state: dict[str, Tensor], state: dict[str, Tensor], path: str,
                        adapter: HFAdapter) -> None:
    decoder = hf_state.get(adapter.TIED_DECODER)
    word = state.get(WORD_EMBEDDINGS)
    if decoder is not None and word is not None and not torch.equal(decoder, word):
        raise ValueError(f"{path}: {adapter.TIED_DECODER} differs from the word embeddings; "
                         "the model ties them and cannot hold an untied decoder")


def tied_keys(model: nn.Module) -> set[str]:
    """Keys of `model.state_dict()` whose tensor is an earlier key's: the MLM decoder (the word
    embedding) and, on ModernBERT, the MLM transform (the encoder's prediction head). Our
    checkpoints store each tensor once; loading the first key fills the others."""
    seen: set[int] = set()
    tied: set[str] = set()
    for key, value in model.state_dict(keep_vars=True).items():
        if id(value) in seen:
            tied.add(key)
        seen.add(id(value))
    return tied


def _load_into(model: nn.Module, state: dict[str, Tensor], path: str, ignored: list[str],
               adapter: HFAdapter) -> None:
    result = model.load_state_dict(state, strict=False)
    tied = tied_keys(model)
    missing = [k for k in result.missing_keys if k not in tied]
    required = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if required:
        raise ValueError(f"{path}: encoder weights missing from the checkpoint: {required}")
    if missing:
        log.warning("%s: no weights for %s; they keep their initialisation", path, missing)
    extra = list(result.unexpected_keys) + [k for k in ignored
                                            if not _expected_ignored(k, adapter)]
    if extra:
        log.warning("%s: ignored keys not used by %s: %s", path, type(model).__name__, extra)


def _expected_ignored(hf_key: str, adapter: HFAdapter) -> bool:
    return hf_key.endswith("position_ids") or hf_key in (
        adapter.TIED_DECODER, adapter.TIED_DECODER.removesuffix(".weight") + ".bias")


def _config_from(path: str, values: dict) -> Any:
    """The encoder config of our checkpoint file's values (`arch` says which encoder); a bad
    value is an error naming the file."""
    try:
        return config_from_dict(values)
    except (ValueError, TypeError) as error:  # TypeError: a value of the wrong type ("384")
        raise ValueError(f"{path}: {error}") from None


def vocab_do_lower_case(vocab_dir: str) -> bool:
    """Whether a vocabulary folder's tokenizer lower-cases: `do_lower_case` of its
    `tokenizer_config.json` (train_vocab --cased writes false); True when the folder has none
    (a bare `vocab.txt`, BERT's uncased default)."""
    path = storage.join(vocab_dir, "tokenizer_config.json")
    if not storage.exists(path):
        return True
    value = storage.read_json(path).get("do_lower_case", True)
    if not isinstance(value, bool):
        raise ValueError(f"{path}: do_lower_case must be true or false, got {value!r}")  # noqa: TRY004 (a bad file)
    return value


def head_of(model: nn.Module) -> tuple[str, dict]:
    """(kind, constructor options) of one of our models (a bare encoder: "encoder", {})."""
    if getattr(model, "kind", None) in HEADS:
        return model.kind, model.options()
    if any(isinstance(model, entry.model) for entry in ENCODERS.values()):
        return "encoder", {}
    raise TypeError(f"{type(model).__name__} is none of our models (model/heads.py HEADS or "
                    "an encoder of model/encoders.py)")


def export_hf_folder(model: nn.Module, vocab_dir: str, out_dir: str,
                     do_lower_case: bool | None = None) -> None:
    """Write `config.json`, `model.safetensors`, `vocab.txt`, `tokenizer.json` and the tokenizer
    configs for `transformers`: the class of the model's head on its encoder (BERT's
    `BertForPreTraining`, `BertForSequenceClassification`, ...; ModernBERT's
    `ModernBertForMaskedLM`, ...), or the bare encoder.

    `do_lower_case`: None = as the vocabulary folder says (`vocab_do_lower_case`)."""
    if do_lower_case is None:
        do_lower_case = vocab_do_lower_case(vocab_dir)
    vocab = read_vocab(vocab_dir)
    config = model.config
    if len(vocab) != config.vocab_size:
        raise ValueError(f"{vocab_dir}: {len(vocab)} tokens but the model has vocab_size "
                         f"{config.vocab_size}")
    kind, options = head_of(model)
    adapter = encoder_of(config).hf
    extra = {}
    if "num_labels" in options:
        extra["num_labels"] = options["num_labels"]
    if kind == "classification":
        extra["problem_type"] = ("regression" if options["num_labels"] == 1 else
                                 "single_label_classification")
    extra.update({key: vocab.index(token) for key, token in adapter.TOKEN_IDS.items()})
    prefix = "" if kind == "encoder" else adapter.ENCODER_PREFIX
    state = dict(model.state_dict()) if kind != "encoder" else {
        f"bert.{k}": v for k, v in model.state_dict().items()}
    state[WORD_EMBEDDINGS] = state[WORD_EMBEDDINGS][:config.vocab_size]  # past it: padding rows
    hf_state = adapter.state_to_hf(state, prefix)
    hf_state = {k: v.detach().float().contiguous().cpu() for k, v in hf_state.items()}
    storage.makedirs(out_dir)
    # A BPE vocabulary's merges travel with it (None for WordPiece: the folder as before).
    save_tokenizer_folder(vocab, out_dir, do_lower_case, merges=read_merges(vocab_dir))
    storage.atomic_write_bytes(storage.join(out_dir, "model.safetensors"),
                               save_safetensors_bytes(hf_state, metadata={"format": "pt"}))
    storage.atomic_write_json(storage.join(out_dir, "config.json"), adapter.hf_config(
        config, adapter.architecture(kind, model), **extra))


def save_checkpoint(model: nn.Module, folder: str) -> None:
    """Our format: `bert.safetensors` (our keys, tied decoder stored once) + `bert_config.json`
    (the encoder's config with its arch, and the head's kind and options)."""
    kind, options = head_of(model)
    tied = tied_keys(model)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
             if k not in tied}
    storage.makedirs(folder)
    storage.atomic_write_bytes(storage.join(folder, CHECKPOINT_WEIGHTS),
                               save_safetensors_bytes(state, metadata={"format": "pt"}))
    storage.atomic_write_json(storage.join(folder, CHECKPOINT_CONFIG),
                              {"config": config_to_dict(model.config),
                               "head": {"kind": kind, **options}})


def load_checkpoint(folder: str) -> nn.Module:
    """The model `save_checkpoint` wrote, with exactly its parameters."""
    config_path = storage.join(folder, CHECKPOINT_CONFIG)
    meta = storage.read_json(config_path)
    config, head = _config_from(config_path, meta["config"]), dict(meta["head"])
    kind = head.pop("kind")
    if kind == BertForPreTraining.kind and config.is_decoder:
        # a causal pre-training model is the left-to-right LM: the same keys, its own head
        kind, head = BertForNextToken.kind, {}
    if kind == "encoder":
        model = build_encoder(config)
    elif kind in HEADS:
        model = HEADS[kind](config, **head)
    else:
        raise ValueError(f"{folder}/{CHECKPOINT_CONFIG}: unknown head kind {kind!r}")
    path = storage.join(folder, CHECKPOINT_WEIGHTS)
    with storage.open_read(path, "rb") as f:
        state = load_safetensors_bytes(f.read())
    result = model.load_state_dict(state, strict=False)
    tied = tied_keys(model)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(f"{path}: missing {missing}, unexpected {result.unexpected_keys}")
    return model


@dataclass(frozen=True)
class StartingPoint:
    """A checkpoint to continue pre-training from (`training/config_sections.py` `init_from`)."""
    folder: str
    """The folder read: the one given, or a pre-training run's `hf/` export inside it."""
    config: Any
    """Its encoder's config (`arch`, shape, activation, LayerNorm epsilon, initializer range)."""
    config_file: str
    """The file the shape came from (`config.json`, or our `bert_config.json`)."""
    weights_file: str
    """The weights file (`model.safetensors`, `pytorch_model.bin` or our `bert.safetensors`)."""


def find_starting_point(folder: str) -> StartingPoint:
    """Where a checkpoint's shape and weights are, without reading the weights: a Hugging Face
    folder of a registered encoder (`config.json` + `model.safetensors` or `pytorch_model.bin`;
    our exports are such folders), one of `save_checkpoint`'s (`bert_config.json` +
    `bert.safetensors`), or a pre-training run's output folder (its `hf/` export)."""
    folder = folder.rstrip("/")
    ours = storage.join(folder, CHECKPOINT_CONFIG)
    if storage.exists(ours):
        values = storage.read_json(ours)
        if not isinstance(values, dict) or "config" not in values:
            raise ValueError(f"{ours}: expected {{'config': ..., 'head': ...}} as "
                             "model/hf.py save_checkpoint writes it")
        return StartingPoint(folder, _config_from(ours, values["config"]), ours,
                             storage.join(folder, CHECKPOINT_WEIGHTS))
    config_path = storage.join(folder, "config.json")
    if storage.exists(config_path):
        config, _ = read_hf_config(config_path)
        weights = next((storage.join(folder, n) for n in HF_WEIGHT_FILES
                        if storage.exists(storage.join(folder, n))), None)
        if weights is None:
            raise FileNotFoundError(f"{folder}: no {' or '.join(HF_WEIGHT_FILES)} beside "
                                    "config.json")
        return StartingPoint(folder, config, config_path, weights)
    export = storage.join(folder, "hf")
    if storage.exists(storage.join(export, "config.json")):
        return find_starting_point(export)
    raise FileNotFoundError(
        f"{folder}: not a BERT checkpoint (looked for a Hugging Face config.json, our "
        f"{CHECKPOINT_CONFIG}, and a pre-training run's hf/ export)")


def read_starting_weights(start: StartingPoint) -> tuple[dict[str, Tensor], list[str]]:
    """The checkpoint's weights in our `BertForPreTraining` keys, and the keys set aside
    (other tasks' heads, position-id buffers). The tied MLM decoder is checked, not kept."""
    path = start.weights_file
    if start.config_file.endswith(CHECKPOINT_CONFIG):
        with storage.open_read(path, "rb") as f:
            state = load_safetensors_bytes(f.read())
        head = storage.read_json(start.config_file).get("head", {}).get("kind")
        if head == "encoder":  # a bare encoder: our keys without the `bert.` prefix
            state = {f"bert.{k}": v for k, v in state.items()}
        ignored = [k for k in state if not k.startswith(("bert.", "mlm.", "nsp."))]
        return {k: v for k, v in state.items() if k not in ignored}, ignored
    _, adapter = read_hf_config(start.config_file)
    hf_state, path = read_hf_weights(start.folder)
    state, ignored = adapter.state_from_hf(hf_state)
    _check_tied_decoder(hf_state, state, path, adapter)
    return state, [k for k in ignored if not _expected_ignored(k, adapter)]
