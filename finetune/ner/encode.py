"""NER sentences -> word pieces labelled on each word's first sub-token, and packed batches.

The paper (section 5.3) feeds WordPiece tokens and scores each word at its first sub-token; the
other sub-tokens carry no label (-100) and no prediction. Every word is predicted:
- a word the tokenizer turns into nothing (a lone control or zero-width character) is encoded as
  `[UNK]` (counted: `EncodedNer.unknown_words`);
- a sentence longer than `max_seq_length - 2` word pieces is cut at word boundaries into
  consecutive windows, each its own unit, each word labelled in exactly one window (counted:
  `split_sentences`); a single word longer than a whole window keeps its first pieces
  (`truncated_words`);
- with `document_context` (the paper's "maximal document context"), a unit's window is widened
  with the words around it in its document, alternately before and after, as far as
  `max_seq_length` allows; those context words are not labelled.

Units: one per window (a sentence, unless split). `make_batch` packs a batch's units into rows of
`max_seq_length` tokens (`sequence_ids` keeps each unit's attention to itself), as GLUE does.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from finetune.ner.data import Sentence
from finetune.packing import lay_out, one_per_row, pack_rows


@dataclass(frozen=True)
class EncodedNer:
    """A split's units: word-piece ids with [CLS]/[SEP], and where each labelled word is."""

    input_ids: list[np.ndarray]
    """Per unit, (T_u,) int64 token ids: [CLS] context + window + context [SEP]."""
    word_positions: list[np.ndarray]
    """Per unit, (W_u,) int64 position of each window word's first sub-token."""
    word_labels: list[np.ndarray]
    """Per unit, (W_u,) int64 gold label ids of the window's words."""
    sentence: np.ndarray
    """(N,) index of each unit's sentence in the split."""
    first_word: np.ndarray
    """(N,) index within its sentence of the unit's first window word."""
    num_sentences: int
    """Sentences encoded (units may be more)."""
    split_sentences: int
    """Sentences cut into more than one window."""
    unknown_words: int
    """Words with no word piece, encoded as [UNK]."""
    truncated_words: int
    """Words longer than a whole window, cut to its length."""

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.fromiter((len(x) for x in self.input_ids), dtype=np.int64, count=len(self))


