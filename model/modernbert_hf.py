"""ModernBERT's Hugging Face adapter (the one place that knows `transformers`' ModernBERT key
names): config and state dict both ways, and the transformers class of each of our models.

Our encoder keys start with `bert.` (the heads' name for any encoder); transformers' ModernBERT
task models keep the encoder under `model.` (a bare `ModernBertModel` without a prefix), the
prediction head as `head.`, the tied decoder as `decoder.`, and the last layer as `classifier.`.
"""
from __future__ import annotations

import re
from typing import Any

from torch import Tensor, nn

from model.modernbert import ModernBertConfig

MODEL_TYPE = "modernbert"
"""transformers' `model_type`."""
ENCODER_PREFIX = "model."
"""Where transformers' task models keep the encoder."""
TIED_DECODER = "decoder.weight"
"""transformers' key of the MLM decoder weight, tied to the word embeddings."""
NEXT_SENTENCE = False
"""ModernBERT's checkpoints carry no next-sentence head (it was trained on MLM alone)."""
TOKEN_IDS = {"bos_token_id": "[CLS]", "cls_token_id": "[CLS]", "eos_token_id": "[SEP]",
             "sep_token_id": "[SEP]", "pad_token_id": "[PAD]", "mask_token_id": "[MASK]"}
"""config.json's special-token ids -> the token whose id the export writes there (its
vocabulary's, model/hf.py): ModernBERT's own tokenizer begins and ends with [CLS] and [SEP]."""

# Ours <- Hugging Face, outside the layers (encoder prefix stripped).
_TOP_LEVEL = {
    "embeddings.word": "embeddings.tok_embeddings",
    "embeddings.norm": "embeddings.norm",
    "final_norm": "final_norm",
}
# Ours <- Hugging Face, inside layer i ("layers.{i}." on both sides).
_LAYER = {
    "attn_norm": "attn_norm",
    "attention.qkv": "attn.Wqkv",
    "attention.out": "attn.Wo",
    "mlp_norm": "mlp_norm",
    "mlp.wi": "mlp.Wi",
    "mlp.wo": "mlp.Wo",
}
_HEAD = ("dense", "norm")  # transformers' `head.*`: our pooler, and the MLM transform
# Our name of transformers' `classifier` by head kind: its question-answering model calls the
# span layer `classifier`, ours (as BERT's) `qa_outputs`.
_CLASSIFIER = {"question_answering": "qa_outputs"}
_ARCHITECTURES = {
    "encoder": "ModernBertModel",
    "pretraining": "ModernBertForMaskedLM",
    "classification": "ModernBertForSequenceClassification",
    "token_classification": "ModernBertForTokenClassification",
    "question_answering": "ModernBertForQuestionAnswering",
    "multiple_choice": "ModernBertForMultipleChoice",
}


def architecture(kind: str, model: nn.Module | None = None) -> str:
    """transformers' class name of a model of head `kind` (model/hf.py's kinds)."""
    if kind not in _ARCHITECTURES:
        raise ValueError(f"no ModernBERT architecture for head kind {kind!r}: "
                         f"expected one of {sorted(_ARCHITECTURES)}")
    return _ARCHITECTURES[kind]


def hf_config(config: ModernBertConfig, architecture: str = "ModernBertForMaskedLM",
              **extra: Any) -> dict[str, Any]:
    """A transformers `ModernBertConfig` dict (config.json) of `config`. Both the layer pattern
    and RoPE bases are written in transformers 5's form (`layer_types`, `rope_parameters`) and
    in 4.x's (`global_attn_every_n_layers`, `global_rope_theta`, `local_rope_theta`); `extra`
    adds or overrides keys (`num_labels`; the vocabulary's special-token ids, `TOKEN_IDS`, which
    the export passes: without them transformers' defaults, those of ModernBERT's tokenizer,
    stand)."""
    c = config
    values = {
        "architectures": [architecture],
        "model_type": MODEL_TYPE,
        "vocab_size": c.vocab_size,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers,
        "num_attention_heads": c.num_attention_heads,
        "hidden_activation": c.hidden_act,
        "max_position_embeddings": c.max_position_embeddings,
        "initializer_range": c.initializer_range,
        "initializer_cutoff_factor": c.initializer_cutoff_factor,
        "norm_eps": c.layer_norm_eps,
        "norm_bias": False,
        "pad_token_id": c.pad_token_id,
        "attention_bias": False,
        "attention_dropout": c.attention_dropout,
        "layer_types": ["full_attention" if c.is_global(i) else "sliding_attention"
                        for i in range(c.num_hidden_layers)],
        "global_attn_every_n_layers": c.global_attn_every_n_layers,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": c.global_rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": c.local_rope_theta},
        },
        "global_rope_theta": c.global_rope_theta,
        "local_rope_theta": c.local_rope_theta,
        "local_attention": c.local_attention,
        "embedding_dropout": c.embedding_dropout,
        "mlp_bias": False,
        "mlp_dropout": c.mlp_dropout,
        "decoder_bias": True,
        "classifier_pooling": c.classifier_pooling,
        "classifier_dropout": c.hidden_dropout_prob,
        "classifier_bias": False,
        "classifier_activation": c.hidden_act,
        "tie_word_embeddings": True,
    }
    return {**values, **extra}


