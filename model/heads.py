"""The task heads, on any encoder of the registry (model/encoders.py: BERT, ModernBERT):
pre-training (masked LM + next sentence; the left-to-right LM of the paper's ablation), sequence
and token classification, question answering (span start/end) and multiple choice. Each head
builds its encoder from the config it is given (`build_encoder`) and keeps it as `bert`; its
`kind` and `options()` say what it is (`HEADS`: our checkpoints and the Hugging Face export read
them).

Batch dictionary of pre-training (what the shard loader's collate returns; B rows, T tokens,
M masked positions, K instances per row; every tensor int64 unless noted):

| key                   | shape           | padding | meaning |
|-----------------------|-----------------|---------|---------|
| `input_ids`           | (B, T)          | 0 (`[PAD]`) | token ids, masked positions already replaced |
| `token_type_ids`      | (B, T)          | 0       | segment A = 0, B = 1 (the shards' `segment_ids`) |
| `attention_mask`      | (B, T)          | 0       | 1 = real token |
| `sequence_ids`        | (B, T)          | -1      | instance index within a packed row (all 0 unpacked) |
| `position_ids`        | (B, T)          | 0       | positions restarting at 0 for each instance |
| `masked_lm_positions` | (B, M)          | 0       | row-relative positions of the masked tokens |
| `masked_lm_ids`       | (B, M)          | -100    | original token ids at those positions |
| `next_sentence_label` | (B,) or (B, K)  | -100    | 1 = random B, 0 = actual next, -1 = MLM-only (no NSP loss) |

`BertForPreTraining(**batch)` and `BertForNextToken(**batch)` accept exactly these keys (and
optional `cls_positions` (B, K), else found from `sequence_ids`). The MLM head runs only at the
(B, M) masked positions: gather first, then transform and project onto the vocabulary (the dense projection of every token is
wasted work: 85% of it is never scored). For the same reason the encoder's last layer computes
attention output and feed-forward only for the masked positions and the `[CLS]`s. Losses are means over the labelled masked tokens and
over the labelled instances, as in the reference `run_pretraining.py`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model.attention import BatchLayout, instance_ids
from model.bert import ACTIVATIONS
from model.encoders import build_encoder

IGNORE_INDEX = -100


@dataclass
class PreTrainingOutput:
    """Outputs of `BertForPreTraining` and `BertForNextToken` (whose next-token scores are the
    `mlm_` fields: one tied head, one set of metric names); losses and counts are None without
    labels."""

    mlm_logits: Tensor
    """(B, M, V) scores at `masked_lm_positions` (padding positions included, ignore them); for
    the left-to-right model (B, T - 1, V), position t scoring token t + 1; (N, V) at the
    labelled positions only where `mlm_rows` is set."""
    nsp_logits: Tensor | None
    """(B, 2) or (B, K, 2) next-sentence scores per instance; None for the MLM-only model."""
    mlm_rows: Tensor | None = None
    """(N,) flat index into (B, M) of the rows `mlm_logits` holds, when the head scored only the
    labelled masked positions (`labelled_rows`, as transformers' `sparse_prediction`); None when
    it scored them all."""
    loss: Tensor | None = None
    """mlm_loss + nsp_loss (scalar)."""
    mlm_loss: Tensor | None = None
    """Mean cross-entropy over labelled masked tokens (scalar; 0 when there are none); for the
    left-to-right model over every next token of the same instance."""
    nsp_loss: Tensor | None = None
    """Mean cross-entropy over labelled instances (scalar; 0 when there are none)."""
    mlm_correct: Tensor | None = None
    """Number of labelled masked tokens predicted right (0-dim int64)."""
    mlm_count: Tensor | None = None
    """Number of labelled masked tokens (0-dim int64)."""
    nsp_correct: Tensor | None = None
    """Number of labelled instances predicted right (0-dim int64)."""
    nsp_count: Tensor | None = None
    """Number of labelled instances (0-dim int64)."""


@dataclass
class MultipleChoiceOutput:
    """Outputs of `BertForMultipleChoice`."""

    logits: Tensor
    """(B, C) score of each choice; softmax over C gives the choice probabilities."""
    loss: Tensor | None = None
    """Cross-entropy of the gold choice (scalar); None without labels."""



@dataclass
class SequenceClassifierOutput:
    """Outputs of `BertForSequenceClassification`."""

    logits: Tensor
    """(B, num_labels) class scores, or (B, 1) regression values."""
    loss: Tensor | None = None
    """Cross-entropy (classification) or mean squared error (regression); None without labels."""


@dataclass
class QuestionAnsweringOutput:
    """Outputs of `BertForQuestionAnswering`."""

    start_logits: Tensor
    """(B, T) score of each token as the answer's first token: S . T_i."""
    end_logits: Tensor
    """(B, T) score of each token as the answer's last token: E . T_j."""
    loss: Tensor | None = None
    """Mean of the start and end cross-entropies; None without positions."""


class MaskedLMHead(nn.Module):
    """Transform (dense + GELU + LayerNorm), then the decoder tied to the word embeddings + bias.

    (..., H) -> (..., V). Callers gather the masked positions first.
    """

    def __init__(self, config: Any, word_embeddings: nn.Embedding):
        super().__init__()
        bias = config.mlm_head_bias  # BERT's transform has biases, ModernBERT's has none
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=bias)
        self.activation = ACTIVATIONS[config.hidden_act]
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=bias)
        # Tied: the decoder's weight is the word embedding Parameter itself. A module (rather
        # than F.linear on the embedding) lets ZeRO-3 gather the weight with this module's hooks.
        self.decoder = nn.Linear(config.hidden_size, config.embedding_rows, bias=False)
        self.decoder.weight = word_embeddings.weight
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        self.vocab_size = config.vocab_size

    def forward(self, hidden: Tensor) -> Tensor:
        scores = self.decoder(self.norm(self.activation(self.dense(hidden))))  # (..., rows)
        if scores.shape[-1] != self.vocab_size:  # padded rows (`vocab_multiple`): not tokens
            return scores[..., :self.vocab_size] + self.bias
        if scores.dtype != self.bias.dtype:  # autocast: the sum is in the bias's dtype
            return scores + self.bias
        # In place, the same sum: a new (N, V) tensor costs on the CPU as much again in page
        # faults as the add itself (the product's backward does not read its output)
        return scores.add_(self.bias)


