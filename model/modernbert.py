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

Attention runs through `scaled_dot_product_attention` under one boolean (B, 1, T, T) mask per
layer kind, made once per forward. On a GPU with `flash_attn` installed and half-precision
activations it runs `flash_attn_varlen_func` over the real tokens instead (`window_size=(w, w)`
on local layers): no T x T mask, no work on padding. That path is not exercised on CPU.

Its Hugging Face adapter is model/modernbert_hf.py.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from model.attention import (
    BatchLayout,
    instance_ids,
    one_instance_per_row,
    packed_position_ids,
    query_attention_mask,
)
from model.bert import ACTIVATIONS, HiddenStates, gather_positions, truncated_normal_
from model.cpu_ops import Dropout, attend


@dataclass(frozen=True)
class ModernBertConfig:
    """Shape and regularisation of a ModernBERT encoder (transformers' names in brackets where
    they differ)."""

    arch: ClassVar[str] = "modernbert"
    mlm_head_bias: ClassVar[bool] = False
    """The MLM transform's dense and LayerNorm have no bias (the decoder has one)."""
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
    """Turn each head's (first half, second half) pairs by the angles: x (B, T, A, D), cos and
    sin (B, T, D) -> (B, T, A, D). In float32, as transformers, whatever x's dtype."""
    cos, sin = cos[:, :, None], sin[:, :, None]  # (B, T, 1, D)
    xf = x.float()
    first, second = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat((-second, first), dim=-1) * sin).to(x.dtype)


# ---------------------------------------------------------------------------------------------
# Which tokens each layer kind sees


@dataclass(frozen=True)
class TokenRuns:
    """The real tokens of a batch as one run per instance, for `flash_attn_varlen_func`."""

    token_index: Tensor
    """(N,) flat index (row * T + position) of every real token, instance after instance."""
    cu_seqlens: Tensor
    """(runs + 1,) int32 start of each run in those N tokens, then N."""
    max_length: int
    """Length of the longest run."""


def token_runs(ids: Tensor | None, rows: int, length: int, device: torch.device) -> TokenRuns:
    """Runs of equal instance id within a row (padding -1 left out), from ids (B, T) or None
    (every row one instance). Asks the device for the run lengths (one sync per forward)."""
    if ids is None:
        token_index = torch.arange(rows * length, device=device)
        starts = torch.arange(0, rows * length, length, device=device)
    else:
        flat = ids.reshape(-1)
        token_index = (flat >= 0).nonzero().squeeze(1)  # (N,)
        run, row = flat[token_index], token_index // length
        new = torch.ones_like(token_index, dtype=torch.bool)
        new[1:] = (run[1:] != run[:-1]) | (row[1:] != row[:-1])
        starts = new.nonzero().squeeze(1)
    total = torch.tensor([token_index.numel()], device=device)
    cu_seqlens = torch.cat([starts, total]).int()
    return TokenRuns(token_index, cu_seqlens, int(cu_seqlens.diff().max()) if len(starts) else 0)


@dataclass(frozen=True)
class LayerInputs:
    """What every layer of one kind (global or local) attends with, made once per forward."""

    cos: Tensor
    """(B, T, D) cosines of the RoPE angles at this kind's theta."""
    sin: Tensor
    """(B, T, D) sines."""
    mask: Tensor | None
    """(B or 1, 1, T, T) True = may attend (same instance, and within the window on local
    layers); None when nothing is masked. Unused with `runs`."""
    window: int | None
    """Tokens seen each side on local layers (local_attention // 2); None on global ones."""
    runs: TokenRuns | None = None
    """The real tokens for flash attention's variable-length kernel; None: SDPA under `mask`."""


def window_mask(length: int, window: int, device: torch.device) -> Tensor | None:
    """(1, 1, T, T) True where |i - j| <= window; None when every pair of the row is within it."""
    if length - 1 <= window:
        return None
    keys = torch.arange(length, device=device)
    return ((keys[:, None] - keys[None, :]).abs() <= window)[None, None]


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