HF_PAD_TOKEN_ID = 50283
"""transformers' ModernBERT padding id where a config.json names none."""


def config_from_hf(values: dict[str, Any]) -> ModernBertConfig:
    """Our config from a transformers ModernBERT config dict (5.x or 4.x keys). Settings our
    encoder does not have (biases, other RoPE types, a layer pattern that is not
    every n-th layer global) are refused in one line."""
    for name, wanted in (("norm_bias", False), ("attention_bias", False), ("mlp_bias", False),
                         ("classifier_bias", False), ("decoder_bias", True)):
        if name in values and values[name] != wanted:
            raise ValueError(f"{name}={values[name]!r} is not supported (only {wanted!r})")
    activation = values.get("hidden_activation", ModernBertConfig.hidden_act)
    if values.get("classifier_activation", activation) != activation:
        raise ValueError(f"classifier_activation {values['classifier_activation']!r} differs from "
                         f"hidden_activation {activation!r}: one hidden_act serves both here")
    layers = values.get("num_hidden_layers", ModernBertConfig.num_hidden_layers)
    every = values.get("global_attn_every_n_layers", ModernBertConfig.global_attn_every_n_layers)
    global_theta = values.get("global_rope_theta", ModernBertConfig.global_rope_theta)
    local_theta = values.get("local_rope_theta", ModernBertConfig.local_rope_theta)
    if values.get("layer_types") is not None:
        every = _global_period(values["layer_types"])
    rope = values.get("rope_parameters") or {}
    for kind, params in rope.items():
        if params.get("rope_type", "default") != "default":
            raise ValueError(f"rope_parameters.{kind}.rope_type={params['rope_type']!r} "
                             "is not supported (only 'default')")
    global_theta = rope.get("full_attention", {}).get("rope_theta", global_theta)
    local_theta = rope.get("sliding_attention", {}).get("rope_theta", local_theta)
    names = {"hidden_activation": "hidden_act", "norm_eps": "layer_norm_eps",
             "classifier_dropout": "hidden_dropout_prob"}
    ours = {"pad_token_id": HF_PAD_TOKEN_ID,
            **{names.get(k, k): v for k, v in values.items() if v is not None}}
    if "initializer_cutoff_factor" in values and values["initializer_cutoff_factor"] is None:
        ours["initializer_cutoff_factor"] = 3.0  # transformers' reading of None
    ours.update(num_hidden_layers=layers, global_attn_every_n_layers=every,
                global_rope_theta=float(global_theta), local_rope_theta=float(local_theta))
    return ModernBertConfig.from_dict(ours)


def _global_period(layer_types: list[str]) -> int:
    """n such that layer i is "full_attention" iff i % n == 0, from transformers' layer_types."""
    full = [i for i, kind in enumerate(layer_types) if kind == "full_attention"]
    every = full[1] if len(full) > 1 else len(layer_types)
    expected = ["full_attention" if i % every == 0 else "sliding_attention"
                for i in range(len(layer_types))]
    if layer_types != expected:
        raise ValueError(f"layer_types {layer_types} is not every n-th layer global from layer 0")
    return every


