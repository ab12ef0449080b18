"""SQuAD windows: question + passage as sentences A/B, sliding over long passages (paper 4.2).

`[CLS] question [SEP] passage span [SEP]`, the question cut to `max_query_length` tokens, the
passage cut into spans of at most `max_seq_length - len(question) - 3` tokens that start
`doc_stride` tokens apart, as BERT's `run_squad.py` `convert_examples_to_features` does. The
passage is tokenized once, by the checkpoint's fast tokenizer, whose offsets give each token's
characters in the original passage: answers map char -> token through them (training) and
predicted spans map back token -> char (`postprocess`), so no text is ever detokenized.

A passage token seen by several windows is scored only in the window where it has the most
context (the larger of min(left, right) + 0.01 x window length; the first window on a tie),
BERT's `_check_is_max_context`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from common.errors import BadRecord
from finetune.packing import lay_out, pack_rows, pad
from finetune.squad.data import SquadExample


def require_positive(config: object, *names: str) -> None:
    """Each field `names` of `config` is >= 1, else ValueError naming the first one that is
    not and its value."""
    for name in names:
        if (value := getattr(config, name)) < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


@dataclass(frozen=True)
class WindowConfig:
    """How questions and passages become windows (the paper's values are the defaults)."""

    max_seq_length: int = 384
    """Tokens per window, [CLS] and both [SEP]s included."""
    doc_stride: int = 128
    """Passage tokens between the starts of consecutive windows."""
    max_query_length: int = 64
    """Question tokens kept (the rest is cut)."""

    def __post_init__(self) -> None:
        # doc_stride and max_query_length are the SQuAD family's settings, no command's flags
        require_positive(self, "doc_stride", "max_query_length")
        if self.max_seq_length < self.max_query_length + 4:
            raise ValueError(f"--max_seq_length {self.max_seq_length} leaves no passage token "
                             f"after a question of up to {self.max_query_length} tokens (the "
                             "SQuAD family's max_query_length) and 3 special tokens")


@dataclass(frozen=True)
class Windows:
    """The windows of a split (the family's `Encoded`): N windows, one variable length each."""

    input_ids: list[np.ndarray]
    """(T_n,) int64 token ids of window n, no padding."""
    example_index: np.ndarray
    """(N,) the question (index into the split's examples) window n belongs to."""
    passage_start: np.ndarray
    """(N,) position of the window's first passage token: len(question) + 2."""
    offsets: list[np.ndarray]
    """(L_n, 2) int64 [start, end) characters in the passage of the window's passage tokens."""
    max_context: list[np.ndarray]
    """(L_n,) bool: the window is where this passage token has its maximal context."""
    start_positions: np.ndarray
    """(N,) position of the answer's first token; 0 ([CLS]) when the window has no answer."""
    end_positions: np.ndarray
    """(N,) position of the answer's last token; 0 when the window has no answer."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.input_ids), dtype=np.int64, count=len(self))

    def select(self, indices: Sequence[int]) -> Windows:
        """The windows at `indices` (example_index unchanged)."""
        idx = np.asarray(indices, dtype=np.int64)
        return Windows([self.input_ids[i] for i in idx], self.example_index[idx],
                       self.passage_start[idx], [self.offsets[i] for i in idx],
                       [self.max_context[i] for i in idx], self.start_positions[idx],
                       self.end_positions[idx])


def passage_tokenizer(tokenizer: Tokenizer) -> Tokenizer:
    """A copy of `tokenizer` without truncation or padding (windows are cut here)."""
    copy = Tokenizer.from_str(tokenizer.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def doc_spans(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window over `num_tokens` passage tokens (run_squad's loop)."""
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def max_context_windows(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """(num_tokens,) index of the window where each passage token has its maximal context."""
    scores = np.full((len(spans), num_tokens), -np.inf)  # (W, L)
    for w, (start, length) in enumerate(spans):
        position = np.arange(start, start + length)
        scores[w, start:start + length] = np.minimum(position - start, start + length - 1 -
                                                     position) + 0.01 * length
    return scores.argmax(axis=0)  # the first window on a tie, as `score > best_score`


def answer_tokens(offsets: np.ndarray, start_char: int, end_char: int) -> tuple[int, int] | None:
    """(first, last) passage token covering characters [start_char, end_char), or None when no
    token does (an answer of whitespace or of characters the tokenizer drops)."""
    first = int(np.searchsorted(offsets[:, 1], start_char, side="right"))
    last = int(np.searchsorted(offsets[:, 0], end_char, side="left")) - 1
    return (first, last) if first <= last else None


def cut_windows(examples: Sequence[SquadExample], tokenizer: Tokenizer, cfg: WindowConfig,
                training: bool, path: str = "") -> tuple[Windows, list[BadRecord]]:
    """Windows of every question, in question order; training windows carry the answer's token
    positions (the [CLS] at 0 when the window misses it or the question has no answer).

    Returns the windows and the training answers set aside because no token covers them.
    """
    tokenizer = passage_tokenizer(tokenizer)
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    contexts = list(dict.fromkeys(e.context for e in examples))
    encoded = dict(zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False)))
    questions = tokenizer.encode_batch([e.question for e in examples], add_special_tokens=False)
    columns: dict[str, list] = {f.name: [] for f in dataclasses.fields(Windows)}
    bad: list[BadRecord] = []
    for index, (example, question) in enumerate(zip(examples, questions)):
        passage = encoded[example.context]
        ids = np.asarray(passage.ids, dtype=np.int64)
        offsets = np.asarray(passage.offsets, dtype=np.int64).reshape(-1, 2)  # (L, 2)
        query = list(question.ids[:cfg.max_query_length])
        answer = None
        if training and example.answers:
            answer = answer_tokens(offsets, example.answers[0].start, example.answers[0].end)
            if answer is None:
                bad.append(BadRecord(file=path, record=f"question {example.qid}",
                                     reason=f"no token covers the answer "
                                            f"{example.answers[0].text!r}"))
                continue
        spans = doc_spans(len(ids), cfg.max_seq_length - len(query) - 3, cfg.doc_stride)
        best = max_context_windows(spans, len(ids))
        head = [cls_id, *query, sep_id]
        for w, (start, length) in enumerate(spans):
            end = start + length
            columns["input_ids"].append(np.asarray([*head, *ids[start:end], sep_id], np.int64))
            columns["example_index"].append(index)
            columns["passage_start"].append(len(head))
            columns["offsets"].append(offsets[start:end])
            columns["max_context"].append(best[start:end] == w)
            inside = answer is not None and start <= answer[0] and answer[1] < end
            columns["start_positions"].append(answer[0] - start + len(head) if inside else 0)
            columns["end_positions"].append(answer[1] - start + len(head) if inside else 0)
    for name in ("example_index", "passage_start", "start_positions", "end_positions"):
        columns[name] = np.asarray(columns[name], dtype=np.int64)
    return Windows(**columns), bad