def masked_mean_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean cross-entropy, correct, count) over labels >= 0; logits (N, C), labels (N,).

    Computed without a host sync or a NaN when nothing is labelled (the loss is then 0).
    """
    valid = labels >= 0
    safe = labels.clamp(min=0)
    logits32 = logits.float()
    if logits32.device.type == "cpu" and not torch.compiler.is_compiling():
        losses = _CrossEntropy.apply(logits32, safe)
    else:
        losses = F.cross_entropy(logits32, safe, reduction="none")
    count = valid.sum()
    loss = (losses * valid).sum() / count.clamp(min=1)
    correct = ((logits.argmax(-1) == safe) & valid).sum()
    return loss, correct, count


class _CrossEntropy(torch.autograd.Function):
    """`F.cross_entropy(logits, labels, reduction="none")` (N, C), (N,) -> (N,), the very same
    numbers forward and backward (the same log_softmax, nll and log_softmax-backward kernels),
    with one (N, C) tensor fewer in the backward: log_softmax's gradient is written over
    nll_loss's (the kernel reads each row's sum before it writes the row). On the CPU a new
    (N, C) tensor costs as much in page faults as a pass over it: at the MLM head's
    N x 50,368 that is 0.1 s a step."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor) -> Tensor:
        log_probs = torch.log_softmax(logits, -1)  # (N, C)
        ctx.save_for_backward(log_probs, labels)
        return -log_probs.gather(1, labels[:, None]).squeeze(1)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        log_probs, labels = ctx.saved_tensors
        grad_log_probs = torch.zeros_like(log_probs).scatter_(1, labels[:, None], -grad[:, None])
        return torch._log_softmax_backward_data(grad_log_probs, log_probs, 1, log_probs.dtype,
                                                out=grad_log_probs), None


def labelled_rows(labels: Tensor) -> Tensor | None:
    """(N,) flat index of the labelled entries (>= 0) of `labels` (B, M) when the MLM head
    scores those rows only, else None (every row scored, or every row labelled). The encoder's
    config asks for it (`sparse_prediction`: ModernBERT's yes, BERT's no, which keeps BERT's
    numbers bit for bit: its bias gradients would sum fewer rows).

    Only on the CPU in eager mode. A batch's M is its longest row's count of masked tokens, so
    shorter rows pad to it, and each padding row would cost as much as a labelled one in the
    decoder's (H x V) product and the softmax over V: at 512 tokens, rows of (1, 0.7, 0.45,
    0.25) x 512 score 616 rows for 368 labels. On the CPU the count costs no wait for a device;
    on a GPU, and under torch.compile, shapes stay static instead.
    """
    if labels.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    labelled = labels.flatten() >= 0
    if bool(labelled.all()):
        return None
    return labelled.nonzero().squeeze(1)