@functools.cache
def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def half_precision_attention(x: Tensor) -> bool:
    """Whether q, k and v will be fp16 or bf16 (flash attention takes no other): the hidden
    states are, or autocast makes the projections so."""
    half = (torch.float16, torch.bfloat16)
    device = x.device.type
    return x.dtype in half or (torch.is_autocast_enabled(device)
                               and torch.get_autocast_dtype(device) in half)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, runs: TokenRuns, window: int | None,
                     dropout_p: float) -> Tensor:
    """Attention within each run of `runs` (and within `window` each side) by flash attention's
    variable-length kernel: q, k, v (B, T, A, D) -> (B, T, A, D), zeros at padding."""
    from flash_attn import flash_attn_varlen_func  # GPU only

    B, T, A, D = q.shape

    def unpad(t: Tensor) -> Tensor:
        return t.reshape(B * T, A, D).index_select(0, runs.token_index)  # (N, A, D)

    y = flash_attn_varlen_func(
        unpad(q), unpad(k), unpad(v), runs.cu_seqlens, runs.cu_seqlens, runs.max_length,
        runs.max_length, dropout_p=dropout_p, causal=False,
        window_size=(-1, -1) if window is None else (window, window))  # (N, A, D)
    return q.new_zeros(B * T, A, D).index_copy(0, runs.token_index, y).view(B, T, A, D)


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
    (B, T, H) -> (B, T, H), or (B, P, H) for the queries at `query_index` (B, P)."""

    def __init__(self, config: ModernBertConfig):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.dropout_p = config.attention_dropout
        self.dropout = Dropout(config.attention_dropout)  # on the output too, as transformers

    def forward(self, x: Tensor, inputs: LayerInputs, query_index: Tensor | None = None) -> Tensor:
        B, T, H = x.shape
        A = self.num_heads
        q, k, v = self.qkv(x).view(B, T, 3, A, H // A).unbind(2)  # 3 x (B, T, A, D)
        q, k = apply_rotary(q, inputs.cos, inputs.sin), apply_rotary(k, inputs.cos, inputs.sin)
        dropout_p = self.dropout_p if self.training else 0.0
        if inputs.runs is not None:
            y = varlen_attention(q, k, v, inputs.runs, inputs.window, dropout_p)  # (B, T, A, D)
            if query_index is not None:
                y = y.gather(1, query_index[:, :, None, None].expand(-1, -1, A, H // A))
        else:
            mask = inputs.mask
            if query_index is not None:
                q = q.gather(1, query_index[:, :, None, None].expand(-1, -1, A, H // A))
                mask = query_rows(mask, query_index)  # (B, 1, P, T)
            y = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                       dropout_p).transpose(1, 2)  # (B, A, P, D) -> (B, P, A, D)
        return self.dropout(self.out(y.reshape(B, -1, H)))  # (B, P, H)


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
        `layout`: the loader's `BatchLayout`; only its `masked` is read (whether any row is
        padded or packed), which saves a look at the ids.
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
        x = self.embeddings(input_ids)
        inputs = self.layer_inputs(ids, position_ids, layout, x)
        query_index = None if output_positions is None else output_positions.long()
        states, last = [x], len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x, inputs[layer.is_global], query_index if i == last else None)
            states.append(x)
        x = self.final_norm(x)
        if output_hidden_states:
            return HiddenStates((*states[:-1], x))
        return x

    def layer_inputs(self, ids: Tensor | None, position_ids: Tensor, layout: BatchLayout | None,
                     x: Tensor) -> dict[bool, LayerInputs]:
        """RoPE angles and masks (or flash attention's token runs) of the global (True) and
        local (False) layers, made once per forward."""
        config, device = self.config, x.device
        B, T, _ = x.shape
        runs = None
        if device.type == "cuda" and flash_attn_installed() and half_precision_attention(x):
            runs = token_runs(ids, B, T, device)
            same_instance = None
        else:
            if layout is not None:
                masked = layout.masked
            else:  # a look at the ids would wait for a GPU: mask whenever there are ids there
                masked = ids is not None and (device.type != "cpu" or not one_instance_per_row(ids))
            same_instance = query_attention_mask(ids, None) if masked else None  # (B, 1, T, T)
        inputs = {}
        for is_global in sorted({layer.is_global for layer in self.layers}):
            theta = config.global_rope_theta if is_global else config.local_rope_theta
            cos, sin = rotary_cos_sin(position_ids, theta, config.head_dim, x.dtype)
            window = None if is_global else config.local_attention // 2
            mask = None
            if runs is None:
                mask = same_instance if is_global else both(same_instance,
                                                            window_mask(T, window, device))
            inputs[is_global] = LayerInputs(cos, sin, mask, window, runs)
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

