"""BERT's WordPiece tokenizer, built on Hugging Face `tokenizers`.

One construction for every stage (vocabulary training, instance creation, GLUE), so that the
tokenizer saved as `tokenizer.json` is the one the shards were made with, and
`transformers.BertTokenizerFast` loading that folder tokenizes identically.

Matches BERT's reference tokenizer (`tokenization.py` in google-research/bert): clean text, CJK
spacing, optional lower-casing and accent stripping, split on whitespace and punctuation, then
greedy longest-match-first WordPiece with `##` continuations; a word longer than 200 characters
is `[UNK]` (the reference's `max_input_chars_per_word`; `BertTokenizerFast` defaults to 100).
"""
from __future__ import annotations

import os
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 200


def read_vocab(path: str) -> list[str]:
    """Vocabulary tokens in file order from a `vocab.txt` or a folder holding one."""
    from pipelines import storage

    if not storage.is_remote(path) and os.path.isdir(path):
        path = os.path.join(path, "vocab.txt")
    with storage.open_read(path) as f:
        tokens = [line.rstrip("\n").rstrip("\r") for line in f]
    while tokens and tokens[-1] == "":
        tokens.pop()  # a trailing newline is not a token
    if not tokens:
        raise ValueError(f"{path}: empty vocabulary")
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise ValueError(f"{path}: vocabulary lacks special tokens {missing}")
    return tokens


def bert_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                      strip_accents=do_lower_case, lowercase=do_lower_case)


def build_tokenizer(vocab: Sequence[str], do_lower_case: bool = True) -> Tokenizer:
    """A BERT WordPiece `Tokenizer` over `vocab` (tokens in id order)."""
    vocab_map = {token: i for i, token in enumerate(vocab)}
    tokenizer = Tokenizer(models.WordPiece(vocab_map, unk_token=UNK,
                                           max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD))
    tokenizer.normalizer = bert_normalizer(do_lower_case)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{CLS}:0 $A:0 {SEP}:0",
        pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
        special_tokens=[(CLS, vocab_map[CLS]), (SEP, vocab_map[SEP])],
    )
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens([t for t in vocab if t in SPECIAL_TOKENS])
    return tokenizer


def load_tokenizer(vocab_path: str, do_lower_case: bool = True) -> Tokenizer:
    """The tokenizer for a vocabulary folder or `vocab.txt` (any BERT vocabulary)."""
    return build_tokenizer(read_vocab(vocab_path), do_lower_case)


def save_tokenizer_folder(vocab: Sequence[str], folder: str, do_lower_case: bool = True) -> None:
    """Write `vocab.txt`, `tokenizer.json` and the configs `transformers` needs to load the folder."""
    from pipelines import storage

    tokenizer = build_tokenizer(vocab, do_lower_case)
    storage.makedirs(folder)
    storage.atomic_write_text(storage.join(folder, "vocab.txt"), "\n".join(vocab) + "\n")
    storage.atomic_write_text(storage.join(folder, "tokenizer.json"), tokenizer.to_str())
    storage.atomic_write_json(storage.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": do_lower_case,
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
        "model_max_length": 512,
    })
    storage.atomic_write_json(storage.join(folder, "special_tokens_map.json"), {
        "unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS, "mask_token": MASK,
    })
