"""Feature-based NER (the paper's section 5.3, Table 7): a frozen BERT's activations feed a
two-layer BiLSTM and a linear classifier; BERT itself is never updated.

The encoder runs once over every sentence (`word_states`): each word's first sub-token state in
every layer, the embeddings' output included (what `BertModel(output_hidden_states=True)`
gives). The six inputs of Table 7 (`CHOICES`) are then cheap views of those states:

| choice               | input per word |
|----------------------|----------------|
| `embeddings`         | the embeddings' output (layer 0) |
| `second_to_last`     | block L-1 |
| `last`               | block L |
| `sum_last_four`      | learned weighted sum of blocks L-3..L |
| `concat_last_four`   | the four concatenated (4H wide) |
| `sum_all`            | learned weighted sum of all L blocks |

A weighted sum is ELMo's scalar mix (Peters et al. 2018): softmax-normalised weights, one per
layer, times a learned scale. Sentences are tagged as wholes (no windows: the BiLSTM has no
length limit); each word is labelled by its first sub-token's state, the paper's choice.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from finetune.ner.data import Sentence
from finetune.ner.encode import encode_sentences
from finetune.ner.metrics import entity_scores
from model.bert import BertModel

CHOICES = ("embeddings", "second_to_last", "last", "sum_last_four", "concat_last_four",
           "sum_all")


@dataclass(frozen=True)
class TaggerConfig:
    """The BiLSTM tagger on frozen features and its training."""

    lstm_hidden: int = 768
    """Hidden units per direction of each BiLSTM layer (the paper: 768)."""
    lstm_layers: int = 2
    """Stacked BiLSTM layers (the paper: 2)."""
    dropout: float = 0.5
    """Dropout on the BiLSTM's input and output (a common choice for taggers; the paper
    gives none)."""
    learning_rate: float = 1e-3
    """Adam's learning rate."""
    epochs: int = 5
    """Passes over the training sentences."""
    batch_size: int = 32
    """Sentences per step."""
    seed: int = 1
    """Seed of the tagger's initialisation and the batch order."""

    def __post_init__(self) -> None:
        for name in ("lstm_hidden", "lstm_layers", "epochs", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"--dropout must be in [0, 1), got {self.dropout}")
        if self.learning_rate <= 0:
            raise ValueError(f"--learning_rate must be positive, got {self.learning_rate}")


