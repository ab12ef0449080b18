"""The BERT encoder (Devlin et al. 2019, arXiv:1810.04805).

Embeddings (word + learned position + token type, LayerNorm, dropout), then `num_hidden_layers`
post-LayerNorm Transformer blocks (self-attention through
`torch.nn.functional.scaled_dot_product_attention`, GELU feed-forward), then the pooler
(dense + tanh on the `[CLS]` state, paper section 3 and figure 1).

Inputs of `BertModel.forward` (B = batch rows, T = tokens per row):

| argument          | shape  | meaning |
|-------------------|--------|---------|
| `input_ids`       | (B, T) | token ids |
| `token_type_ids`  | (B, T) | 0 = sentence A, 1 = sentence B (zeros when None) |
| `attention_mask`  | (B, T) | 1/True = real token, 0/False = padding (all real when None) |
| `sequence_ids`    | (B, T) | packed rows: index of the instance each token belongs to (0, 1, ...); padding may be -1 |
| `position_ids`    | (B, T) | positions; when None they count from 0 and restart at each instance of a packed row |

A token attends only to the tokens of its own instance (model/attention.py: the per-instance
plan of packed and padded rows, made on the host). In training on CPU, dropout draws a cheaper
mask of the same distribution (model/cpu_ops.py).

Attention is bidirectional, or causal with `is_decoder` (`model.attention.AttentionPattern`:
the mask, and which token `pool` reads); the encoder never asks which objective trains it.

On a GPU, `compile_layers` compiles each layer for batches whose shape changes; `compile_model`
compiles a whole model as one graph for batches of one shape (`training.batching.StaticShapes`);
both live in model/compiling.py.

The field names of `BertConfig` are those of the reference `bert_config.json` (and of
`transformers.BertConfig`), so a Hugging Face `config.json` reads directly.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import (
    AttentionPattern,
    AttentionPlan,
    BatchLayout,
    attend_instances,
    batch_layout,
    instance_ids,
    packed_position_ids,
    split_heads,
)
from model.cpu_ops import Dropout, attend, stock_ops_enabled


@dataclass(frozen=True)
class BertConfig:
    """Shape and regularisation of a BERT encoder."""

    arch: ClassVar[str] = "bert"
    """The encoder registry's key (model/encoders.py)."""
    mlm_head_bias: ClassVar[bool] = True
    """The MLM transform's dense layer and LayerNorm have biases."""
    masked_share: ClassVar[float] = 0.15625
    """Share of a row's tokens the reference recipe scores in the MLM head (20 of 128, 80 of
    512: `max_predictions_per_seq`), where memory and FLOP estimates size it without shards."""
    qa_dropout: ClassVar[bool] = False
    """Span heads read the last states without dropout (transformers' `BertForQuestionAnswering`
    has none)."""
    sparse_prediction: ClassVar[bool] = False
    """The MLM head scores every masked position, padding rows too (model/heads.py
    `labelled_rows`): BERT's losses and gradients stay bit for bit what they were."""

    vocab_size: int = 30522
    """Number of WordPiece tokens (rows of the word embedding and of the tied MLM decoder)."""
    hidden_size: int = 768
    """Width H of every hidden state."""
    num_hidden_layers: int = 12
    """Number L of Transformer blocks."""
    num_attention_heads: int = 12
    """Number A of attention heads; must divide hidden_size."""
    intermediate_size: int = 3072
    """Width of the feed-forward layer (4H in the paper)."""
    hidden_act: str = "gelu"
    """Feed-forward activation: "gelu" (exact, erf) or "gelu_new"/"gelu_pytorch_tanh" (tanh approximation)."""
    hidden_dropout_prob: float = 0.1
    """Dropout on embeddings, attention output, feed-forward output and the classifier."""
    attention_probs_dropout_prob: float = 0.1
    """Dropout on the attention probabilities."""
    max_position_embeddings: int = 512
    """Number of learned positions (the longest row)."""
    type_vocab_size: int = 2
    """Number of token types (segments A and B)."""
    initializer_range: float = 0.02
    """Standard deviation of the normal initialisation of weights."""
    layer_norm_eps: float = 1e-12
    """LayerNorm epsilon (the reference uses 1e-12)."""
    pad_token_id: int = 0
    """Id of `[PAD]`."""
    vocab_multiple: int = 1
    """Word-embedding rows rounded up to a multiple of this (`embedding_rows`): 64 makes the
    tied MLM decoder's matrix product whole tensor-core tiles on a GPU (30,522 -> 30,528). The
    extra rows are never looked up, the MLM scores are cut to `vocab_size`, and a Hugging Face
    export holds `vocab_size` rows."""
    is_decoder: bool = False
    """Left-to-right attention: a token sees only itself and the earlier tokens of its instance
    (`model.attention.AttentionPattern`; the objective asks for it, training/objectives.py;
    transformers' name, whose BertModel then masks the same way)."""

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} not in {sorted(ACTIVATIONS)}")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if self.vocab_multiple < 1:
            raise ValueError(f"vocab_multiple must be >= 1, got {self.vocab_multiple}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} outside the vocabulary")

    @property
    def embedding_rows(self) -> int:
        """Rows of the word embedding: `vocab_size` rounded up to `vocab_multiple`."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> BertConfig:
        """Our fields from a dict; other keys (e.g. of a Hugging Face config.json) are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)


