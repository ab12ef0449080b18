"""A third encoder for the seam test (tests/model/test_encoders.py): the contract of
model/encoders.py alone, in one file, as a newcomer would write one.

The toy has no attention: each block adds to every token the mean of its instance's tokens,
then a feed-forward (x = x + mean(x); x = x + W2 act(W1 norm(x))). Its Hugging Face adapter
maps our `bert.` keys to an imaginary transformers model's `toy.` keys.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from model.attention import BatchLayout, instance_ids
from model.bert import ACTIVATIONS, HiddenStates, gather_positions, init_bert_weights
from model.encoders import Encoder


@dataclass(frozen=True)
class ToyConfig:
    """Shape of the toy encoder."""

    arch: ClassVar[str] = "toy"
    mlm_head_bias: ClassVar[bool] = True
    """The MLM transform has biases (as BERT's)."""
    qa_dropout: ClassVar[bool] = False
    """The span head reads the token states without dropout (as BERT's)."""
    masked_share: ClassVar[float] = 0.15
    """Share of a row's tokens masked (memory estimates size the MLM head by it)."""
    type_vocab_size: ClassVar[int] = 0
    """No token-type embedding: a pair is told apart by its [SEP] alone."""
    sparse_prediction: ClassVar[bool] = False
    """The MLM head scores every masked position (as BERT's)."""

    vocab_size: int = 100
    """Number of tokens."""
    hidden_size: int = 16
    """Width H of every state."""
    num_hidden_layers: int = 2
    """Number L of blocks."""
    num_attention_heads: int = 1
    """The toy has no attention; the training config's shape fields (training/config_sections.py
    SHAPE_FIELDS) are every encoder's, and it divides hidden_size."""
    intermediate_size: int = 32
    """Width I of each block's feed-forward."""
    max_position_embeddings: int = 64
    """Longest row (the toy has no positions; longer rows are refused all the same)."""
    hidden_act: str = "gelu"
    """Activation of the feed-forward and the MLM transform."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated normal initialisation."""
    hidden_dropout_prob: float = 0.0
    """Dropout before a fine-tuning classifier."""
    vocab_multiple: int = 1
    """Word-embedding rows rounded up to a multiple of this."""
    is_decoder: bool = False
    """Always False: the toy sees both ways."""

    def __post_init__(self):
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} not in {sorted(ACTIVATIONS)}")

    @property
    def embedding_rows(self) -> int:
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ToyConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def replace(self, **changes: Any) -> ToyConfig:
        return dataclasses.replace(self, **changes)


def toy_tiny(**changes: Any) -> ToyConfig:
    """L=2, H=16, I=32."""
    return ToyConfig(**changes)


PRESETS = {"toy_tiny": toy_tiny}


class ToyEmbeddings(nn.Module):
    """Word embedding + LayerNorm: (B, T) -> (B, T, H). The word embedding's key is
    `embeddings.word.weight`, as every encoder's (model/hf.py `WORD_EMBEDDINGS`)."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.word = nn.Embedding(config.embedding_rows, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.norm(self.word(input_ids))


class ToyBlock(nn.Module):
    """x + mean of its instance's x, then x + W2 act(W1 norm(x)): (B, T, H) -> (B, T, H)."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: Tensor, same: Tensor) -> Tensor:
        """`same` (B, T, T): 1 / n where two tokens share an instance of n tokens, else 0."""
        x = x + same @ x  # (B, T, H)
        return x + self.w2(self.activation(self.w1(self.norm(x))))


