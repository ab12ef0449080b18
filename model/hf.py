"""Hugging Face interop (the one place that knows `transformers`' BERT key names) and our
own checkpoint format.

- `load_hf_checkpoint(folder)`: a `transformers` BERT folder (`config.json` + `model.safetensors`
  or `pytorch_model.bin`, with `BertModel` keys or `bert.`/`cls.` `BertForPreTraining` keys)
  -> our `BertForPreTraining` (heads absent from the checkpoint keep their fresh initialisation).
- `export_hf_folder(model, vocab_dir, out_dir)`: -> a folder that
  `transformers.BertForPreTraining.from_pretrained` and `AutoTokenizer.from_pretrained` load,
  lower-casing or not as the vocabulary folder's `tokenizer_config.json` says.
- `save_checkpoint(model, folder)` / `load_checkpoint(folder)`: our keys in
  `bert.safetensors` + `bert_config.json` (our `BertConfig` and the head kind).
"""
from __future__ import annotations

import io
import logging
import pickle
import re
from dataclasses import dataclass

import torch
from safetensors.torch import load as load_safetensors_bytes
from safetensors.torch import save as save_safetensors_bytes
from torch import Tensor, nn

from common import storage
from common.tokenization import read_vocab, save_tokenizer_folder
from model.bert import BertConfig, BertModel
from model.heads import (
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

log = logging.getLogger(__name__)

HF_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CHECKPOINT_WEIGHTS = "bert.safetensors"
CHECKPOINT_CONFIG = "bert_config.json"

# Ours <- Hugging Face, outside the layers ("bert." stripped from HF keys first).
_TOP_LEVEL = {
    "embeddings.word": "embeddings.word_embeddings",
    "embeddings.position": "embeddings.position_embeddings",
    "embeddings.token_type": "embeddings.token_type_embeddings",
    "embeddings.norm": "embeddings.LayerNorm",
    "pooler.dense": "pooler.dense",
}
# Ours <- Hugging Face, inside layer i ("layers.{i}." <- "encoder.layer.{i}.").
_LAYER = {
    "attention.out": "attention.output.dense",
    "attention_norm": "attention.output.LayerNorm",
    "intermediate": "intermediate.dense",
    "output": "output.dense",
    "output_norm": "output.LayerNorm",
}
# Ours <- Hugging Face, heads (HF keys keep their "cls." prefix; not under "bert.").
_HEADS = {
    "mlm.dense": "cls.predictions.transform.dense",
    "mlm.norm": "cls.predictions.transform.LayerNorm",
    "nsp": "cls.seq_relationship",
    "classifier": "classifier",
    "qa_outputs": "qa_outputs",
}
_UNPREFIXED_HEADS = ("classifier", "qa_outputs")  # HF keeps them beside `bert.`, not in `cls.`
_QKV = ("query", "key", "value")


def _hf_names() -> dict[str, str]:
    """HF module path -> our module path, for everything but the fused QKV and layer index."""
    names = {hf: "bert." + ours for ours, hf in _TOP_LEVEL.items()}
    names.update({hf: ours for ours, hf in _HEADS.items()})
    return names


def hf_to_ours(hf_state: dict[str, Tensor]) -> tuple[dict[str, Tensor], list[str]]:
    """HF BERT state dict -> (our state dict with `bert.` prefixes, ignored HF keys)."""
    state, ignored, qkv = {}, [], {}
    names = _hf_names()
    layer_names = {hf: ours for ours, hf in _LAYER.items()}
    for key, value in hf_state.items():
        key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", key))  # TF-era names
        key = key.removeprefix("bert.")
        module, _, param = key.rpartition(".")
        if m := re.fullmatch(r"encoder\.layer\.(\d+)\.attention\.self\.(query|key|value)", module):
            qkv[(int(m[1]), param, m[2])] = value
        elif m := re.fullmatch(r"encoder\.layer\.(\d+)\.(.+)", module):
            if m[2] not in layer_names:
                ignored.append(key)
                continue
            state[f"bert.layers.{m[1]}.{layer_names[m[2]]}.{param}"] = value
        elif module in names:
            state[f"{names[module]}.{param}"] = value
        elif key == "cls.predictions.bias":
            state["mlm.bias"] = value
        else:  # position_ids buffers, the tied decoder (checked below), other tasks' heads
            ignored.append(key)
    for layer, param in sorted({(i, p) for i, p, _ in qkv}):
        parts = [qkv.get((layer, param, name)) for name in _QKV]
        if any(p is None for p in parts):
            raise ValueError(f"layer {layer}: query/key/value {param} incomplete in checkpoint")
        state[f"bert.layers.{layer}.attention.qkv.{param}"] = torch.cat(parts, dim=0)  # (3H, ...)
    return state, ignored


def ours_to_hf(state: dict[str, Tensor], prefix: str = "bert.") -> dict[str, Tensor]:
    """Our state dict -> HF keys (`bert.` + BertModel keys, `cls.` heads, `classifier.`,
    `qa_outputs.`)."""
    names = {ours: hf for hf, ours in _hf_names().items()}
    out = {}
    for key, value in state.items():
        module, _, param = key.rpartition(".")
        if module == "mlm.decoder":
            continue  # tied to the word embeddings; transformers re-ties it on load
        if key == "mlm.bias":
            out["cls.predictions.bias"] = value
        elif m := re.fullmatch(r"bert\.layers\.(\d+)\.attention\.qkv", module):
            for name, part in zip(_QKV, value.chunk(3, dim=0)):  # (3H, ...) -> 3 x (H, ...)
                out[f"{prefix}encoder.layer.{m[1]}.attention.self.{name}.{param}"] = part
        elif m := re.fullmatch(r"bert\.layers\.(\d+)\.(.+)", module):
            out[f"{prefix}encoder.layer.{m[1]}.{_LAYER[m[2]]}.{param}"] = value
        elif module in names:
            hf = names[module]
            under = "" if hf.startswith("cls.") or hf in _UNPREFIXED_HEADS else prefix
            out[f"{under}{hf}.{param}"] = value
        else:
            raise KeyError(f"no Hugging Face name for parameter {key!r}")
    return out


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


def read_bert_config(config_path: str) -> dict:
    """A `transformers` config.json's values; a model other than BERT, or BERT with other than
    absolute positions, raises ValueError naming the file."""
    values = storage.read_json(config_path)
    if values.get("model_type", "bert") != "bert":  # configs before transformers 2 have none
        raise ValueError(f"{config_path}: model_type {values['model_type']!r}, not a BERT "
                         "checkpoint")
    if values.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"{config_path}: position_embedding_type "
                         f"{values['position_embedding_type']!r}; this BERT has absolute positions")
    return values