def bert_tiny(**changes: Any) -> BertConfig:
    """L=2, H=128, A=2 (Turc et al. 2019 BERT-Tiny): tests and the demo."""
    return BertConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=512, **changes)


def bert_mini(**changes: Any) -> BertConfig:
    """L=4, H=256, A=4 (Turc et al. 2019 BERT-Mini)."""
    return BertConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=1024, **changes)


def bert_base(**changes: Any) -> BertConfig:
    """L=12, H=768, A=12: BERT-base, 110M parameters with the 30522-token vocabulary."""
    return BertConfig(**changes)


def bert_large(**changes: Any) -> BertConfig:
    """L=24, H=1024, A=16: BERT-large, 335M parameters with the 30522-token vocabulary."""
    return BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                      intermediate_size=4096, **changes)


PRESETS = {"bert_tiny": bert_tiny, "bert_mini": bert_mini, "bert_base": bert_base,
           "bert_large": bert_large}

ACTIVATIONS = {  # functions, not lambdas: a model must stay picklable
    "gelu": F.gelu,
    "gelu_new": functools.partial(F.gelu, approximate="tanh"),
    "gelu_pytorch_tanh": functools.partial(F.gelu, approximate="tanh"),
}


class BertEmbeddings(nn.Module):
    """Word + position + token type embeddings, LayerNorm, dropout. (B, T) ids -> (B, T, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.word = nn.Embedding(config.embedding_rows, config.hidden_size)
        self.position = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor, position_ids: Tensor) -> Tensor:
        x = self.word(input_ids) + self.position(position_ids) + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class BertSelfAttention(nn.Module):
    """Multi-head self-attention with one fused QKV projection. (B, T, H) -> (B, T, H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.out = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, x: Tensor, plan: AttentionPlan | None = None, mask: Tensor | None = None,
                query_index: Tensor | None = None) -> Tensor:
        """x (B, T, H) -> (B, T, H), or (B, P, H) for the queries at `query_index` (B, P) only.

        Attention runs per instance as `plan` says, else over whole rows under the boolean
        `mask` (B, 1, T or P, T) (None: every token sees every token of its row).
        """
        B, _, H = x.shape
        dropout_p = self.dropout_p if self.training else 0.0
        qkv = self.qkv(x)  # (B, T, 3H)
        if plan is not None and query_index is None:
            return self.out(attend_instances(qkv, plan, self.num_heads, dropout_p))
        q, k, v = split_heads(qkv, self.num_heads)  # 3 x (B, A, T, D)
        if query_index is not None:
            index = query_index[:, None, :, None].expand(-1, self.num_heads, -1, q.shape[-1])
            q = q.gather(2, index)  # (B, A, P, D)
        y = attend(q, k, v, mask, dropout_p)  # (B, A, P, D)
        y = y.transpose(1, 2).reshape(B, -1, H)  # (B, P, H)
        return self.out(y)


