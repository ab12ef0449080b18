"""Per-token activations of a frozen BERT, written as BERT's own `extract_features.py` writes them.

Input: a text file, one example per line; `A ||| B` is a sentence pair (the reference's
`read_examples`: the line is stripped, then split at the first ` ||| ` with text on both sides).
Tokens: `[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, truncated to `max_seq_length` as the
reference does (the longer side loses a token at a time). Layers are indexed as the reference
indexes `get_all_encoder_layers()`: 0 is the first Transformer block, -1 the last (the
embeddings' output is not among them).

Output: JSON lines, one per input line, in input order:
`{"linex_index": i, "features": [{"token": "[CLS]", "layers": [{"index": -1, "values": [...]},
...]}, ...]}`, values rounded to 6 decimals; the key order and separators of the reference.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from model.bert import BertModel

PAIR = re.compile(r"^(.*) \|\|\| (.*)$")


@dataclass(frozen=True)
class FeatureExample:
    """One input line."""

    index: int
    """Line number from 0 (the reference's `unique_id`, written as `linex_index`)."""
    text_a: str
    text_b: str | None


def read_examples(path: str) -> list[FeatureExample]:
    """Every line of `path` as an example (empty lines too: the reference keeps them)."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for index, line in enumerate(f):
            line = line.strip()
            m = PAIR.match(line)
            examples.append(FeatureExample(index, line, None) if m is None
                            else FeatureExample(index, m[1], m[2]))
    return examples


def parse_layers(text: str, num_layers: int) -> tuple[int, ...]:
    """`-1,-2,-3,-4` -> (-1, -2, -3, -4), each checked against the model's `num_layers`."""
    try:
        layers = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"--layers: not a comma-separated list of integers: {text!r}") from None
    for layer in layers:
        if not -num_layers <= layer < num_layers:
            raise ValueError(f"--layers: {layer} is outside the model's {num_layers} layers "
                             f"({-num_layers}..{num_layers - 1})")
    return layers


@dataclass(frozen=True)
class Encoded:
    """An example's word pieces."""

    tokens: list[str]
    input_ids: np.ndarray
    token_type_ids: np.ndarray


def encode_examples(tokenizer, examples: Sequence[FeatureExample],
                    max_seq_length: int) -> list[Encoded]:
    """Word pieces of each example with [CLS]/[SEP], truncated as the reference truncates.
    `tokenizer`: a `tokenizers.Tokenizer` or a transformers fast tokenizer."""
    from finetune.ner.encode import raw_tokenizer

    tok = raw_tokenizer(tokenizer)
    # longest_first drops a token from the longer side at a time: `_truncate_seq_pair`
    tok.enable_truncation(max_length=max_seq_length, strategy="longest_first")
    out = []
    for e in examples:
        enc = tok.encode(e.text_a, e.text_b) if e.text_b is not None else tok.encode(e.text_a)
        out.append(Encoded(list(enc.tokens), np.asarray(enc.ids, np.int64),
                           np.asarray(enc.type_ids, np.int64)))
    return out


@torch.inference_mode()
def layer_states(model: BertModel, encoded: Sequence[Encoded], layers: Sequence[int],
                 batch_size: int = 32) -> Iterator[np.ndarray]:
    """Per example, (len(layers), T, H) float32 activations of the chosen blocks (no dropout).

    Examples of a batch are padded to the longest; the mask keeps padding out of attention."""
    model.eval()
    device = next(model.parameters()).device
    for start in range(0, len(encoded), batch_size):
        chunk = encoded[start:start + batch_size]
        width = max(len(e.input_ids) for e in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)  # (B, T)
        types = torch.zeros_like(ids)
        mask = torch.zeros_like(ids)
        for row, e in enumerate(chunk):
            n = len(e.input_ids)
            ids[row, :n] = torch.from_numpy(e.input_ids)
            types[row, :n] = torch.from_numpy(e.token_type_ids)
            mask[row, :n] = 1
        states = model(ids.to(device), types.to(device), mask.to(device),
                       output_hidden_states=True).layers[1:]  # L x (B, T, H): blocks only
        chosen = torch.stack([states[i] for i in layers], dim=1).float().cpu()  # (B, K, T, H)
        for row, e in enumerate(chunk):
            yield chosen[row, :, :len(e.input_ids)].numpy()


def feature_line(index: int, tokens: Sequence[str], states: np.ndarray,
                 layers: Sequence[int]) -> str:
    """One JSON line of the reference's layout; `states` (len(layers), T, H)."""
    features = [{"token": token,
                 "layers": [{"index": layer, "values": [round(float(x), 6) for x in states[k, t]]}
                            for k, layer in enumerate(layers)]}
                for t, token in enumerate(tokens)]
    return json.dumps({"linex_index": index, "features": features}) + "\n"