class ToyModel(nn.Module):
    """The encoder: embeddings, `num_hidden_layers` blocks, and a dense + tanh pooler."""

    def __init__(self, config: ToyConfig):
        super().__init__()
        self.config = config
        self.embeddings = ToyEmbeddings(config)
        self.layers = nn.ModuleList(ToyBlock(config) for _ in range(config.num_hidden_layers))
        self.pooler = nn.Sequential(nn.Linear(config.hidden_size, config.hidden_size), nn.Tanh())
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))

    @property
    def word_embeddings(self) -> nn.Embedding:
        return self.embeddings.word

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, sequence_ids: Tensor | None = None,
                position_ids: Tensor | None = None, output_positions: Tensor | None = None,
                layout: BatchLayout | None = None,
                output_hidden_states: bool = False) -> Tensor | HiddenStates:
        """(B, T) inputs -> (B, T, H), (B, P, H) at `output_positions`, or every block's
        `HiddenStates`; token types, positions and the layout are not needed."""
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"rows of {input_ids.shape[1]} tokens exceed "
                             f"max_position_embeddings {self.config.max_position_embeddings}")
        ids = instance_ids(attention_mask, sequence_ids, input_ids)  # (B, T) or None
        if ids is None:
            ids = torch.zeros_like(input_ids)
        same = ((ids[:, :, None] == ids[:, None, :]) & (ids[:, None, :] >= 0)).float()
        same = same / same.sum(-1, keepdim=True).clamp(min=1)  # (B, T, T)
        states = [self.embeddings(input_ids)]
        for layer in self.layers:
            states.append(layer(states[-1], same))
        if output_hidden_states:
            return HiddenStates(tuple(states))
        if output_positions is not None:
            return gather_positions(states[-1], output_positions)  # (B, P, H)
        return states[-1]

    def pool(self, hidden: Tensor, cls_positions: Tensor | None = None,
             sequence_ids: Tensor | None = None) -> Tensor:
        """The pooler on the [CLS] states: (B, T, H) -> (B, H), or (B, K, H) at
        `cls_positions` (B, K)."""
        if cls_positions is None:
            return self.pooler(hidden[:, 0])
        return self.pooler(gather_positions(hidden, cls_positions.clamp(min=0)))

    def token_states(self, hidden: Tensor) -> Tensor:
        return hidden

    mlm_transform: nn.Module | None = None
    """The MLM head has its own transform."""

    def init_head_layer(self, module: nn.Module) -> None:
        init_bert_weights(module, self.config.initializer_range)

    def activation_bytes(self, seq_len: int, value_bytes: int) -> int:
        """Per block and token: its input and the norm's output (2 H), the feed-forward's
        input and activation (2 I); the embeddings' output."""
        c = self.config
        per_token_layer = (2 * c.hidden_size + 2 * c.intermediate_size) * value_bytes
        return seq_len * (c.num_hidden_layers * per_token_layer + c.hidden_size * value_bytes)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (3 x the forward's 2 per multiply-add) per token: each block's two
        feed-forward matrices (2 H I) and its mean over the row's tokens (H per token)."""
        c = self.config
        return float(6 * c.num_hidden_layers * (2 * c.hidden_size * c.intermediate_size
                                                + c.hidden_size * seq_len))


# ---------------------------------------------------------------------------------------------
# Hugging Face adapter (an imaginary transformers "toy" model: our keys, `toy.` for `bert.`)

MODEL_TYPE = "toy"
ENCODER_PREFIX = "toy."
TIED_DECODER = "lm.decoder.weight"
NEXT_SENTENCE = False
TOKEN_IDS: dict[str, str] = {"cls_token_id": "[CLS]"}


def architecture(kind: str, model: nn.Module | None = None) -> str:
    return f"Toy{''.join(part.title() for part in kind.split('_'))}"


def hf_config(config: ToyConfig, architecture: str, **extra: Any) -> dict[str, Any]:
    return {"model_type": MODEL_TYPE, "architectures": [architecture], **config.to_dict(),
            **extra}


def config_from_hf(values: dict[str, Any]) -> ToyConfig:
    return ToyConfig.from_dict(values)


def state_from_hf(hf_state: dict[str, Tensor], kind: str | None = None
                  ) -> tuple[dict[str, Tensor], list[str]]:
    state, ignored = {}, []
    for key, value in hf_state.items():
        if key == TIED_DECODER:
            ignored.append(key)
        else:
            state[re.sub(r"^toy\.", "bert.", re.sub(r"^lm\.", "mlm.", key))] = value
    return state, ignored


def state_to_hf(state: dict[str, Tensor], prefix: str = ENCODER_PREFIX) -> dict[str, Tensor]:
    return {re.sub(r"^bert\.", prefix, re.sub(r"^mlm\.", "lm.", key)): value
            for key, value in state.items() if key != "mlm.decoder.weight"}


ENCODER = Encoder(ToyConfig, ToyModel, PRESETS, sys.modules[__name__])
"""This encoder's registry entry: the one line `model/encoders.py` `ENCODERS` would hold."""
