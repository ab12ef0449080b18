"""The ModernBERT encoder (Warner et al. 2024, arXiv:2412.13663), exact against transformers'
`ModernBertModel`.

What differs from BERT (model/bert.py), paper section 2.1:

- No position embeddings: rotary embeddings (RoPE, Su et al. 2021) turn q and k of every layer
  by each token's position. Global layers use `global_rope_theta`, local ones
  `local_rope_theta`.
- Alternating attention: layer i is global (every token of its instance) when
  i % global_attn_every_n_layers == 0, otherwise local: a token sees the tokens of its instance
  at most `local_attention // 2` places away (|i - j| <= local_attention // 2, transformers'
  `sliding_window`; `local_attention` is the full window).
- Pre-LayerNorm blocks without biases (the first block's attention norm is the identity: the
  embeddings are normed already), a GeGLU feed-forward (Wi -> input, gate; act(input) * gate
  -> Wo), and a final LayerNorm after the last block.
- Token types are ignored; the embeddings are the word embedding, a LayerNorm and dropout.

Inputs of `ModernBertModel.forward` are those of `model.bert.BertModel.forward` (its module
docstring has the table), so every head in model/heads.py takes either encoder. In packed rows
a token attends only to its own instance, and on local layers only within the window; positions
restart at 0 per instance.

The layers run on the real tokens only (model/real_tokens.py's `RealTokens`, as transformers'
ModernBERT unpads for flash attention): gathered once before the embeddings, one (N, H) matrix
through every norm, projection and feed-forward, put back in their rows at the end; attention
per bucket of instances on the CPU (local layers of long rows in chunks of their window,
`CHUNKED_WINDOWS`), by torch's variable-length FlashAttention kernel on a GPU with fp16/bf16
activations and no attention dropout. Otherwise (`stock_ops()`, torch.compile, a GPU in fp32 or
with attention dropout, an instance that is not one run of tokens) the layers take whole rows:
SDPA under one boolean (B, 1, T, T) mask per layer kind, made once per forward.

Its Hugging Face adapter is model/modernbert_hf.py.

Kept whole: the one ModernBERT file, as nanoGPT's model.py and model/bert.py are one encoder
file: config and presets, RoPE, the blocks and the encoder's forward on either path read top to
bottom in one place. What is not the model's own reading order lives beside it: the real-token
attention in model/real_tokens.py, the Hugging Face layout in model/modernbert_hf.py.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from model.attention import (
    BatchLayout,
    attention_plan,
    instance_ids,
    one_instance_per_row,
    packed_position_ids,
    query_attention_mask,
    window_mask,
)
from model.bert import ACTIVATIONS, HiddenStates, gather_positions, truncated_normal_
from model.cpu_ops import Dropout, attend, stock_ops_enabled
from model.real_tokens import (
    RealInputs,
    RealTokens,
    attend_buckets,
    band_mask,
    bucket_mask,
    half_precision_attention,
    token_runs,
    uses_band,
    varlen_attention,
)


@dataclass(frozen=True)
class ModernBertConfig:
    """Shape and regularisation of a ModernBERT encoder (transformers' names in brackets where
    they differ)."""

    arch: ClassVar[str] = "modernbert"
    mlm_head_bias: ClassVar[bool] = False
    """The MLM transform's dense and LayerNorm have no bias (the decoder has one)."""
    sparse_prediction: ClassVar[bool] = True
    """On the CPU the MLM head scores only the labelled masked positions (model/heads.py
    `labelled_rows`), as transformers' `sparse_prediction=True`, which ModernBERT trained with."""
    masked_share: ClassVar[float] = 0.3
    """Share of a row's tokens the published recipe masks (paper section 2.2: 30%), where
    memory and FLOP estimates size the MLM head without shards."""
    qa_dropout: ClassVar[bool] = True
    """Span heads drop out the prediction head's states before their classifier, as
    transformers' `ModernBertForQuestionAnswering` (`drop`)."""
    type_vocab_size: ClassVar[int] = 0
    """No token-type embedding (token_type_ids are ignored): a pair's sentences are told apart
    by [SEP] alone, as ModernBERT was trained."""
    is_decoder: ClassVar[bool] = False
    """ModernBERT attends both ways and has no left-to-right form: a constant, not a setting
    (the heads read it of every encoder; training/objectives.py refuses a causal objective)."""

    vocab_size: int = 50368
    """Number of tokens (rows of the word embedding and of the tied MLM decoder)."""
    hidden_size: int = 768
    """Width H of every hidden state."""
    num_hidden_layers: int = 22
    """Number L of Transformer blocks."""
    num_attention_heads: int = 12
    """Number A of attention heads; must divide hidden_size, and H / A must be even (RoPE)."""
    intermediate_size: int = 1152
    """Width of the GLU: Wi projects to twice this (input and gate), Wo back from it."""
    hidden_act: str = "gelu"
    """Activation of the GLU's input half and of the prediction head [hidden_activation,
    classifier_activation]."""
    max_position_embeddings: int = 8192
    """Longest row; RoPE has no table, but longer rows are refused as transformers' would be
    out of what the model was trained for."""
    global_attn_every_n_layers: int = 3
    """Layer i is global when i % this == 0, else local [layer_types]."""
    local_attention: int = 128
    """Full window of local layers: a token sees |i - j| <= local_attention // 2 [sliding_window
    is half of it]."""
    global_rope_theta: float = 160000.0
    """RoPE base of global layers [rope_parameters.full_attention.rope_theta]."""
    local_rope_theta: float = 10000.0
    """RoPE base of local layers [rope_parameters.sliding_attention.rope_theta]."""
    layer_norm_eps: float = 1e-5
    """LayerNorm epsilon [norm_eps]."""
    initializer_range: float = 0.02
    """Standard deviation of the truncated normal initialisation of weights."""
    initializer_cutoff_factor: float = 2.0
    """The initialisation is truncated at +- this many standard deviations."""
    embedding_dropout: float = 0.0
    """Dropout after the embeddings' LayerNorm."""
    attention_dropout: float = 0.0
    """Dropout on the attention probabilities and on the attention output."""
    mlp_dropout: float = 0.0
    """Dropout on the GLU's product, before Wo."""
    hidden_dropout_prob: float = 0.0
    """Dropout fine-tuning heads put before their classifier [classifier_dropout]."""
    pad_token_id: int = 0
    """Id of the padding token: `[PAD]` of this project's vocabularies (transformers'
    ModernBERT checkpoints say theirs: 50283 for its published tokenizer)."""
    vocab_multiple: int = 1
    """Word-embedding rows rounded up to a multiple of this (`embedding_rows`), as in
    `BertConfig`: the extra rows are never looked up and a Hugging Face export holds
    `vocab_size` rows."""
    classifier_pooling: str = "cls"
    """What sequence-level heads summarise before the prediction head: "cls" (the [CLS]
    state) or "mean" (the mean of the instance's token states), transformers' setting."""

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings",
                    "global_attn_every_n_layers", "local_attention", "vocab_multiple")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of "
                             f"num_attention_heads {self.num_attention_heads}")
        if (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError(f"head dim hidden_size / num_attention_heads = {self.hidden_size} / "
                             f"{self.num_attention_heads} = "
                             f"{self.hidden_size // self.num_attention_heads} must be even for RoPE")
        if self.local_attention % 2:
            raise ValueError(f"local_attention {self.local_attention} must be even (the window "
                             "is local_attention // 2 tokens each side)")
        if self.local_attention > self.max_position_embeddings:
            raise ValueError(f"local_attention {self.local_attention} is larger than "
                             f"max_position_embeddings {self.max_position_embeddings}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act {self.hidden_act!r} not in {sorted(ACTIVATIONS)}")
        if self.classifier_pooling not in ("cls", "mean"):
            raise ValueError(f"classifier_pooling {self.classifier_pooling!r} not in "
                             "['cls', 'mean']")
        for name in ("embedding_dropout", "attention_dropout", "mlp_dropout",
                     "hidden_dropout_prob"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("global_rope_theta", "local_rope_theta", "initializer_range",
                     "initializer_cutoff_factor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} outside the vocabulary of "
                             f"vocab_size {self.vocab_size}")

    @property
    def embedding_rows(self) -> int:
        """Rows of the word embedding: `vocab_size` rounded up to `vocab_multiple`."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @property
    def head_dim(self) -> int:
        """Width D of one attention head."""
        return self.hidden_size // self.num_attention_heads

    def is_global(self, layer: int) -> bool:
        """Whether layer `layer` attends globally (transformers' "full_attention")."""
        return layer % self.global_attn_every_n_layers == 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ModernBertConfig:
        """Our fields from a dict; other keys are ignored."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in names})

    def replace(self, **changes: Any) -> ModernBertConfig:
        return dataclasses.replace(self, **changes)


def modernbert_tiny(**changes: Any) -> ModernBertConfig:
    """L=3, H=128, A=2 (head dim 64), window 64: layer 0 global, 1 and 2 local. Tests and the
    CPU demo."""
    return ModernBertConfig(**{"hidden_size": 128, "num_hidden_layers": 3,
                               "num_attention_heads": 2, "intermediate_size": 192,
                               "local_attention": 64, "max_position_embeddings": 1024,
                               **changes})


def modernbert_base(**changes: Any) -> ModernBertConfig:
    """L=22, H=768, A=12, GLU 1152: ModernBERT-base as published (149M parameters)."""
    return ModernBertConfig(**changes)


def modernbert_large(**changes: Any) -> ModernBertConfig:
    """L=28, H=1024, A=16, GLU 2624: ModernBERT-large as published (395M parameters)."""
    return ModernBertConfig(**{"hidden_size": 1024, "num_hidden_layers": 28,
                               "num_attention_heads": 16, "intermediate_size": 2624, **changes})


PRESETS = {"modernbert_tiny": modernbert_tiny, "modernbert_base": modernbert_base,
           "modernbert_large": modernbert_large}


# ---------------------------------------------------------------------------------------------
# Rotary embeddings


@functools.cache
def inverse_frequencies(theta: float, head_dim: int) -> Tensor:
    """RoPE's (D/2,) frequencies theta^(-2i/D), float32, computed on the CPU as transformers
    does at init, so that a GPU model turns by bit-identical angles."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))


def rotary_cos_sin(position_ids: Tensor, theta: float, head_dim: int,
                   dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin of each position's angles, (B, T) -> 2 x (B, T, D), both halves of the head
    sharing the D/2 frequencies; in `dtype` (the hidden states'), as transformers rounds them."""
    inv_freq = inverse_frequencies(float(theta), head_dim).to(position_ids.device)
    freqs = position_ids[..., None].float() * inv_freq  # (B, T, D/2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (B, T, D)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Turn each head's (first half, second half) pairs by the angles: x (..., A, D), cos and
    sin (..., D) -> (..., A, D), the leading dims (B, T) or (N,). In float32, as transformers,
    whatever x's dtype."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)  # (..., 1, D)
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Which tokens each layer kind sees over whole rows (on real tokens: model/real_tokens.py)


@dataclass(frozen=True)
class LayerInputs:
    """What every layer of one kind (global or local) attends with, made once per forward."""

    cos: Tensor
    """(B, T, D) cosines of the RoPE angles at this kind's theta."""
    sin: Tensor
    """(B, T, D) sines."""
    mask: Tensor | None
    """(B or 1, 1, T, T) True = may attend (same instance, and within the window on local
    layers); None when nothing is masked."""
    window: int | None
    """Tokens seen each side on local layers (local_attention // 2); None on global ones."""


def both(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    """The conjunction of two optional masks (None = nothing masked)."""
    if a is None or b is None:
        return b if a is None else a
    return a & b


def query_rows(mask: Tensor | None, query_index: Tensor) -> Tensor | None:
    """The rows of the queries at `query_index` (B, P) of a (B or 1, 1, T, T) mask: (B, 1, P, T)."""
    if mask is None:
        return None
    T = mask.shape[-1]
    mask = mask.expand(query_index.shape[0], 1, T, T)
    return mask.gather(2, query_index[:, None, :, None].expand(-1, 1, -1, T))


# ---------------------------------------------------------------------------------------------
# Modules


class ModernBertEmbeddings(nn.Module):
    """Word embedding, LayerNorm, dropout: (B, T) ids -> (B, T, H). No positions (RoPE turns
    q and k instead) and no token types."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        # padding_idx as transformers: the padding row gets no gradient from the lookup
        self.word = nn.Embedding(config.embedding_rows, config.hidden_size,
                                 padding_idx=config.pad_token_id)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.dropout = Dropout(config.embedding_dropout)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.dropout(self.norm(self.word(input_ids)))


class ModernBertAttention(nn.Module):
    """Self-attention with RoPE, one fused bias-free QKV projection and a bias-free output.
    (B, T, H) -> (B, T, H), or (B, P, H) for the queries at `query_index` (B, P); on real
    tokens (`forward_real`) (N, H) -> (N, H)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.dropout_p = config.attention_dropout
        self.dropout = Dropout(config.attention_dropout)  # on the output too, as transformers

    def forward(self, x: Tensor, inputs: LayerInputs, query_index: Tensor | None = None) -> Tensor:
        return self.attend_rows(self.qkv(x), inputs, query_index)

    def attend_rows(self, qkv: Tensor, inputs: LayerInputs,
                    query_index: Tensor | None = None) -> Tensor:
        """Whole rows under `inputs.mask`: projections qkv (B, T, 3H) -> (B, T or P, H)."""
        B, T, H3 = qkv.shape
        A, D = self.num_heads, H3 // (3 * self.num_heads)
        q, k, v = qkv.view(B, T, 3, A, D).unbind(2)  # 3 x (B, T, A, D)
        cos, sin, mask = inputs.cos, inputs.sin, inputs.mask
        if query_index is not None:  # turn only the P queries
            q = q.gather(1, query_index[:, :, None, None].expand(-1, -1, A, D))  # (B, P, A, D)
            cos_q, sin_q = (t.gather(1, query_index[:, :, None].expand(-1, -1, D))
                            for t in (cos, sin))  # (B, P, D)
            mask = query_rows(mask, query_index)  # (B, 1, P, T)
        else:
            cos_q, sin_q = cos, sin
        q, k = apply_rotary(q, cos_q, sin_q), apply_rotary(k, cos, sin)
        dropout_p = self.dropout_p if self.training else 0.0
        y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                   dropout_p).transpose(1, 2)  # (B, A, P, D) -> (B, P, A, D)
        return self.dropout(self.out(y.reshape(B, -1, H3 // 3)))  # (B, P, H)

    def forward_real(self, x: Tensor, inputs: RealInputs) -> Tensor:
        """Each instance's own tokens (per bucket on the CPU, per run on a GPU): x (N, H) ->
        (N, H)."""
        return self.dropout(self.out(self.attend_real(x, inputs)))

    def attend_real(self, x: Tensor, inputs: RealInputs) -> Tensor:
        """`forward_real` before the output projection: (N, H) -> (N, H)."""
        N, H = x.shape
        A = self.num_heads
        q, k, v = self.qkv(x).view(N, 3, A, H // A).unbind(1)  # 3 x (N, A, D)
        q, k = apply_rotary(q, inputs.cos, inputs.sin), apply_rotary(k, inputs.cos, inputs.sin)
        if inputs.tokens.runs is not None:
            return varlen_attention(q, k, v, inputs.tokens.runs, inputs.window).reshape(N, H)
        return attend_buckets(q, k, v, inputs, self.dropout_p if self.training else 0.0)


class ModernBertMLP(nn.Module):
    """GeGLU feed-forward without biases: Wi -> (input, gate); Wo(act(input) * gate)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.wi = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.dropout = Dropout(config.mlp_dropout)
        self.wo = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.wi(x).chunk(2, dim=-1)  # 2 x (..., I)
        return self.wo(self.dropout(self.activation(value) * gate))


class ModernBertLayer(nn.Module):
    """One pre-LayerNorm block: x = x + attention(norm(x)); x = x + mlp(norm(x))."""

    def __init__(self, config: ModernBertConfig, index: int):
        super().__init__()
        self.is_global = config.is_global(index)
        # the embeddings end in a LayerNorm: the first block does not norm again
        self.attn_norm = (nn.Identity() if index == 0 else
                          nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False))
        self.attention = ModernBertAttention(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.mlp = ModernBertMLP(config)

    def forward(self, x: Tensor, inputs: LayerInputs, query_index: Tensor | None = None) -> Tensor:
        """x (B, T, H) -> (B, T, H), or (B, P, H) at `query_index` (B, P): every token is a key,
        but only the P queries go on through attention output and feed-forward."""
        residual = x if query_index is None else gather_positions(x, query_index)
        x = residual + self.attention(self.attn_norm(x), inputs, query_index)
        return x + self.mlp(self.mlp_norm(x))

    def forward_real(self, x: Tensor, inputs: RealInputs) -> Tensor:
        """On the real tokens: x (N, H) -> (N, H)."""
        x = x + self.attention.forward_real(self.attn_norm(x), inputs)
        return x + self.mlp(self.mlp_norm(x))

    def forward_queries(self, x: Tensor, tokens: RealTokens, real: RealInputs,
                        rows: LayerInputs | None, query_index: Tensor) -> Tensor:
        """The real tokens x (N, H) as keys, the P queries at `query_index` (B, P) of the rows:
        -> (B, P, H); only those P go on through the output projection and feed-forward.
        With `rows`, the queries take whole rows under its mask (B P T products: fewer than
        every token of each instance, sum n^2, at 30% of tokens masked); without (a local
        layer in chunks, `queries_by_chunks`), every token attends and the P are picked."""
        h = self.attn_norm(x)
        residual = gather_positions(tokens.pad(x), query_index)  # (B, P, H)
        attention = self.attention
        if rows is not None:
            y = attention.attend_rows(tokens.pad(attention.qkv(h)), rows, query_index)
        else:
            picked = gather_positions(tokens.pad(attention.attend_real(h, real)), query_index)
            y = attention.dropout(attention.out(picked))  # (B, P, H)
        x = residual + y
        return x + self.mlp(self.mlp_norm(x))

    @staticmethod
    def queries_by_chunks(real: RealInputs, tokens: int, query_index: Tensor) -> bool:
        """Whether a local last layer is cheaper with every one of the N `tokens` against its
        3 windows of keys (`attend_band`) than with the P queries of each row against T."""
        return (real.window is not None and any(real.banded)
                and 3 * real.window * tokens < query_index.numel() * real.tokens.length)


class ModernBertPredictionHead(nn.Module):
    """Dense (no bias) + activation + LayerNorm (no bias): (..., H) -> (..., H). transformers'
    `ModernBertPredictionHead`, which its classification, tagging, span and multiple-choice
    models apply (as `head`) before their classifier: here the `pooler`."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(self.activation(self.dense(x)))


class ModernBertModel(nn.Module):
    """The encoder: embeddings, `num_hidden_layers` blocks, the final LayerNorm, and the
    prediction head as `pooler` (through `pool` and `token_states`)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.config = config
        self.embeddings = ModernBertEmbeddings(config)
        self.layers = nn.ModuleList(ModernBertLayer(config, i)
                                    for i in range(config.num_hidden_layers))
        self.final_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=False)
        self.pooler = ModernBertPredictionHead(config)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """ModernBERT's initialisation (transformers' `_init_weights`): truncated normals at
        `initializer_cutoff_factor` std; std `initializer_range` for the embedding and the
        projections into a block, / sqrt(2 L) for the projections out of it (attention output,
        Wo) and the prediction head's dense; LayerNorm weights 1. Drawn in module order from
        torch's global generator, so a seed fixes the weights."""
        config = self.config
        std = config.initializer_range
        out_std = std / math.sqrt(2.0 * config.num_hidden_layers)
        cutoff = config.initializer_cutoff_factor
        truncated_normal_(self.embeddings.word.weight, std, cutoff=cutoff)
        for layer in self.layers:
            truncated_normal_(layer.attention.qkv.weight, std, cutoff=cutoff)
            truncated_normal_(layer.attention.out.weight, out_std, cutoff=cutoff)
            truncated_normal_(layer.mlp.wi.weight, std, cutoff=cutoff)
            truncated_normal_(layer.mlp.wo.weight, out_std, cutoff=cutoff)
        truncated_normal_(self.pooler.dense.weight, out_std, cutoff=cutoff)
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                nn.init.ones_(module.weight)

    @torch.no_grad()
    def init_head_layer(self, module: nn.Module) -> None:
        """A head's new layer (classifier, span layer, NSP layer) as transformers'
        `_init_weights` draws a ModernBERT task model's `classifier`: truncated N(0, 1 / sqrt(H))
        at `initializer_cutoff_factor` std, bias 0."""
        truncated_normal_(module.weight, self.config.hidden_size ** -0.5,
                          cutoff=self.config.initializer_cutoff_factor)
        if module.bias is not None:
            nn.init.zeros_(module.bias)

    @property
    def mlm_transform(self) -> ModernBertPredictionHead:
        """The MLM head's transform is the prediction head `pooler`: transformers' ModernBERT
        task models hold one `head`, which its masked LM trains and its classifiers start
        from, so a pre-trained pooler is never a random one."""
        return self.pooler

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The embedding the MLM decoder is tied to."""
        return self.embeddings.word

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, sequence_ids: Tensor | None = None,
                position_ids: Tensor | None = None,
                output_positions: Tensor | None = None,
                layout: BatchLayout | None = None,
                output_hidden_states: bool = False) -> Tensor | HiddenStates:
        """Final-normed hidden states (B, T, H); the (B, T) inputs as `BertModel.forward`'s
        (`token_type_ids` is ignored).

        `output_positions` (B, P): only the states at those positions (B, P, H); the last
        layer computes attention output and feed-forward for those P queries only.
        `layout`: the loader's `BatchLayout`: its `masked` (whether any row is padded or
        packed) and, on the CPU, its per-instance `plan`, which save a look at the ids.
        `output_hidden_states`: `HiddenStates` of L + 1 tensors exactly as transformers'
        `hidden_states`: the embeddings' output, the outputs of blocks 0..L-2, and the last
        block's output after the final LayerNorm (transformers replaces its last recorded
        state by `last_hidden_state`), so `.last` is the default return.
        """
        if output_hidden_states and output_positions is not None:
            raise ValueError("output_hidden_states gives every token's states: no output_positions")
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be (batch, tokens), got shape {tuple(input_ids.shape)}")
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(f"rows of {input_ids.shape[1]} tokens exceed "
                             f"max_position_embeddings {self.config.max_position_embeddings}")
        if position_ids is None:
            position_ids = (packed_position_ids(sequence_ids) if sequence_ids is not None
                            else torch.arange(input_ids.shape[1], device=input_ids.device)
                            .expand_as(input_ids))
        ids = instance_ids(attention_mask, sequence_ids, input_ids)
        query_index = None if output_positions is None else output_positions.long()
        tokens = self.real_tokens(ids, layout, input_ids.shape, input_ids.device)
        if tokens is not None:
            return self.forward_real(input_ids, position_ids, ids, layout, tokens, query_index,
                                     output_hidden_states)
        x = self.embeddings(input_ids)
        inputs = self.layer_inputs(ids, position_ids, layout, x.dtype)
        states, last = [x], len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, inputs[layer.is_global], query_index if i == last else None)
            states.append(x)
        x = self.final_norm(x)
        if output_hidden_states:
            return HiddenStates((*states[:-1], x))
        return x

    def forward_real(self, input_ids: Tensor, position_ids: Tensor, ids: Tensor | None,
                     layout: BatchLayout | None, tokens: RealTokens,
                     query_index: Tensor | None, output_hidden_states: bool
                     ) -> Tensor | HiddenStates:
        """`forward` on the real tokens only (`RealTokens`): gathered once before the
        embeddings, put back in their rows (zeros at padding) at the end; a sparse last layer
        takes its P queries from the rows (`ModernBertLayer.forward_queries`)."""
        x = self.embeddings(tokens.gather(input_ids))  # (N, H)
        positions = tokens.gather(position_ids)  # (N,)
        inputs = self.real_inputs(tokens, positions, x.dtype)
        states, last = [x], len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if i == last and query_index is not None:
                real, rows = inputs[layer.is_global], None
                if not layer.queries_by_chunks(real, x.shape[0], query_index):
                    rows = self.layer_inputs(ids, position_ids, layout, x.dtype,
                                             kinds=(layer.is_global,))[layer.is_global]
                return self.final_norm(layer.forward_queries(x, tokens, real, rows, query_index))
            x = layer.forward_real(x, inputs[layer.is_global])
            states.append(x)
        x = tokens.pad(self.final_norm(x))  # (B, T, H)
        if output_hidden_states:
            return HiddenStates((*(tokens.pad(s) for s in states[:-1]), x))
        return x

    def real_tokens(self, ids: Tensor | None, layout: BatchLayout | None, shape: torch.Size,
                    device: torch.device) -> RealTokens | None:
        """The real tokens when the layers should run on them alone (`RealTokens`), else None
        (whole rows, masked where padded or packed).

        CPU: every batch but one whose instances are not each one run of tokens: padded or
        packed rows from the layout's plan (or one made here: the ids are on the host
        already), full rows as one bucket (for the local layers' chunks). A GPU, with fp16/bf16 activations and no attention
        dropout: torch's variable-length FlashAttention kernel over every batch (its runs ask
        the device for their lengths, one wait per forward; untested here, no GPU in CI).
        Whole rows under `stock_ops()` (transformers' dropout draws, for parity checks) and
        under torch.compile (static shapes; its SDPA under a mask fuses well).
        """
        if torch.compiler.is_compiling() or stock_ops_enabled():
            return None
        B, T = shape
        if device.type == "cpu":
            if layout is not None:
                masked, plan = layout.masked, layout.plan
            else:
                plan = attention_plan(ids)
                masked = plan is not None or not one_instance_per_row(ids)
            if not masked:
                return RealTokens.of_rows(B, T, device)
            return RealTokens.of_plan(plan, B, T) if plan is not None and plan.groups else None
        weights = self.embeddings.word.weight
        if (device.type == "cuda" and half_precision_attention(weights.dtype, device)
                and (self.config.attention_dropout == 0.0 or not self.training)):
            runs = token_runs(ids, B, T, device)
            return RealTokens(runs.token_index, B, T, runs=runs)
        return None

    def real_inputs(self, tokens: RealTokens, positions: Tensor,
                    dtype: torch.dtype) -> dict[bool, RealInputs]:
        """RoPE angles (N, D) and per-bucket masks of the global (True) and local (False)
        layers on `tokens`, made once per forward."""
        config, device = self.config, positions.device
        inputs = {}
        for is_global in sorted({layer.is_global for layer in self.layers}):
            theta = config.global_rope_theta if is_global else config.local_rope_theta
            cos, sin = rotary_cos_sin(positions, theta, config.head_dim, dtype)
            window = None if is_global else config.local_attention // 2
            banded = tuple(uses_band(b, window) for b in tokens.buckets)
            masks = tuple(band_mask(b, window, device) if band else bucket_mask(b, window, device)
                          for b, band in zip(tokens.buckets, banded))
            inputs[is_global] = RealInputs(cos, sin, masks, banded, window, tokens)
        return inputs

    def layer_inputs(self, ids: Tensor | None, position_ids: Tensor, layout: BatchLayout | None,
                     dtype: torch.dtype, kinds: tuple[bool, ...] | None = None
                     ) -> dict[bool, LayerInputs]:
        """RoPE angles and masks of the global (True) and local (False) layers (or of
        `kinds`) over whole rows (B, T), made once per forward."""
        config, device = self.config, position_ids.device
        T = position_ids.shape[1]
        if layout is not None:
            masked = layout.masked
        else:  # a look at the ids would wait for a GPU: mask whenever there are ids there
            masked = ids is not None and (device.type != "cpu" or not one_instance_per_row(ids))
        same_instance = query_attention_mask(ids, None) if masked else None  # (B, 1, T, T)
        inputs = {}
        for is_global in kinds or sorted({layer.is_global for layer in self.layers}):
            theta = config.global_rope_theta if is_global else config.local_rope_theta
            cos, sin = rotary_cos_sin(position_ids, theta, config.head_dim, dtype)
            window = None if is_global else config.local_attention // 2
            mask = same_instance if is_global else both(same_instance,
                                                        window_mask(T, window, device))
            inputs[is_global] = LayerInputs(cos, sin, mask, window)
        return inputs

    def pool(self, hidden: Tensor, cls_positions: Tensor | None = None,
             sequence_ids: Tensor | None = None) -> Tensor:
        """The prediction head on each instance's summary, as transformers' classifiers:
        (B, T, H) -> (B, H) for the instance starting at position 0 of each row, or (B, K, H)
        for those starting at `cls_positions` (B, K). The summary is the [CLS] state
        (`classifier_pooling` "cls") or the mean of the instance's states ("mean": the tokens
        whose `sequence_ids` (B, T) equal its [CLS]'s; every token without them)."""
        B = hidden.shape[0]
        positions = (torch.zeros(B, 1, dtype=torch.long, device=hidden.device)
                     if cls_positions is None else cls_positions.long().clamp(min=0))  # (B, K)
        if self.config.classifier_pooling == "mean":
            summary = self.mean_states(hidden, positions, sequence_ids)  # (B, K, H)
        else:
            summary = gather_positions(hidden, positions)  # (B, K, H)
        pooled = self.pooler(summary)
        return pooled[:, 0] if cls_positions is None else pooled

    @staticmethod
    def mean_states(hidden: Tensor, positions: Tensor, sequence_ids: Tensor | None) -> Tensor:
        """The mean state of the instance at each of `positions` (B, K): (B, K, H)."""
        if sequence_ids is None:
            return hidden.mean(dim=1, keepdim=True).expand(-1, positions.shape[1], -1)
        instance = sequence_ids.gather(1, positions)  # (B, K)
        weights = (sequence_ids[:, None, :] == instance[:, :, None]).to(hidden.dtype)  # (B, K, T)
        return (weights @ hidden) / weights.sum(-1, keepdim=True).clamp(min=1)  # (B, K, H)

    def token_states(self, hidden: Tensor) -> Tensor:
        """What token-level heads classify: the prediction head on every state (..., H), as
        transformers' token-classification and question-answering models do."""
        return self.pooler(hidden)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs (forward + backward = 3 x forward, 2 per multiply-add) per token of
        the encoder at rows of `seq_len` tokens: 6 x the blocks' matrix weights, plus
        attention's two products (q k^T and p v) with 2 H FLOPs per key each, where a local
        layer's query sees at most local_attention + 1 keys. Heads add their own."""
        config = self.config
        H, I = config.hidden_size, config.intermediate_size
        per_layer = 4 * H * H + 3 * H * I  # qkv, out, wi (2I), wo
        keys = [seq_len if layer.is_global else min(seq_len, config.local_attention + 1)
                for layer in self.layers]
        return float(6 * per_layer * len(self.layers) + sum(12 * H * k for k in keys))

    def activation_bytes(self, seq_len: int, value_bytes: int) -> int:
        """Bytes the backward keeps for a row of `seq_len` tokens (values of `value_bytes`
        each), without the T x T terms a flash kernel does not store: per layer and token 8 H
        values (two LayerNorm inputs and outputs, the rotated q/k/v, the attention output) and
        the GeGLU's 4 I (input and gate, act(input), their product), plus 1-byte masks where
        dropout is on; the embeddings' LayerNorm input and the final LayerNorm's input."""
        c = self.config
        H, I = c.hidden_size, c.intermediate_size
        masks = (H if c.attention_dropout else 0) + (I if c.mlp_dropout else 0)
        per_token_layer = (8 * H + 4 * I) * value_bytes + masks
        ends = seq_len * (2 * value_bytes * H + (H if c.embedding_dropout else 0))
        return c.num_hidden_layers * seq_len * per_token_layer + ends