def instance_cls_positions(sequence_ids: Tensor, num_instances: int) -> Tensor:
    """Start (the `[CLS]`) of instances 0..K-1 in each packed row. (B, T) -> (B, K)

    Rows with fewer instances get position 0 for the missing ones (their labels are padding).
    """
    k = torch.arange(num_instances, device=sequence_ids.device)
    is_k = sequence_ids[:, None, :] == k[None, :, None]  # (B, K, T)
    return is_k.int().argmax(dim=-1)


def padding_ids(attention_mask: Tensor | None) -> Tensor | None:
    """(B, T) instance ids of unpacked rows: 0 for tokens, -1 for padding (None stays None)."""
    return None if attention_mask is None else attention_mask.long() - 1


def tied_lm_head(config: Any, bert: nn.Module) -> tuple[MaskedLMHead, tuple[nn.Module, ...]]:
    """The MLM head on `bert`, its decoder tied to the word embeddings, and the layers of it
    still to initialise (`init_head_layer`, after the caller's other new layers are built:
    the order draws the same numbers as transformers' peer)."""
    mlm = MaskedLMHead(config, bert.word_embeddings)
    if (transform := bert.mlm_transform) is not None:
        # the encoder's prediction head is the transform (ModernBERT): one module, trained
        # by the MLM loss and kept with the encoder, as transformers' one `head`
        mlm.dense, mlm.norm = transform.dense, transform.norm
        return mlm, ()
    return mlm, (mlm.dense, mlm.norm)


class BertForPreTraining(nn.Module):
    """BERT with the masked-LM head and, unless `next_sentence=False` (MLM-only), the NSP head.
    The left-to-right baseline is `BertForNextToken`."""

    kind: ClassVar[str] = "pretraining"

    def __init__(self, config: Any, next_sentence: bool = True):
        if config.is_decoder:
            # a masked token is read from both sides, and a causal [CLS] has seen only itself
            raise ValueError("a causal encoder (is_decoder) is the left-to-right model's, which "
                             "has no next-sentence head and predicts every next token: "
                             "model.heads.BertForNextToken")
        super().__init__()
        self.config = config
        self.next_sentence = next_sentence
        self.bert = build_encoder(config)
        self.mlm, new_layers = tied_lm_head(config, self.bert)
        self.nsp = nn.Linear(config.hidden_size, 2) if next_sentence else None
        for module in (*new_layers, self.nsp):
            if module is not None:
                self.bert.init_head_layer(module)

    def options(self) -> dict[str, Any]:
        return {"next_sentence": self.nsp is not None}

    def forward(self, input_ids: Tensor, masked_lm_positions: Tensor,
                token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                sequence_ids: Tensor | None = None, position_ids: Tensor | None = None,
                masked_lm_ids: Tensor | None = None, next_sentence_label: Tensor | None = None,
                cls_positions: Tensor | None = None,
                layout: BatchLayout | None = None) -> PreTrainingOutput:
        """Scores at the masked positions and per instance, and the losses when labels are given.

        Shapes as in the module docstring. Losses need `masked_lm_ids`; the NSP loss needs
        `next_sentence_label`. `layout`: see `BertModel.forward`.
        """
        masked = masked_lm_positions.long()
        per_instance = cls_positions is not None or (
            next_sentence_label is not None and next_sentence_label.dim() == 2)
        cls_positions = self.find_cls_positions(input_ids, sequence_ids, next_sentence_label,
                                                cls_positions)
        # Only the masked tokens and the [CLS]s leave the encoder (its last layer computes only
        # them); everything else would be discarded: gather first, then project.
        wanted = masked if cls_positions is None else torch.cat([masked, cls_positions], dim=1)
        states = self.bert(input_ids, token_type_ids, attention_mask, sequence_ids, position_ids,
                           output_positions=wanted, layout=layout)  # (B, M + K, H)
        rows = (labelled_rows(masked_lm_ids)
                if masked_lm_ids is not None and self.config.sparse_prediction else None)
        hidden = states[:, :masked.shape[1]]  # (B, M, H)
        if rows is not None:  # the labelled rows only
            hidden = hidden.flatten(0, 1).index_select(0, rows)  # (N, H)
        mlm_logits = self.mlm(hidden)  # (B, M, V) or (N, V)
        nsp_logits = None
        if self.nsp is not None:
            nsp_logits = self.nsp(self.bert.pooler(states[:, masked.shape[1]:]))  # (B, K, 2)
            if not per_instance:
                nsp_logits = nsp_logits[:, 0]  # one instance per row: (B, 2)
        out = PreTrainingOutput(mlm_logits=mlm_logits, nsp_logits=nsp_logits, mlm_rows=rows)
        if masked_lm_ids is None:
            return out
        labels = masked_lm_ids.flatten()
        out.mlm_loss, out.mlm_correct, out.mlm_count = masked_mean_loss(
            mlm_logits.flatten(0, -2), labels if rows is None else labels.index_select(0, rows))
        out.loss = out.mlm_loss
        if nsp_logits is not None and next_sentence_label is not None:
            out.nsp_loss, out.nsp_correct, out.nsp_count = masked_mean_loss(
                nsp_logits.reshape(-1, 2), next_sentence_label.flatten())
            out.loss = out.loss + out.nsp_loss
        return out

    def find_cls_positions(self, input_ids: Tensor, sequence_ids: Tensor | None,
                           next_sentence_label: Tensor | None,
                           cls_positions: Tensor | None) -> Tensor | None:
        """Where each instance's [CLS] is: (B, 1) zeros for one instance per row, (B, K) for
        per-instance labels (from `sequence_ids` unless given); None for the MLM-only model."""
        if self.nsp is None:
            return None
        if cls_positions is not None:
            return cls_positions.long().clamp(min=0)
        if next_sentence_label is None or next_sentence_label.dim() == 1:
            return torch.zeros(input_ids.shape[0], 1, dtype=torch.long, device=input_ids.device)
        if sequence_ids is None:
            raise ValueError("per-instance next_sentence_label (B, K) needs sequence_ids or "
                             "cls_positions to find each instance's [CLS]")
        return instance_cls_positions(sequence_ids, next_sentence_label.shape[1])


