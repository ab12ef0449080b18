"""BERT's WordPiece tokenizer, built on Hugging Face `tokenizers`.

One construction for every stage (vocabulary training, instance creation, GLUE), so that the
tokenizer saved as `tokenizer.json` is the one the shards were made with, and
`transformers.BertTokenizerFast` loading that folder tokenizes identically.

Matches BERT's reference tokenizer (`tokenization.py` in google-research/bert): clean text, CJK
spacing, optional lower-casing and accent stripping, split on whitespace and punctuation, then
greedy longest-match-first WordPiece with `##` continuations; a word longer than 200 characters
is `[UNK]` (the reference's `max_input_chars_per_word`; `BertTokenizerFast` defaults to 100).

Special-token text: `tokenizers` (and so `BertTokenizerFast`, which GLUE uses) matches added
tokens such as "[MASK]" in raw text and turns them into the special token; the reference's basic
tokenizer splits the text into "[", "mask", "]". Corpus-side encoding (instance creation) wants the
reference's behaviour: `load_tokenizer(..., split_special_tokens=True)` and
`encode_like_reference`. The saved `tokenizer.json` keeps the Hugging Face behaviour.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 200


def read_vocab(path: str) -> list[str]:
    """Vocabulary tokens in file order from a `vocab.txt` or a folder holding one."""
    from common import storage

    if is_vocab_folder(path):
        path = storage.join(path.rstrip("/"), "vocab.txt")
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


def is_vocab_folder(path: str) -> bool:
    """A vocabulary folder rather than a vocab.txt: a local folder, or a remote path that ends
    with "/" or does not name a .txt file (`gs://bucket/vocab`)."""
    from common import storage

    if storage.is_remote(path):
        return path.endswith("/") or not path.endswith(".txt")
    return os.path.isdir(path)


def recorded_lower_case(vocab_path: str) -> bool | None:
    """The casing a vocabulary folder records in `tokenizer_config.json` (`do_lower_case`, as
    transformers and train_vocab write it), or None when it records none (a vocab.txt alone).
    For a path to a file named `vocab.txt` that is its folder's config (`--vocab
    cased/vocab.txt` is as cased as `--vocab cased`); a file of another name records none.

    The same rule as `model.hf.vocab_do_lower_case`, which decides the exported tokenizer: shards
    and export must agree.
    """
    from common import storage

    if is_vocab_folder(vocab_path):
        folder = vocab_path.rstrip("/")
    elif vocab_path.rstrip("/").rpartition("/")[2] == "vocab.txt":
        folder = _parent(vocab_path)
    else:
        return None
    config_path = storage.join(folder, "tokenizer_config.json")
    if not storage.exists(config_path):
        return None
    value = storage.read_json(config_path).get("do_lower_case")
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"{config_path}: do_lower_case must be true or false, got {value!r}")
    return value


def _parent(path: str) -> str:
    """The folder holding file `path` (local or remote)."""
    from common import storage

    if storage.is_remote(path):
        return path.rpartition("/")[0]
    return os.path.dirname(path) or "."


def bert_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    return normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                      strip_accents=do_lower_case, lowercase=do_lower_case)


def build_tokenizer(vocab: Sequence[str], do_lower_case: bool = True,
                    split_special_tokens: bool = False) -> Tokenizer:
    """A BERT WordPiece `Tokenizer` over `vocab` (tokens in id order).

    `split_special_tokens=True`: "[MASK]" etc. in the text are plain text (see the module doc);
    the post-processor still adds [CLS]/[SEP] around encoded sequences.
    """
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
    # A runtime switch of the Rust tokenizer, not part of tokenizer.json.
    tokenizer.encode_special_tokens = split_special_tokens
    return tokenizer


def load_tokenizer(vocab_path: str, do_lower_case: bool = True,
                   split_special_tokens: bool = False) -> Tokenizer:
    """The tokenizer for a vocabulary folder or `vocab.txt` (any BERT vocabulary).

    Corpus-side encoding passes `split_special_tokens=True` (see `encode_like_reference`).
    """
    return build_tokenizer(read_vocab(vocab_path), do_lower_case, split_special_tokens)


def splitting_special_tokens(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer` if it already treats special-token text as plain text, else such a copy."""
    if tokenizer.encode_special_tokens:
        return tokenizer
    copy = Tokenizer.from_str(tokenizer.to_str())  # about 60 ms for a 30k vocabulary
    copy.encode_special_tokens = True
    return copy


def encode_like_reference(tokenizer: Tokenizer, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of each text (no [CLS]/[SEP]) exactly as BERT's reference tokenizer gives them.

    `tokenizers` differs from the reference in two corner cases, handled here:
    - literal "[MASK]", "[SEP]", ... in text: the reference splits them into "[", "mask", "]";
      here the tokenizer's `encode_special_tokens` does (load it with
      `split_special_tokens=True`, or a copy is made per call);
    - the reference lower-cases with Python's `str.lower` (final sigma "ς") before it strips
      accents; `tokenizers` lower-cases "Σ" to "σ" everywhere, so lower-casing happens here first.
    """
    tokenizer = splitting_special_tokens(tokenizer)
    if getattr(tokenizer.normalizer, "lowercase", False):
        texts = [text.lower() for text in texts]
    return [e.ids for e in tokenizer.encode_batch(list(texts), add_special_tokens=False)]


def save_tokenizer_folder(vocab: Sequence[str], folder: str, do_lower_case: bool = True) -> None:
    """Write `vocab.txt`, `tokenizer.json` and the configs `transformers` needs to load the folder."""
    from common import storage

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