class BertLayer(nn.Module):
    """One post-LayerNorm block: x = norm(x + attention(x)); x = norm(x + ffn(x))."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.attention = BertSelfAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.hidden_dropout_prob)

    def forward(self, x: Tensor, plan: AttentionPlan | None = None, mask: Tensor | None = None,
                query_index: Tensor | None = None) -> Tensor:
        """x (B, T, H) -> (B, T, H), or (B, P, H) at `query_index` (B, P): every token is still
        attended to, but only the P queries go through attention output and feed-forward.
        `plan` and `mask` as in `BertSelfAttention.forward`."""
        residual = x if query_index is None else gather_positions(x, query_index)
        attended = self.attention(x, plan, mask, query_index)
        x = self.attention_norm(self.dropout.add_to(residual, attended))
        h = self.output(self.activation(self.intermediate(x)))
        return self.output_norm(self.dropout.add_to(x, h))


def gather_positions(hidden: Tensor, positions: Tensor) -> Tensor:
    """hidden (B, T, H) at positions (B, P) -> (B, P, H)."""
    return hidden.gather(1, positions.long()[:, :, None].expand(-1, -1, hidden.shape[-1]))


class BertPooler(nn.Module):
    """Dense + tanh on the `[CLS]` hidden state. (..., H) -> (..., H)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, cls_states: Tensor) -> Tensor:
        return torch.tanh(self.dense(cls_states))


@torch.no_grad()
def truncated_normal_(tensor: Tensor, std: float, generator: torch.Generator | None = None,
                      cutoff: float = 2.0) -> Tensor:
    """N(0, std) truncated at +-cutoff std (2: TF's `truncated_normal_initializer`, BERT's;
    ModernBERT's `initializer_cutoff_factor`), by inverse CDF from `generator` (None: torch's
    global one).

    `nn.init.trunc_normal_` computes the same but is ~15x slower on CPU (seconds for BERT-base).
    """
    bound = math.erf(cutoff / math.sqrt(2))  # 2 * Phi(cutoff) - 1
    tensor.uniform_(-bound, bound, generator=generator).erfinv_().mul_(std * math.sqrt(2))
    return tensor.clamp_(-cutoff * std, cutoff * std)  # guards the float rounding at the bounds


def init_bert_weights(module: nn.Module, initializer_range: float) -> None:
    """BERT's initialisation: weights ~ N(0, 0.02) truncated at 2 std, biases 0, LayerNorm 1/0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        truncated_normal_(module.weight, initializer_range)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)


@dataclass(frozen=True)
class HiddenStates:
    """Every layer's output, what `BertModel.forward(..., output_hidden_states=True)` returns."""

    layers: tuple[Tensor, ...]
    """L + 1 tensors (B, T, H): the embeddings' output, then each block's (the last is the
    default return), as transformers' `hidden_states`."""

    @property
    def last(self) -> Tensor:
        """(B, T, H) the last block's output."""
        return self.layers[-1]