class BertForNextToken(nn.Module):
    """The paper's left-to-right baseline ("LTR & No NSP", section 5.1, Table 5): the encoder
    under causal attention (its config's `is_decoder`, which training/objectives.py `ltr` sets),
    the MLM head's transform and tied decoder scoring token t + 1 at every position t, no NSP
    head. Its keys are `BertForPreTraining(next_sentence=False)`'s (`bert.`, `mlm.`), which
    transformers' `BertLMHeadModel` reads as `cls.predictions`."""

    kind: ClassVar[str] = "next_token"

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        self.bert = build_encoder(config)
        self.mlm, new_layers = tied_lm_head(config, self.bert)  # `mlm`: the keys of the export
        for module in new_layers:
            self.bert.init_head_layer(module)

    def options(self) -> dict[str, Any]:
        return {}

    def forward(self, input_ids: Tensor, masked_lm_positions: Tensor,
                token_type_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                sequence_ids: Tensor | None = None, position_ids: Tensor | None = None,
                masked_lm_ids: Tensor | None = None, next_sentence_label: Tensor | None = None,
                cls_positions: Tensor | None = None,
                layout: BatchLayout | None = None) -> PreTrainingOutput:
        """Left-to-right LM on a pre-training batch (the module docstring's keys): the shards'
        masks are undone (the labels put back at `masked_lm_positions`), then every token
        predicts the next token of its instance; padding and the last token of each instance
        have no label. The batch's next-sentence labels, `cls_positions` and `layout` (made
        for the masked input) are not used. Scores (B, T - 1, V) in `mlm_logits`."""
        ids = input_ids.long()
        if masked_lm_ids is not None:
            labels, positions = masked_lm_ids.long(), masked_lm_positions.long()
            current = ids.gather(1, positions)  # (B, M)
            ids = ids.scatter(1, positions, torch.where(labels >= 0, labels, current))
        hidden = self.bert(ids, token_type_ids, attention_mask, sequence_ids, position_ids)
        logits = self.mlm(hidden[:, :-1])  # (B, T - 1, V)
        out = PreTrainingOutput(mlm_logits=logits, nsp_logits=None)
        if masked_lm_ids is None:
            return out
        instance = instance_ids(attention_mask, sequence_ids, ids)  # (B, T) or None
        targets = ids[:, 1:]  # (B, T - 1)
        if instance is not None:
            same = (instance[:, 1:] == instance[:, :-1]) & (instance[:, 1:] >= 0)
            targets = targets.masked_fill(~same, IGNORE_INDEX)
        out.mlm_loss, out.mlm_correct, out.mlm_count = masked_mean_loss(
            logits.flatten(0, 1), targets.flatten())
        out.loss = out.mlm_loss
        return out