def load_hf_checkpoint(folder: str, next_sentence: bool = True) -> BertForPreTraining:
    """Our `BertForPreTraining` (its `.config` is the `BertConfig`) from a `transformers` folder.

    Encoder weights must all be present; missing head weights (a `BertModel` checkpoint has no
    `cls.`) keep BERT's initialisation and are logged.
    """
    config_path = storage.join(folder, "config.json")
    config = _config_from(config_path, read_bert_config(config_path))
    hf_state, path = read_hf_weights(folder)
    state, ignored = hf_to_ours(hf_state)
    model = BertForPreTraining(config, next_sentence=next_sentence)
    _check_tied_decoder(hf_state, state, path)
    _load_into(model, state, path, ignored)
    return model


def load_hf_encoder(folder: str) -> BertModel:
    """Our `BertModel` from a `transformers` folder (any BERT head keys are ignored)."""
    return load_hf_checkpoint(folder).bert


def _check_tied_decoder(hf_state: dict[str, Tensor], state: dict[str, Tensor], path: str) -> None:
    decoder = hf_state.get("cls.predictions.decoder.weight")
    word = state.get("bert.embeddings.word.weight")
    if decoder is not None and word is not None and not torch.equal(decoder, word):
        raise ValueError(f"{path}: cls.predictions.decoder.weight differs from the word "
                         "embeddings; BERT ties them and this model cannot hold an untied decoder")


def _load_into(model: nn.Module, state: dict[str, Tensor], path: str, ignored: list[str]) -> None:
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k != "mlm.decoder.weight"]
    required = [k for k in missing if k.startswith("bert.") and not k.startswith("bert.pooler.")]
    if required:
        raise ValueError(f"{path}: encoder weights missing from the checkpoint: {required}")
    if missing:
        log.warning("%s: no weights for %s; they keep their initialisation", path, missing)
    extra = list(result.unexpected_keys) + [k for k in ignored if not _expected_ignored(k)]
    if extra:
        log.warning("%s: ignored keys not used by %s: %s", path, type(model).__name__, extra)


