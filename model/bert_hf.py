"""BERT's Hugging Face adapter (the one place that knows `transformers`' BERT key names):
config and state dict both ways, and the transformers class of each of our models.

Our encoder keys start with `bert.`; transformers' BERT task models keep the encoder under
`bert.` too (a bare `BertModel` without a prefix), the pre-training heads under `cls.`, and
`classifier` / `qa_outputs` beside the encoder.
"""
from __future__ import annotations

import re

import torch
from torch import Tensor, nn

from model.bert import BertConfig

MODEL_TYPE = "bert"
ENCODER_PREFIX = "bert."
TIED_DECODER = "cls.predictions.decoder.weight"
NEXT_SENTENCE = True
"""BERT's checkpoints carry the next-sentence head."""
TOKEN_IDS: dict[str, str] = {}
"""config.json's special-token ids the export takes from the vocabulary: none (transformers'
`BertConfig` writes `pad_token_id`, ours)."""

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

# transformers' class of each of our models (model/heads.py `kind`).
_ARCHITECTURES = {
    "classification": "BertForSequenceClassification",
    "question_answering": "BertForQuestionAnswering",
    "multiple_choice": "BertForMultipleChoice",
    "token_classification": "BertForTokenClassification",
    "next_token": "BertLMHeadModel",  # the left-to-right LM (its config says is_decoder)
    "encoder": "BertModel",
}


def architecture(kind: str, model: nn.Module) -> str:
    """transformers' class name for our model of head `kind`."""
    if kind == "pretraining":
        return "BertForPreTraining" if model.nsp is not None else "BertForMaskedLM"
    return _ARCHITECTURES[kind]


def _hf_names() -> dict[str, str]:
    """HF module path -> our module path, for everything but the fused QKV and layer index."""
    names = {hf: "bert." + ours for ours, hf in _TOP_LEVEL.items()}
    names.update({hf: ours for ours, hf in _HEADS.items()})
    return names


def state_from_hf(hf_state: dict[str, Tensor], kind: str | None = None
                  ) -> tuple[dict[str, Tensor], list[str]]:
    """HF BERT state dict -> (our state dict with `bert.` prefixes, ignored HF keys). `kind`,
    the head the weights are for, is not needed: BERT's keys name each head."""
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
        else:  # position_ids buffers, the tied decoder (checked by the caller), other heads
            ignored.append(key)
    for layer, param in sorted({(i, p) for i, p, _ in qkv}):
        parts = [qkv.get((layer, param, name)) for name in _QKV]
        if any(p is None for p in parts):
            raise ValueError(f"layer {layer}: query/key/value {param} incomplete in checkpoint")
        state[f"bert.layers.{layer}.attention.qkv.{param}"] = torch.cat(parts, dim=0)  # (3H, ...)
    return state, ignored


def state_to_hf(state: dict[str, Tensor], prefix: str = "bert.") -> dict[str, Tensor]:
    """Our state dict -> HF keys (`prefix` + BertModel keys, `cls.` heads, `classifier.`,
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


def config_from_hf(values: dict) -> BertConfig:
    """Our `BertConfig` of a transformers BERT `config.json`; a model other than BERT, or BERT
    with other than absolute positions, raises ValueError (the caller names the file)."""
    if values.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {values['position_embedding_type']!r}; this "
                         "BERT has absolute positions")
    return BertConfig.from_dict(values)


def hf_config(config: BertConfig, architecture: str, **extra) -> dict:
    """`config.json` contents as `transformers.BertConfig` writes them."""
    import transformers

    values = config.to_dict()
    del values["vocab_multiple"]  # the export holds vocab_size rows
    hf = transformers.BertConfig(**values, architectures=[architecture], **extra)
    return hf.to_dict()