def raw_tokenizer(tokenizer):
    """A `tokenizers.Tokenizer` copy without truncation or padding, from either that or a
    `transformers` fast tokenizer (whose `backend_tokenizer` it is).

    A copy: the caller's tokenizer may truncate (GLUE's does), and a truncated sentence would
    lose words from scoring."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def word_pieces(tokenizer, sentences: Sequence[Sentence], batch_size: int = 1024
                ) -> tuple[list[list[list[int]]], int]:
    """Per sentence, per word, its word-piece ids (no special tokens); and how many words had
    none and became [UNK]. `tokenizer` as returned by `raw_tokenizer`."""
    unk = tokenizer.token_to_id("[UNK]")
    if unk is None:
        raise ValueError("the tokenizer's vocabulary has no [UNK]")
    pieces: list[list[list[int]]] = []
    unknown = 0
    for start in range(0, len(sentences), batch_size):
        chunk = [list(s.words) for s in sentences[start:start + batch_size]]
        encodings = tokenizer.encode_batch(chunk, is_pretokenized=True, add_special_tokens=False)
        for words, enc in zip(chunk, encodings):
            per_word: list[list[int]] = [[] for _ in words]
            for token_id, word in zip(enc.ids, enc.word_ids):
                per_word[word].append(token_id)
            for ids in per_word:
                if not ids:
                    ids.append(unk)
                    unknown += 1
            pieces.append(per_word)
    return pieces, unknown


def windows(lengths: Sequence[int], budget: int) -> list[tuple[int, int]]:
    """Consecutive [start, end) word ranges of at most `budget` pieces each (a word longer than
    the budget alone in its window)."""
    out, start, used = [], 0, 0
    for i, n in enumerate(lengths):
        if i > start and used + n > budget:
            out.append((start, i))
            start, used = i, 0
        used += n
    out.append((start, len(lengths)))
    return out


def encode_sentences(tokenizer, sentences: Sequence[Sentence], labels: Sequence[str],
                     max_seq_length: int, document_context: bool = False) -> EncodedNer:
    """Units of `sentences` (see the module docstring). `labels`: the label list; a tag not in
    it is an error (check it with `data.check_labels` first, which names the line)."""
    if max_seq_length < 3:
        raise ValueError(f"max_seq_length must be >= 3, got {max_seq_length}")
    tok = raw_tokenizer(tokenizer)
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    label_id = {tag: i for i, tag in enumerate(labels)}
    pieces, unknown = word_pieces(tok, sentences)
    budget = max_seq_length - 2
    documents = _documents(sentences)
    input_ids, positions, word_labels, unit_sentence, unit_first = [], [], [], [], []
    split = truncated = 0
    for s, (sentence, words) in enumerate(zip(sentences, pieces)):
        truncated += sum(len(w) > budget for w in words)
        words = [w[:budget] for w in words]
        spans = windows([len(w) for w in words], budget)
        split += len(spans) > 1
        for start, end in spans:
            before, after = (_context(documents, pieces, s, start, end, budget)
                             if document_context else ([], []))
            ids = [cls_id, *before]
            pos = []
            for w in words[start:end]:
                pos.append(len(ids))
                ids.extend(w)
            ids.extend(after)
            ids.append(sep_id)
            input_ids.append(np.asarray(ids, dtype=np.int64))
            positions.append(np.asarray(pos, dtype=np.int64))
            word_labels.append(np.asarray([label_id[t] for t in sentence.tags[start:end]],
                                          dtype=np.int64))
            unit_sentence.append(s)
            unit_first.append(start)
    return EncodedNer(input_ids, positions, word_labels, np.asarray(unit_sentence, np.int64),
                      np.asarray(unit_first, np.int64), len(sentences), split, unknown, truncated)


def _documents(sentences: Sequence[Sentence]) -> list[list[int]]:
    """Per sentence, the indices of the sentences of its document (consecutive in the split)."""
    groups: dict[int, list[int]] = {}
    for i, s in enumerate(sentences):
        groups.setdefault(s.document, []).append(i)
    return [groups[s.document] for s in sentences]


def _context(documents: list[list[int]], pieces: list[list[list[int]]], s: int, start: int,
             end: int, budget: int) -> tuple[list[int], list[int]]:
    """Word pieces of the document's words before and after words [start, end) of sentence s,
    taken a word at a time, alternately before and after, while they fit in `budget`."""
    doc = documents[s]
    flat = [(i, w) for i in doc for w in range(len(pieces[i]))]
    lo = flat.index((s, start))
    hi = lo + (end - start)
    room = budget - sum(len(pieces[s][w][:budget]) for w in range(start, end))
    left, right = lo, hi
    grew = True
    while grew:
        grew = False
        if left > 0 and len(pieces[flat[left - 1][0]][flat[left - 1][1]]) <= room:
            left -= 1
            room -= len(pieces[flat[left][0]][flat[left][1]])
            grew = True
        if right < len(flat) and len(pieces[flat[right][0]][flat[right][1]]) <= room:
            room -= len(pieces[flat[right][0]][flat[right][1]])
            right += 1
            grew = True

    def ids(a: int, b: int) -> list[int]:
        return [t for i, w in flat[a:b] for t in pieces[i][w]]

    return ids(left, lo), ids(hi, right)


@dataclass(frozen=True)
class NerBatch:
    """Units packed into R rows of T tokens; B units of at most W labelled words each."""

    input_ids: Tensor
    """(R, T) token ids, 0 after a row's last unit."""
    sequence_ids: Tensor
    """(R, T) slot of the unit each token belongs to, -1 for padding."""
    label_index: Tensor
    """(L,) flat index (row * T + position) of every labelled token: each window word's first
    sub-token (found on the host, so the loss needs no device-to-host sync)."""
    labels: Tensor
    """(L,) gold label ids at `label_index`."""
    word_index: Tensor
    """(B, W) flat index (row * T + position) of each unit's window words, 0 past the end."""
    word_mask: Tensor
    """(B, W) True at a unit's real words."""


def make_batch(encoded: EncodedNer, indices: Sequence[int], max_seq_length: int,
               pack: bool = True, row_length: int | None = None) -> NerBatch:
    """The units at `indices` packed into rows of `row_length` tokens (None: max_seq_length;
    `finetune.packing`; `pack=False`: one unit per row, padded to the longest).
    W = max_seq_length, so that the per-word outputs of every batch have one shape."""
    ids = [encoded.input_ids[i] for i in indices]
    layout = (pack_rows([len(x) for x in ids], row_length or max_seq_length) if pack
              else one_per_row(len(ids)))
    out = lay_out(ids, None, layout)
    first = out.first_token()  # (B,)
    word_index = np.zeros((len(indices), max_seq_length), np.int64)  # (B, W)
    word_mask = np.zeros((len(indices), max_seq_length), bool)  # (B, W)
    for j, i in enumerate(indices):
        pos = encoded.word_positions[i]
        word_index[j, :len(pos)] = first[j] + pos
        word_mask[j, :len(pos)] = True
    label_index = word_index[word_mask]  # (L,) units in batch order, words in order
    labels = np.concatenate([encoded.word_labels[i] for i in indices])  # (L,)
    return NerBatch(*(torch.from_numpy(a) for a in (out.input_ids, out.sequence_ids, label_index,
                                                     labels, word_index, word_mask)))