def _expected_ignored(hf_key: str) -> bool:
    return hf_key.endswith("position_ids") or hf_key in (
        "cls.predictions.decoder.weight", "cls.predictions.decoder.bias")


def _config_from(path: str, values: dict) -> BertConfig:
    """The `BertConfig` of a config file's values; a bad value is an error naming the file."""
    try:
        return BertConfig.from_dict(values)
    except (ValueError, TypeError) as error:  # TypeError: a value of the wrong type ("384")
        raise ValueError(f"{path}: {error}") from None


def hf_config_dict(config: BertConfig, architecture: str, **extra) -> dict:
    """`config.json` contents as `transformers.BertConfig` writes them."""
    import transformers

    values = config.to_dict()
    del values["vocab_multiple"]  # the export holds vocab_size rows
    hf_config = transformers.BertConfig(**values, architectures=[architecture], **extra)
    return hf_config.to_dict()


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


def export_hf_folder(model: nn.Module, vocab_dir: str, out_dir: str,
                     do_lower_case: bool | None = None) -> None:
    """Write `config.json`, `model.safetensors`, `vocab.txt`, `tokenizer.json` and the tokenizer
    configs for `transformers` (BertForPreTraining, BertForSequenceClassification,
    BertForQuestionAnswering, BertForMultipleChoice, BertForTokenClassification or BertModel).

    `do_lower_case`: None = as the vocabulary folder says (`vocab_do_lower_case`)."""
    if do_lower_case is None:
        do_lower_case = vocab_do_lower_case(vocab_dir)
    vocab = read_vocab(vocab_dir)
    config: BertConfig = model.config
    if len(vocab) != config.vocab_size:
        raise ValueError(f"{vocab_dir}: {len(vocab)} tokens but the model has vocab_size "
                         f"{config.vocab_size}")
    extra = {}
    if isinstance(model, BertForPreTraining):
        architecture = ("BertLMHeadModel" if config.is_decoder else  # left-to-right LM
                        "BertForPreTraining" if model.nsp is not None else "BertForMaskedLM")
        prefix = "bert."
    elif isinstance(model, BertForSequenceClassification):
        architecture, prefix = "BertForSequenceClassification", "bert."
        extra = {"num_labels": model.num_labels,
                 "problem_type": "regression" if model.num_labels == 1 else
                 "single_label_classification"}
    elif isinstance(model, BertForQuestionAnswering):
        architecture, prefix = "BertForQuestionAnswering", "bert."
    elif isinstance(model, BertForMultipleChoice):
        architecture, prefix = "BertForMultipleChoice", "bert."
    elif isinstance(model, BertForTokenClassification):
        architecture, prefix = "BertForTokenClassification", "bert."
        extra = {"num_labels": model.num_labels}
    elif isinstance(model, BertModel):
        architecture, prefix = "BertModel", ""
    else:
        raise TypeError(f"cannot export {type(model).__name__} to Hugging Face")
    state = model.state_dict() if prefix else {f"bert.{k}": v for k, v in model.state_dict().items()}
    hf_state = ours_to_hf(state, prefix=prefix)
    word = f"{prefix}embeddings.word_embeddings.weight"
    hf_state[word] = hf_state[word][:config.vocab_size]  # rows past the vocabulary: padding
    hf_state = {k: v.detach().float().contiguous().cpu() for k, v in hf_state.items()}
    storage.makedirs(out_dir)
    save_tokenizer_folder(vocab, out_dir, do_lower_case)
    storage.atomic_write_bytes(storage.join(out_dir, "model.safetensors"),
                               save_safetensors_bytes(hf_state, metadata={"format": "pt"}))
    storage.atomic_write_json(storage.join(out_dir, "config.json"),
                              hf_config_dict(config, architecture, **extra))