class BertModel(nn.Module):
    """The encoder: embeddings, `num_hidden_layers` blocks, and a pooler used through `pool`."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))
        self.pooler = BertPooler(config)
        self.pattern = AttentionPattern(causal=config.is_decoder)
        self.apply(lambda m: init_bert_weights(m, config.initializer_range))

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, sequence_ids: Tensor | None = None,
                position_ids: Tensor | None = None,
                output_positions: Tensor | None = None,
                layout: BatchLayout | None = None,
                output_hidden_states: bool = False) -> Tensor | HiddenStates:
        """Last hidden states (B, T, H); see the module docstring for the (B, T) inputs.

        With `output_positions` (B, P) only the states at those positions (B, P, H) are
        returned, and the last layer computes attention output and feed-forward for those P
        tokens only (pre-training needs the masked positions and the [CLS]s: ~15% of tokens).
        `layout`: the batch's `BatchLayout` from the data loader; made here when None.
        `output_hidden_states`: every layer's states as `HiddenStates` (feature extraction,
        paper section 5.3); not with `output_positions`.
        """
        if output_hidden_states and output_positions is not None:
            raise ValueError("output_hidden_states gives every token's states: no output_positions")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"rows of {input_ids.shape[1]} tokens exceed "
                             f"max_position_embeddings {self.config.max_position_embeddings}")
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        if position_ids is None:
            position_ids = (packed_position_ids(sequence_ids) if sequence_ids is not None
                            else torch.arange(input_ids.shape[1], device=input_ids.device)
                            .expand_as(input_ids))
        ids = instance_ids(attention_mask, sequence_ids, input_ids)
        layout = self.pattern.layout(layout)
        compiled = torch.compiler.is_compiling()  # inside a whole-model graph (`compile_model`)
        if layout is None:  # worked out here
            # on the CPU the per-instance plan, from a look at the ids; elsewhere whole rows under
            # the mask whenever there are ids (a look would wait for the device, and in a
            # compiled graph it is host work: a graph break)
            layout = (batch_layout(ids) if input_ids.device.type == "cpu" and not compiled
                      else BatchLayout(None, masked=ids is not None))
        # torch's stock ops draw dropout masks over whole rows, as transformers' BERT does; a
        # compiled graph takes whole rows too: a plan's group sizes change with every batch,
        # and each new size would compile the graph again
        plan = None if stock_ops_enabled() or compiled else layout.plan
        whole_rows = plan is None and layout.masked  # instances not in single runs, or stock
        length, device = input_ids.shape[1], input_ids.device
        mask = self.pattern.row_mask(ids, None, length, device) if whole_rows else None
        x = self.embeddings(input_ids, token_type_ids, position_ids)
        if output_hidden_states:
            states = [x]
            for layer in self.layers:
                states.append(layer(states[-1], plan, mask))
            return HiddenStates(tuple(states))
        for layer in self.layers[:-1]:
            x = layer(x, plan, mask)
        if output_positions is None:
            return self.layers[-1](x, plan, mask)
        # The sparse last layer attends from P queries over whole rows: a (B, 1, P, T) mask is
        # small, and per-instance groups would need the queries sorted into them.
        query_index = output_positions.long()
        query_mask = (self.pattern.row_mask(ids, query_index, length, device)
                      if layout.masked else None)
        return self.layers[-1](x, mask=query_mask, query_index=query_index)

    def pool(self, hidden: Tensor, cls_positions: Tensor | None = None,
             sequence_ids: Tensor | None = None) -> Tensor:
        """Pooled summary states: (B, T, H) -> (B, H) of each row's first instance, or
        (B, K, H) of the instances at `cls_positions` (B, K). The token read is the attention
        pattern's (`AttentionPattern.summary_positions`): the [CLS], or under causal attention
        each instance's last token (`sequence_ids` (B, T), padding -1, say where they end)."""
        B, T, _ = hidden.shape
        positions = self.pattern.summary_positions(cls_positions, sequence_ids, B, T,
                                                   hidden.device)  # (B, K)
        pooled = self.pooler(gather_positions(hidden, positions))  # (B, K, H)
        return pooled[:, 0] if cls_positions is None else pooled

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The embedding the MLM decoder is tied to."""
        return self.embeddings.word

    mlm_transform: nn.Module | None = None
    """The MLM head's transform is its own (transformers' `cls.predictions.transform`), not a
    module of the encoder."""

    def init_head_layer(self, module: nn.Module) -> None:
        """A head's new layer (classifier, span layer, NSP layer, MLM transform) drawn as BERT's
        reference draws one: `init_bert_weights`."""
        init_bert_weights(module, self.config.initializer_range)

    def token_states(self, hidden: Tensor) -> Tensor:
        """What token-level heads classify: BERT's last hidden states as they are."""
        return hidden

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward and backward: 3 x 2 x multiply-adds) per token of a row of
        `seq_len` tokens: the projections and feed-forward, and attention's two T x T products."""
        c = self.config
        projections = 4 * c.hidden_size ** 2 + 2 * c.hidden_size * c.intermediate_size
        return c.num_hidden_layers * (6 * projections + 12 * seq_len * c.hidden_size)

    def activation_bytes(self, seq_len: int, value_bytes: int) -> int:
        """Bytes the backward keeps for a row of `seq_len` tokens (values of `value_bytes`
        each), Korthikanti et al. 2022 table 2 without the T x T terms a flash kernel does not
        store: per layer and token 8 H values (LayerNorm inputs, q/k/v, the attention output,
        the feed-forward input) + the intermediate's 2 I (GELU input and output) + two 1-byte
        dropout masks of H; the embeddings' sum and LayerNorm output, and their dropout mask."""
        H, I = self.config.hidden_size, self.config.intermediate_size
        per_token_layer = (8 * H + 2 * I) * value_bytes + 2 * H
        embeddings = seq_len * (2 * value_bytes * H + H)
        return self.config.num_hidden_layers * seq_len * per_token_layer + embeddings

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