class FineTuningModel(nn.Module):
    """What every fine-tuning model holds: its config and the encoder (`bert`, any arch). Its
    new layer comes from `new_head`; `from_encoder` starts the model from a pre-trained encoder."""

    kind: ClassVar[str]
    """Our checkpoints' name of the head (`HEADS`)."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        self.bert = build_encoder(config)

    def options(self) -> dict[str, Any]:
        """The constructor's arguments besides the config."""
        return {}

    def new_head(self, outputs: int) -> nn.Linear:
        """A Linear(hidden, outputs) drawn as the encoder's peer draws a new head
        (`init_head_layer`: BERT's truncated N(0, initializer_range), ModernBERT's
        truncated N(0, 1 / sqrt(H))), zero bias."""
        head = nn.Linear(self.config.hidden_size, outputs)
        self.bert.init_head_layer(head)
        return head

    @classmethod
    def from_encoder(cls, bert: nn.Module, *args: int, **kwargs: int) -> Self:
        """This model on a copy of a pre-trained encoder's weights (its head new); `args` and
        `kwargs` are the model's own (`num_labels`)."""
        model = cls(bert.config, *args, **kwargs)
        model.bert.load_state_dict(bert.state_dict())
        return model


class LabelClassifier(FineTuningModel):
    """A fine-tuning model whose head is dropout + one linear layer to `num_labels` scores."""

    MIN_LABELS: ClassVar[int] = 1

    def __init__(self, config: Any, num_labels: int):
        if num_labels < self.MIN_LABELS:
            raise ValueError(f"num_labels must be >= {self.MIN_LABELS}, got {num_labels}")
        super().__init__(config)
        self.num_labels = num_labels
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = self.new_head(num_labels)

    def options(self) -> dict[str, Any]:
        return {"num_labels": self.num_labels}


class BertForSequenceClassification(LabelClassifier):
    """BERT + dropout + one linear layer on the pooled `[CLS]` (paper section 4.1).

    `num_labels == 1` is regression (STS-B: mean squared error), otherwise classification.
    """

    kind = "classification"

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None) -> SequenceClassifierOutput:
        """(B, T) inputs, labels (B,) int64 class ids or float targets -> logits (B, num_labels)."""
        hidden = self.bert(input_ids, token_type_ids, attention_mask)
        pooled = self.bert.pool(hidden, sequence_ids=padding_ids(attention_mask))
        logits = self.classifier(self.dropout(pooled))
        out = SequenceClassifierOutput(logits=logits)
        if labels is not None:
            if self.num_labels == 1:
                out.loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
            else:
                out.loss = F.cross_entropy(logits.float(), labels.long())
        return out


class BertForQuestionAnswering(FineTuningModel):
    """BERT + a start vector S and an end vector E (paper section 4.2): one Linear(H, 2) over
    every token's final state, `qa_outputs` as Hugging Face names it.

    The loss is the mean of the start and end cross-entropies over the real tokens of each
    window (padding is masked, so a window's loss does not depend on the batch's width).
    Position 0 ([CLS]) is the target of windows without an answer.
    """

    kind = "question_answering"

    def __init__(self, config: Any):
        super().__init__(config)
        # dropout before the span layer where the encoder's peer has it (ModernBERT's `drop`)
        self.dropout = nn.Dropout(config.hidden_dropout_prob) if config.qa_dropout else None
        self.qa_outputs = self.new_head(2)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None) -> QuestionAnsweringOutput:
        """(B, T) inputs, positions (B,) -> start and end logits (B, T) and the loss."""
        hidden = self.bert.token_states(self.bert(input_ids, token_type_ids, attention_mask))
        if self.dropout is not None:
            hidden = self.dropout(hidden)
        logits = self.qa_outputs(hidden)  # (B, T, 2)
        start_logits, end_logits = logits.unbind(dim=-1)  # 2 x (B, T)
        out = QuestionAnsweringOutput(start_logits, end_logits)
        if start_positions is not None and end_positions is not None:
            out.loss = span_loss(start_logits, end_logits, start_positions, end_positions,
                                 attention_mask)
        return out