@torch.inference_mode()
def word_states(encoder: BertModel, tokenizer, sentences: Sequence[Sentence],
                labels: Sequence[str], max_seq_length: int = 128,
                batch_size: int = 64) -> list[Tensor]:
    """Per sentence, (words, L + 1, H) float32 states of each word's first sub-token in every
    layer of the frozen `encoder` (layer 0 = embeddings). A sentence longer than a window is
    encoded in windows (`encode_sentences`) and its words gathered back in order."""
    encoder.eval()
    enc = encode_sentences(tokenizer, sentences, labels, max_seq_length)
    parts: list[list[Tensor]] = [[] for _ in sentences]
    order = np.argsort(enc.lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        units = order[start:start + batch_size]
        width = int(enc.lengths[units].max())
        ids = torch.zeros(len(units), width, dtype=torch.long)  # (B, T)
        mask = torch.zeros_like(ids)
        for row, u in enumerate(units):
            ids[row, :len(enc.input_ids[u])] = torch.from_numpy(enc.input_ids[u])
            mask[row, :len(enc.input_ids[u])] = 1
        layers = encoder(ids, attention_mask=mask, output_hidden_states=True).layers
        states = torch.stack(layers, dim=2).float()  # (B, T, L + 1, H)
        for row, u in enumerate(units):
            parts[enc.sentence[u]].append((int(enc.first_word[u]),
                                           states[row, torch.from_numpy(enc.word_positions[u])]))
    return [torch.cat([s for _, s in sorted(p, key=lambda x: x[0])]) for p in parts]


class ScalarMix(nn.Module):
    """gamma * sum_k softmax(w)_k * layer_k over K layers: (..., K, H) -> (..., H)."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, layers: Tensor) -> Tensor:
        return self.gamma * torch.einsum("...kh,k->...h", layers, self.weights.softmax(0))


class FeatureInput(nn.Module):
    """One Table 7 choice: (..., L + 1, H) states of every layer -> (..., D) tagger input."""

    def __init__(self, choice: str, num_hidden_layers: int, hidden_size: int):
        super().__init__()
        if choice not in CHOICES:
            raise ValueError(f"unknown feature choice {choice!r}; known: {', '.join(CHOICES)}")
        if choice in ("sum_last_four", "concat_last_four") and num_hidden_layers < 4:
            raise ValueError(f"{choice} needs 4 layers, the model has {num_hidden_layers}")
        self.choice = choice
        last = num_hidden_layers  # index of the last block (0 = embeddings)
        self.layers = {"embeddings": [0], "second_to_last": [last - 1], "last": [last],
                       "sum_last_four": list(range(last - 3, last + 1)),
                       "concat_last_four": list(range(last - 3, last + 1)),
                       "sum_all": list(range(1, last + 1))}[choice]
        self.mix = ScalarMix(len(self.layers)) if choice.startswith("sum") else None
        self.width = hidden_size * (4 if choice == "concat_last_four" else 1)

    def forward(self, states: Tensor) -> Tensor:
        chosen = states[..., self.layers, :]  # (..., K, H)
        if self.mix is not None:
            return self.mix(chosen)
        return chosen.flatten(-2)  # (..., K * H)


class FeatureTagger(nn.Module):
    """Chosen features -> two-layer BiLSTM -> linear label scores, per word."""

    def __init__(self, choice: str, num_hidden_layers: int, hidden_size: int, num_labels: int,
                 cfg: TaggerConfig):
        super().__init__()
        self.features = FeatureInput(choice, num_hidden_layers, hidden_size)
        self.dropout = nn.Dropout(cfg.dropout)
        self.lstm = nn.LSTM(self.features.width, cfg.lstm_hidden, num_layers=cfg.lstm_layers,
                            bidirectional=True, batch_first=True,
                            dropout=cfg.dropout if cfg.lstm_layers > 1 else 0.0)
        self.classifier = nn.Linear(2 * cfg.lstm_hidden, num_labels)

    def forward(self, states: Tensor, lengths: Tensor) -> Tensor:
        """states (B, W, L + 1, H), lengths (B,) words -> logits (B, W, num_labels)."""
        x = self.dropout(self.features(states))  # (B, W, D)
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        out, _ = self.lstm(packed)
        out, _ = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                  total_length=states.shape[1])  # (B, W, 2h)
        return self.classifier(self.dropout(out))


def _batch(states: Sequence[Tensor], labels: Sequence[Tensor] | None, indices: Sequence[int]
           ) -> tuple[Tensor, Tensor, Tensor | None]:
    lengths = torch.tensor([len(states[i]) for i in indices])
    x = nn.utils.rnn.pad_sequence([states[i] for i in indices], batch_first=True)  # (B, W, K, H)
    y = None if labels is None else nn.utils.rnn.pad_sequence(
        [labels[i] for i in indices], batch_first=True, padding_value=-100)  # (B, W)
    return x, lengths, y


def train_tagger(choice: str, train_states: Sequence[Tensor], train_labels: Sequence[Tensor],
                 num_labels: int, hidden_size: int, cfg: TaggerConfig) -> FeatureTagger:
    """A tagger trained with Adam on the frozen features (cross-entropy over words)."""
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    num_hidden_layers = train_states[0].shape[1] - 1
    model = FeatureTagger(choice, num_hidden_layers, hidden_size, num_labels, cfg)
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.learning_rate)
    model.train()
    for _ in range(cfg.epochs):
        order = torch.randperm(len(train_states), generator=generator).tolist()
        for start in range(0, len(order), cfg.batch_size):
            x, lengths, y = _batch(train_states, train_labels, order[start:start + cfg.batch_size])
            logits = model(x, lengths)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
    return model


@torch.inference_mode()
def predict_tags(model: FeatureTagger, states: Sequence[Tensor], labels: Sequence[str],
                 batch_size: int = 64) -> list[list[str]]:
    model.eval()
    out: list[list[str]] = []
    for start in range(0, len(states), batch_size):
        indices = list(range(start, min(start + batch_size, len(states))))
        x, lengths, _ = _batch(states, None, indices)
        ids = model(x, lengths).argmax(-1)  # (B, W)
        out.extend([labels[j] for j in ids[b, :n].tolist()] for b, n in enumerate(lengths))
    return out


@dataclass(frozen=True)
class ChoiceResult:
    """One row of the Table 7 table."""

    choice: str
    dev_f1: float
    """Entity F1 on dev (fraction)."""
    seconds: float
    """Training and scoring time of the tagger (the features are computed once for all)."""


def table7(encoder: BertModel, tokenizer, train: Sequence[Sentence], dev: Sequence[Sentence],
           labels: Sequence[str], cfg: TaggerConfig,
           choices: Sequence[str] = CHOICES,
           on_result: Callable[[ChoiceResult], None] | None = None) -> list[ChoiceResult]:
    """Dev entity F1 of a BiLSTM tagger on each feature choice of the frozen `encoder`
    (`on_result` is called with each row as soon as it is measured)."""
    label_id = {t: i for i, t in enumerate(labels)}
    train_states = word_states(encoder, tokenizer, train, labels)
    dev_states = word_states(encoder, tokenizer, dev, labels)
    train_labels = [torch.tensor([label_id[t] for t in s.tags]) for s in train]
    gold = [list(s.tags) for s in dev]
    hidden = encoder.config.hidden_size
    results = []
    for choice in choices:
        start = time.perf_counter()
        model = train_tagger(choice, train_states, train_labels, len(labels), hidden, cfg)
        f1 = entity_scores(gold, predict_tags(model, dev_states, labels))["f1"]
        results.append(ChoiceResult(choice, f1, time.perf_counter() - start))
        if on_result is not None:
            on_result(results[-1])
    return results


def markdown(results: Sequence[ChoiceResult]) -> str:
    rows = ["| features | dev F1 | seconds |", "|---|---:|---:|"]
    rows += [f"| {r.choice} | {100 * r.dev_f1:.1f} | {r.seconds:.0f} |" for r in results]
    return "\n".join(rows) + "\n"


__all__ = ["CHOICES", "ChoiceResult", "FeatureTagger", "TaggerConfig", "markdown", "table7",
           "word_states"]