def state_from_hf(hf_state: dict[str, Tensor], encoder_prefix: str = "bert.",
                  kind: str | None = None) -> tuple[dict[str, Tensor], list[str]]:
    """transformers ModernBERT weights -> (our state dict, transformers keys not used).

    Takes `ModernBertModel` keys (no prefix) and those of its task models (`model.` encoder,
    `head.`, `decoder.`, `classifier.`). Our encoder keys get `encoder_prefix` (the heads'
    `bert.`, whatever the arch; "" for a bare `ModernBertModel`); transformers'
    `head.*` becomes our `pooler.*` (what its classifiers apply `head` as), and in a masked-LM
    checkpoint (one with `decoder.*` keys) also `mlm.dense`/`mlm.norm`, with `decoder.bias`
    as `mlm.bias`: fine-tuning from such a checkpoint starts, as in transformers, with the MLM
    transform as the prediction head. The tied `decoder.weight` is left out (ignored).
    `kind`: our head the weights are for (model/heads.py); "question_answering" reads
    transformers' `classifier.*` as our `qa_outputs.*` (the keys alone cannot tell a span layer
    from a two-label classifier).
    """
    state, ignored = {}, []
    top = {hf: ours for ours, hf in _TOP_LEVEL.items()}
    layer = {hf: ours for ours, hf in _LAYER.items()}
    masked_lm = any(k.startswith("decoder.") for k in hf_state)
    for key, value in hf_state.items():
        module, _, param = key.removeprefix(ENCODER_PREFIX).rpartition(".")
        if m := re.fullmatch(r"layers\.(\d+)\.(.+)", module):
            if m[2] in layer:
                state[f"{encoder_prefix}layers.{m[1]}.{layer[m[2]]}.{param}"] = value
                continue
        elif module in top:
            state[f"{encoder_prefix}{top[module]}.{param}"] = value
            continue
        elif key == "decoder.bias":
            state["mlm.bias"] = value
            continue
        elif (m := re.fullmatch(r"head\.(\w+)", module)) and m[1] in _HEAD:
            state[f"{encoder_prefix}pooler.{m[1]}.{param}"] = value
            if masked_lm:
                state[f"mlm.{m[1]}.{param}"] = value
            continue
        elif module == "classifier":
            state[f"{_CLASSIFIER.get(kind, 'classifier')}.{param}"] = value
            continue
        ignored.append(key)  # the tied decoder weight, buffers, parts we do not have
    return state, ignored


def state_to_hf(state: dict[str, Tensor], prefix: str = ENCODER_PREFIX,
                encoder_prefix: str = "bert.") -> dict[str, Tensor]:
    """Our state dict (encoder keys under `encoder_prefix`, heads `mlm.*`, `classifier.*`,
    `qa_outputs.*`) -> transformers keys, the encoder's under `prefix` ("" for a bare
    `ModernBertModel`); every task model's last layer is transformers' `classifier`.

    transformers' task models hold one `head`: the MLM transform when there is one (`mlm.*`;
    our pooler and a next-sentence head `nsp.*` are then left out: transformers' masked-LM
    model, the only ModernBERT pre-training model it has, has no place for them), else our
    pooler. The tied decoder weight is left out (transformers re-ties it on load); the word
    embedding keeps all its rows (an export cuts them to `vocab_size`).
    """
    out = {}
    masked_lm = any(k.startswith("mlm.") for k in state)
    for key, value in state.items():
        if key == "mlm.bias":
            out["decoder.bias"] = value
            continue
        if key.startswith("nsp.") and masked_lm:  # a run on NSP shards exports its masked LM
            continue
        if m := re.fullmatch(r"mlm\.(\w+)\.(\w+)", key):
            if m[1] in _HEAD:
                out[f"head.{m[1]}.{m[2]}"] = value
            elif m[1] != "decoder":
                raise KeyError(f"no Hugging Face name for parameter {key!r}")
            continue
        module, _, param = key.rpartition(".")
        if module in ("classifier", *_CLASSIFIER.values()):
            out[f"classifier.{param}"] = value
            continue
        if not key.startswith(encoder_prefix):
            raise KeyError(f"no Hugging Face name for parameter {key!r}")
        module, _, param = key.removeprefix(encoder_prefix).rpartition(".")
        if m := re.fullmatch(r"layers\.(\d+)\.(.+)", module):
            out[f"{prefix}layers.{m[1]}.{_LAYER[m[2]]}.{param}"] = value
        elif module in _TOP_LEVEL:
            out[f"{prefix}{_TOP_LEVEL[module]}.{param}"] = value
        elif (m := re.fullmatch(r"pooler\.(\w+)", module)) and m[1] in _HEAD:
            if not masked_lm:
                out[f"head.{m[1]}.{param}"] = value
        else:
            raise KeyError(f"no Hugging Face name for parameter {key!r}")
    return out