def save_checkpoint(model: nn.Module, folder: str) -> None:
    """Our format: `bert.safetensors` (our keys, tied decoder stored once) + `bert_config.json`."""
    if isinstance(model, BertForPreTraining):
        head = {"kind": "pretraining", "next_sentence": model.nsp is not None}
    elif isinstance(model, BertForSequenceClassification):
        head = {"kind": "classification", "num_labels": model.num_labels}
    elif isinstance(model, BertForQuestionAnswering):
        head = {"kind": "question_answering"}
    elif isinstance(model, BertForMultipleChoice):
        head = {"kind": "multiple_choice"}
    elif isinstance(model, BertForTokenClassification):
        head = {"kind": "token_classification", "num_labels": model.num_labels}
    elif isinstance(model, BertModel):
        head = {"kind": "encoder"}
    else:
        raise TypeError(f"cannot save {type(model).__name__}")
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()
             if k != "mlm.decoder.weight"}
    storage.makedirs(folder)
    storage.atomic_write_bytes(storage.join(folder, CHECKPOINT_WEIGHTS),
                               save_safetensors_bytes(state, metadata={"format": "pt"}))
    storage.atomic_write_json(storage.join(folder, CHECKPOINT_CONFIG),
                              {"config": model.config.to_dict(), "head": head})


def load_checkpoint(folder: str) -> nn.Module:
    """The model `save_checkpoint` wrote, with exactly its parameters."""
    config_path = storage.join(folder, CHECKPOINT_CONFIG)
    meta = storage.read_json(config_path)
    config, head = _config_from(config_path, meta["config"]), meta["head"]
    if head["kind"] == "pretraining":
        model: nn.Module = BertForPreTraining(config, next_sentence=head["next_sentence"])
    elif head["kind"] == "classification":
        model = BertForSequenceClassification(config, head["num_labels"])
    elif head["kind"] == "question_answering":
        model = BertForQuestionAnswering(config)
    elif head["kind"] == "multiple_choice":
        model = BertForMultipleChoice(config)
    elif head["kind"] == "token_classification":
        model = BertForTokenClassification(config, head["num_labels"])
    elif head["kind"] == "encoder":
        model = BertModel(config)
    else:
        raise ValueError(f"{folder}/{CHECKPOINT_CONFIG}: unknown head kind {head['kind']!r}")
    path = storage.join(folder, CHECKPOINT_WEIGHTS)
    with storage.open_read(path, "rb") as f:
        state = load_safetensors_bytes(f.read())
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if k != "mlm.decoder.weight"]
    if missing or result.unexpected_keys:
        raise ValueError(f"{path}: missing {missing}, unexpected {result.unexpected_keys}")
    return model


@dataclass(frozen=True)
class StartingPoint:
    """A checkpoint to continue pre-training from (`training/config.py` `init_from`)."""
    folder: str
    """The folder read: the one given, or a pre-training run's `hf/` export inside it."""
    config: BertConfig
    """Its shape (and activation, LayerNorm epsilon, initializer range)."""
    config_file: str
    """The file the shape came from (`config.json`, or our `bert_config.json`)."""
    weights_file: str
    """The weights file (`model.safetensors`, `pytorch_model.bin` or our `bert.safetensors`)."""


def find_starting_point(folder: str) -> StartingPoint:
    """Where a checkpoint's shape and weights are, without reading the weights: a Hugging Face
    BERT folder (`config.json` + `model.safetensors` or `pytorch_model.bin`; our exports are
    such folders), one of `save_checkpoint`'s (`bert_config.json` + `bert.safetensors`), or a
    pre-training run's output folder (its `hf/` export)."""
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
        values = read_bert_config(config_path)
        weights = next((storage.join(folder, n) for n in HF_WEIGHT_FILES
                        if storage.exists(storage.join(folder, n))), None)
        if weights is None:
            raise FileNotFoundError(f"{folder}: no {' or '.join(HF_WEIGHT_FILES)} beside "
                                    "config.json")
        return StartingPoint(folder, _config_from(config_path, values), config_path, weights)
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
        if head == "encoder":  # a bare BertModel: our keys without the `bert.` prefix
            state = {f"bert.{k}": v for k, v in state.items()}
        ignored = [k for k in state if not k.startswith(("bert.", "mlm.", "nsp."))]
        return {k: v for k, v in state.items() if k not in ignored}, ignored
    hf_state, path = read_hf_weights(start.folder)
    state, ignored = hf_to_ours(hf_state)
    _check_tied_decoder(hf_state, state, path)
    return state, [k for k in ignored if not _expected_ignored(k)]
