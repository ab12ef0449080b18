"""The encoders this project trains, and the one place that picks one: `model.arch`.

An encoder is a file of its own (model/bert.py, model/modernbert.py): a frozen config dataclass
with a class attribute `arch`, preset functions and the encoder module; its Hugging Face
adapter is a second file (model/bert_hf.py, model/modernbert_hf.py). One line in `ENCODERS`
below makes it known to the heads (model/heads.py), conversion (model/hf.py), the training
config (`model.preset`, `model.arch`), `--plan` and memory.

The encoder module's contract, which every head and fine-tuning family relies on:

| member | what it is |
|--------|------------|
| `config` | the encoder's config: `hidden_size`, `vocab_size`, `embedding_rows`, `initializer_range`, `hidden_dropout_prob` (before a classifier), `layer_norm_eps`, `hidden_act`, `is_decoder`, `max_position_embeddings`, `mlm_head_bias`, `sparse_prediction` |
| `forward(input_ids, token_type_ids, attention_mask, sequence_ids, position_ids, output_positions, layout, output_hidden_states)` | last hidden states (B, T, H), or (B, P, H) at `output_positions`, or every layer's (`HiddenStates`) |
| `pool(hidden, cls_positions, sequence_ids)` | the pooled summary state (B, H) or (B, K, H) through `pooler` |
| `pooler` | the module `pool` applies (the NSP head reads it too) |
| `token_states(hidden)` | what token-level heads (tagging, spans) classify: the last states, or a transform of them |
| `word_embeddings` | the `nn.Embedding` the MLM decoder is tied to, kept as `embeddings.word` (model/hf.py `WORD_EMBEDDINGS` and continued pre-training find it by that key) |
| `mlm_transform` | the module the MLM head's transform is (ModernBERT: the prediction head `pooler`, transformers' one `head`), or None: the MLM head has its own (BERT) |
| `init_head_layer(module)` | draws a head's new layer (classifier, span, NSP) as the encoder's transformers peer does |
| `flops_per_token(seq_len)` | training FLOPs (forward and backward) per token of the encoder at that row length |
| `activation_bytes(seq_len, value_bytes)` | bytes the backward keeps per row of that length (training/memory.py) |
| `config.type_vocab_size` | token types; 0: none are read (ModernBERT), see `tells_pairs_apart` |
| `config.is_decoder` | a field where the encoder can attend left to right (BERT), else a class constant False |
| `config.qa_dropout`, `config.masked_share` | class constants: dropout before the span layer (as the transformers peer); the recipe's share of masked tokens (memory and FLOP estimates) |

The Hugging Face adapter (`HFAdapter`) converts configs and state dicts both ways; our keys of a
whole model start with `bert.` for the encoder, whatever the arch, and name the heads as
model/heads.py does.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, Self

import torch
from torch import Tensor, nn

from model import bert, bert_hf, modernbert, modernbert_hf


class EncoderConfig(Protocol):
    """What every encoder's frozen config dataclass is (the contract's `config` rows above):
    the fields the heads, training and estimates read, and the dataclass's own methods."""

    arch: ClassVar[str]
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    intermediate_size: int
    max_position_embeddings: int
    initializer_range: float
    hidden_dropout_prob: float
    layer_norm_eps: float
    hidden_act: str
    pad_token_id: int
    vocab_multiple: int

    @property
    def type_vocab_size(self) -> int: ...
    @property
    def is_decoder(self) -> bool: ...
    @property
    def embedding_rows(self) -> int: ...
    def to_dict(self) -> dict[str, Any]: ...
    def replace(self, **changes: Any) -> Self: ...


class HFAdapter(Protocol):
    """An encoder's conversion to and from `transformers` (one per encoder, in its own file)."""

    MODEL_TYPE: str
    """transformers' `model_type` of this encoder."""
    ENCODER_PREFIX: str
    """Where transformers' task models keep the encoder ("bert.", "model.")."""
    TIED_DECODER: str
    """transformers' key of the MLM decoder weight, tied to the word embeddings."""
    NEXT_SENTENCE: bool
    """Whether transformers' pre-training checkpoints of this encoder carry a next-sentence
    head (what `load_hf_checkpoint` builds by default)."""
    TOKEN_IDS: Mapping[str, str]
    """config.json's special-token id keys -> the vocabulary token whose id the export writes
    there (`cls_token_id` -> "[CLS]")."""

    def hf_config(self, config: Any, architecture: str, **extra: Any) -> dict: ...
    def config_from_hf(self, values: dict) -> Any: ...
    def state_from_hf(self, hf_state: dict[str, Tensor], *, kind: str | None = None
                      ) -> tuple[dict[str, Tensor], list[str]]: ...
    def state_to_hf(self, state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]: ...
    def architecture(self, kind: str, model: nn.Module) -> str: ...