def span_loss(start_logits: Tensor, end_logits: Tensor, start_positions: Tensor,
              end_positions: Tensor, attention_mask: Tensor | None = None) -> Tensor:
    """(CE(start) + CE(end)) / 2 over (B, T) logits, in float32, padding masked out."""
    start, end = start_logits.float(), end_logits.float()
    if attention_mask is not None:
        pad = attention_mask == 0  # (B, T)
        start = start.masked_fill(pad, torch.finfo(torch.float32).min)
        end = end.masked_fill(pad, torch.finfo(torch.float32).min)
    return (F.cross_entropy(start, start_positions.long()) +
            F.cross_entropy(end, end_positions.long())) / 2


class BertForMultipleChoice(FineTuningModel):
    """BERT + dropout + one vector scoring each choice's pooled `[CLS]` (paper section 4.4).

    Each choice is its own sequence `[CLS] A [SEP] B_i [SEP]`; the score of choice i is the dot
    product of the vector (`classifier`, a Linear(hidden, 1) with a bias, as transformers'
    `BertForMultipleChoice`, so the weights load both ways) with that sequence's pooled
    `[CLS]` state, and a softmax over the C choices normalises them.
    """

    kind = "multiple_choice"

    def __init__(self, config: Any):
        super().__init__(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = self.new_head(1)

    def score(self, pooled: Tensor) -> Tensor:
        """Pooled `[CLS]` states (..., H) -> choice scores (...)."""
        return self.classifier(self.dropout(pooled)).squeeze(-1)

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None,
                labels: Tensor | None = None) -> MultipleChoiceOutput:
        """(B, C, T) inputs, labels (B,) gold choice -> logits (B, C)."""
        batch, choices, length = input_ids.shape

        def flat(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.reshape(batch * choices, length)  # (B * C, T)

        hidden = self.bert(flat(input_ids), flat(token_type_ids), flat(attention_mask))
        pooled = self.bert.pool(hidden, sequence_ids=padding_ids(flat(attention_mask)))
        logits = self.score(pooled).view(batch, choices)  # (B, C)
        out = MultipleChoiceOutput(logits=logits)
        if labels is not None:
            out.loss = F.cross_entropy(logits.float(), labels.long())
        return out


@dataclass
class TokenClassifierOutput:
    """Outputs of `BertForTokenClassification`."""

    logits: Tensor
    """(B, T, num_labels) label scores of every token."""
    loss: Tensor | None = None
    """Mean cross-entropy over the tokens whose label is not -100; None without labels."""


class BertForTokenClassification(LabelClassifier):
    """BERT + dropout + one linear layer on every token's last hidden state (paper section 4.3
    / 5.3: NER scores each word at its first sub-token; the caller marks the rest -100)."""

    MIN_LABELS = 2
    kind = "token_classification"

    def forward(self, input_ids: Tensor, token_type_ids: Tensor | None = None,
                attention_mask: Tensor | None = None, sequence_ids: Tensor | None = None,
                labels: Tensor | None = None) -> TokenClassifierOutput:
        """(B, T) inputs, labels (B, T) ids with -100 = not scored -> logits (B, T, num_labels).

        `sequence_ids`: packed rows, as in `BertModel.forward`."""
        hidden = self.bert(input_ids, token_type_ids, attention_mask, sequence_ids)  # (B, T, H)
        logits = self.classifier(self.dropout(self.bert.token_states(hidden)))  # (B, T, C)
        out = TokenClassifierOutput(logits=logits)
        if labels is not None:
            out.loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten().long(),
                                       ignore_index=IGNORE_INDEX)
        return out


HEADS: dict[str, type[nn.Module]] = {model.kind: model for model in (
    BertForPreTraining, BertForNextToken, BertForSequenceClassification,
    BertForQuestionAnswering, BertForMultipleChoice, BertForTokenClassification)}
"""Our models by `kind`: what our checkpoints name (model/hf.py `save_checkpoint`)."""