@dataclass(frozen=True)
class SpanBatch:
    """Windows padded to the batch's longest: (B, T) tensors."""

    input_ids: torch.Tensor
    token_type_ids: torch.Tensor
    """0 for [CLS] question [SEP], 1 for the passage and its [SEP]."""
    attention_mask: torch.Tensor
    start_positions: torch.Tensor
    """(B,) answer start per window (0 = [CLS])."""
    end_positions: torch.Tensor
    """(B,) answer end per window."""
    seq_length: int = 0
    """Width the batch's logits are padded to in `outputs`, so batches concatenate."""


def passage_marks(windows: Windows, indices: Sequence[int]) -> list[np.ndarray]:
    """Each window's segment ids: 0 for [CLS] question [SEP], 1 from its passage on."""
    return [np.arange(len(windows.input_ids[i])) >= windows.passage_start[i] for i in indices]


def collate_windows(windows: Windows, indices: Sequence[int], seq_length: int,
                    pad_id: int = 0) -> SpanBatch:
    """The windows at `indices` padded to their longest; logits widen to `seq_length` later."""
    ids = [windows.input_ids[i] for i in indices]
    input_ids = pad(ids, pad_id)  # (B, T)
    token_type_ids = pad(passage_marks(windows, indices))  # (B, T)
    attention_mask = pad([np.ones(len(x)) for x in ids])  # (B, T)
    width = input_ids.shape[1]
    idx = np.asarray(indices, dtype=np.int64)
    return SpanBatch(torch.from_numpy(input_ids), torch.from_numpy(token_type_ids),
                     torch.from_numpy(attention_mask),
                     torch.from_numpy(windows.start_positions[idx]),
                     torch.from_numpy(windows.end_positions[idx]), max(seq_length, width))


@dataclass(frozen=True)
class PackedSpanBatch:
    """Windows packed into R shared rows of T tokens (`finetune.packing`), B windows of at most
    W tokens each: every window's start/end softmax runs over its own W tokens."""

    input_ids: torch.Tensor
    """(R, T) token ids, 0 after a row's last window."""
    token_type_ids: torch.Tensor
    """(R, T) 0 for [CLS] question [SEP], 1 for the passage and its [SEP]."""
    sequence_ids: torch.Tensor
    """(R, T) slot of the window each token belongs to, -1 for padding."""
    token_index: torch.Tensor
    """(B, W) flat index (row * T + position) of window b's token w, 0 past its end."""
    token_mask: torch.Tensor
    """(B, W) True at a window's real tokens."""
    start_positions: torch.Tensor
    """(B,) answer start per window (0 = [CLS])."""
    end_positions: torch.Tensor
    """(B,) answer end per window."""

    @property
    def seq_length(self) -> int:
        return self.token_index.shape[1]


def pack_windows(windows: Windows, indices: Sequence[int], seq_length: int,
                 row_length: int | None = None) -> PackedSpanBatch:
    """The windows at `indices` packed into rows of <= row_length tokens (None: seq_length);
    W = seq_length, so that the logits of every batch have one width."""
    ids = [windows.input_ids[i] for i in indices]
    lengths = [len(x) for x in ids]
    out = lay_out(ids, passage_marks(windows, indices), pack_rows(lengths, row_length or seq_length))
    first = out.first_token()  # (B,)
    positions = np.arange(seq_length)  # (W,)
    token_mask = positions[None, :] < np.asarray(lengths)[:, None]  # (B, W)
    token_index = np.where(token_mask, first[:, None] + positions[None, :], 0)  # (B, W)
    idx = np.asarray(indices, dtype=np.int64)
    return PackedSpanBatch(*(torch.from_numpy(a) for a in (
        out.input_ids, out.token_type_ids, out.sequence_ids, token_index, token_mask,
        windows.start_positions[idx], windows.end_positions[idx])))