@dataclass(frozen=True)
class Encoder:
    """One encoder architecture: its config class, module, presets and adapter."""

    config: type
    """The frozen config dataclass; its class attribute `arch` is the registry's key."""
    model: type[nn.Module]
    """The encoder module's class, built from a config (`head_of` asks a model whether it is
    one)."""
    presets: Mapping[str, Callable[..., Any]]
    """Preset name -> function returning the config (keyword arguments change fields)."""
    hf: HFAdapter
    """Conversion to and from transformers."""


ENCODERS: dict[str, Encoder] = {
    "bert": Encoder(bert.BertConfig, bert.BertModel, bert.PRESETS, bert_hf),
    "modernbert": Encoder(modernbert.ModernBertConfig, modernbert.ModernBertModel,
                          modernbert.PRESETS, modernbert_hf),
}


class _Presets(Mapping[str, Callable[..., Any]]):
    """Every encoder's presets by name, read from `ENCODERS` at each look-up: an encoder
    registered later (one line) brings its presets without a second table to update."""

    def __getitem__(self, name: str) -> Callable[..., Any]:
        for entry in ENCODERS.values():
            if name in entry.presets:
                return entry.presets[name]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return (name for entry in ENCODERS.values() for name in entry.presets)

    def __len__(self) -> int:
        return sum(len(entry.presets) for entry in ENCODERS.values())


PRESETS: Mapping[str, Callable[..., Any]] = _Presets()
"""Every encoder's presets by name (names are unique across encoders)."""


def arch_of_preset(preset: str) -> str:
    """The arch whose preset this is ("bert_base" -> "bert")."""
    for arch, encoder in ENCODERS.items():
        if preset in encoder.presets:
            return arch
    raise KeyError(f"no encoder has the preset {preset!r}; presets: {sorted(PRESETS)}")


def encoder(arch: str) -> Encoder:
    """The registry's entry for `arch`; an unknown arch is one line naming the known ones."""
    if arch not in ENCODERS:
        raise ValueError(f"model arch {arch!r}: expected one of {sorted(ENCODERS)}")
    return ENCODERS[arch]


def encoder_of(config: Any) -> Encoder:
    """The registry's entry for a config object."""
    return encoder(type(config).arch)


def build_encoder(config: Any) -> nn.Module:
    """The encoder module of `config` (any registered config class)."""
    return encoder_of(config).model(config)


def config_from_dict(values: Mapping[str, Any], arch: str | None = None) -> Any:
    """A config of `arch` (else `values["arch"]`, else BERT: files written before the registry
    hold BERT) from a dict; keys the config does not have are ignored."""
    arch = arch or values.get("arch", "bert")
    return encoder(arch).config.from_dict(dict(values))


def config_to_dict(config: Any) -> dict[str, Any]:
    """The config's fields and its `arch`, as our checkpoints store them (`config_from_dict`
    reads them back)."""
    values = config.to_dict()
    if type(config).arch != "bert":  # BERT's files stay as they were: no arch means BERT
        values["arch"] = type(config).arch
    return values


def check_same_arch(config: Any, other: Any, what: str) -> None:
    """One line naming both archs when a checkpoint's encoder is not the run's."""
    ours, theirs = type(config).arch, type(other).arch
    if ours != theirs:
        raise ValueError(f"{what} holds a {theirs} encoder, but the run's model is {ours} "
                         f"(model.arch / model.preset)")


def tells_pairs_apart(config: Any) -> bool:
    """Whether the encoder of `config` can read a sentence pair: two or more token types
    (BERT's segment embedding), or none (ModernBERT: [SEP] alone, as it was trained); a BERT
    with one token type cannot tell sentence B from A."""
    return config.type_vocab_size != 1


def count_parameters(config: Any, head: Callable[[Any], nn.Module] | None = None) -> int:
    """Parameters of the encoder (or of `head(config)`, a whole model), built on the meta device:
    no memory, no random draws."""
    with torch.device("meta"):
        model = head(config) if head is not None else build_encoder(config)
    return sum(p.numel() for p in model.parameters())


def activation_bytes(config: Any, seq_len: int, value_bytes: int) -> int:
    """Bytes the encoder of `config` keeps for the backward per row of `seq_len` tokens."""
    with torch.device("meta"):
        model = build_encoder(config)
    return model.activation_bytes(seq_len, value_bytes)


def flops_per_token(config: Any, seq_len: int) -> float:
    """Training FLOPs per token of the encoder of `config` at `seq_len` tokens a row."""
    with torch.device("meta"):
        model = build_encoder(config)
    return model.flops_per_token(seq_len)
