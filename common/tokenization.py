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

Two kinds of vocabulary (`vocab.kind`), told apart by the folder alone (`vocab_kind`): BERT's
WordPiece (`vocab.txt`) and a byte-level BPE as RoBERTa's and ModernBERT's (`vocab.txt`, one
token per line in id order as for WordPiece, plus `merges.txt`). Both carry BERT's special-token
names ([CLS], [SEP], [MASK], [PAD], [UNK], as ModernBERT's BPE does), so every stage looks ids
up by the same names in either. What "a continuation piece" is (whole-word masking joins it to
the word before) depends on the kind and is decided here only: `is_continuation`.
"""
from __future__ import annotations

import os
from collections.abc import Sequence

from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
)

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
MAX_INPUT_CHARS_PER_WORD = 200
WORDPIECE, BPE = "wordpiece", "bpe"
VOCAB_KINDS = (WORDPIECE, BPE)
"""`vocab.kind`'s choices: BERT's WordPiece, or a byte-level BPE (RoBERTa, ModernBERT)."""
MERGES_NAME = "merges.txt"
"""A BPE vocabulary folder's merge list; its presence makes a folder a BPE one (`vocab_kind`)."""
WORDPIECE_CONTINUATION = "##"
"""WordPiece marks a piece that continues a word (BERT's `##`)."""
BPE_WORD_START = "\u0120"
"""Byte-level BPE's "Ġ", the image of the space byte: a piece that begins with it begins a word,
as the pre-tokenizer cuts words at the space before them (fairseq's RoBERTa whole-word masking
asks the same: does the piece decode to text starting with a space)."""
UNUSED_PREFIX = "[unused"
"""Reserved slots (`[unused0]`, ...): never a piece of text, so never a continuation."""


def check_vocab_kind(kind: str) -> str:
    """`kind` if it is one of `VOCAB_KINDS`, else a one-line error naming the choices."""
    if kind not in VOCAB_KINDS:
        raise ValueError(f"vocabulary kind must be one of {', '.join(VOCAB_KINDS)}, got {kind!r}")
    return kind


def _wordpiece_continues(token: str) -> bool:
    return token.startswith(WORDPIECE_CONTINUATION)


def _bpe_continues(token: str) -> bool:
    # A byte-level piece without the space prefix follows the piece before it with no space
    # between (the rest of a word, or punctuation and digits glued to it: "Ġdon" "'t").
    return not (token.startswith((BPE_WORD_START, UNUSED_PREFIX)) or token in SPECIAL_TOKENS)


CONTINUES_WORD = {WORDPIECE: _wordpiece_continues, BPE: _bpe_continues}
"""Per kind: does a token continue the word before it (whole-word masking's one rule)."""


def is_continuation(token: str, kind: str = WORDPIECE) -> bool:
    """Whether whole-word masking joins `token` to the piece before it, for a vocabulary of
    `kind` (make_shards' instances and the loader's dynamic re-masking both ask this)."""
    return CONTINUES_WORD[check_vocab_kind(kind)](token)


def continuation_flags(tokens: Sequence[str], kind: str = WORDPIECE) -> list[bool]:
    """`is_continuation` of every token, in id order."""
    continues = CONTINUES_WORD[check_vocab_kind(kind)]
    return [continues(token) for token in tokens]


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


def _vocab_folder(vocab_path: str) -> str | None:
    """The folder of a vocabulary path: the folder itself, the folder of a file named
    `vocab.txt`, or None for a file of another name (a vocabulary file alone)."""
    if is_vocab_folder(vocab_path):
        return vocab_path.rstrip("/")
    if vocab_path.rstrip("/").rpartition("/")[2] == "vocab.txt":
        return _parent(vocab_path)
    return None


def vocab_kind(vocab_path: str) -> str:
    """`BPE` when the vocabulary's folder holds `merges.txt` (train_vocab `--kind bpe` and our
    export write it), else `WORDPIECE` (every BERT folder, a bare `vocab.txt`)."""
    from common import storage

    folder = _vocab_folder(vocab_path)
    if folder is not None and storage.exists(storage.join(folder, MERGES_NAME)):
        return BPE
    return WORDPIECE


def read_merges(vocab_path: str) -> list[tuple[str, str]] | None:
    """A BPE vocabulary's merges in rank order (`merges.txt`, the `#version` line skipped), or
    None for a WordPiece one. Byte-level pieces hold no space, so a line splits at its one space."""
    from common import storage

    if vocab_kind(vocab_path) != BPE:
        return None
    path = storage.join(_vocab_folder(vocab_path), MERGES_NAME)
    with storage.open_read(path) as f:
        lines = [line.rstrip("\r\n") for line in f]
    merges = []
    for number, line in enumerate(lines, start=1):
        if not line or line.startswith("#version"):
            continue
        pair = line.split(" ")
        if len(pair) != 2:
            raise ValueError(f"{path}: line {number} is not two pieces separated by a space: "
                             f"{line[:80]!r}")
        merges.append((pair[0], pair[1]))
    return merges


def merges_sha256(vocab_path: str) -> str | None:
    """sha256 of a BPE vocabulary's merges (one `a b` line each, in rank order: the `#version`
    line and line endings aside), or None for a WordPiece one. A BPE vocabulary is its tokens
    and its merges: one `vocab.txt` with other merges splits the same text into other ids, so
    the shards' manifest and the checkpoint-vocabulary stage record this beside vocab.txt's."""
    import hashlib

    merges = read_merges(vocab_path)
    if merges is None:
        return None
    return hashlib.sha256("".join(f"{a} {b}\n" for a, b in merges).encode("utf-8")).hexdigest()


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


def bpe_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    """NFC (one byte sequence per character, however the text composed it), then lower-casing
    when asked; no accent stripping, no whitespace cleaning: the bytes are the text."""
    steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if do_lower_case else [])
    return normalizers.Sequence(steps)


def bpe_pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """GPT-2's byte-level split. `add_prefix_space`: every text begins with a space, so a text's
    first word is `Ġ`-prefixed like every other (each corpus sentence is encoded alone, and in
    running text a space precedes it); its pieces are then the same wherever the word stands."""
    return pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)


def build_bpe_tokenizer(vocab: Sequence[str], merges: Sequence[tuple[str, str]],
                        do_lower_case: bool = True,
                        split_special_tokens: bool = False) -> Tokenizer:
    """A byte-level BPE `Tokenizer` over `vocab` (tokens in id order) and `merges` (in rank
    order), with BERT's [CLS]/[SEP] template, so that instances look as with WordPiece."""
    vocab_map = {token: i for i, token in enumerate(vocab)}
    # No unk_token: the 256 byte symbols are in the vocabulary, every text has pieces.
    tokenizer = Tokenizer(models.BPE(vocab_map, list(merges)))
    tokenizer.normalizer = bpe_normalizer(do_lower_case)
    tokenizer.pre_tokenizer = bpe_pre_tokenizer()
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=True),  # offsets without the space (SQuAD, NER)
        processors.TemplateProcessing(
            single=f"{CLS}:0 $A:0 {SEP}:0",
            pair=f"{CLS}:0 $A:0 {SEP}:0 $B:1 {SEP}:1",
            special_tokens=[(CLS, vocab_map[CLS]), (SEP, vocab_map[SEP])]),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    # [MASK] takes the space before it, as RoBERTa's and ModernBERT's mask token: "a [MASK]." is
    # "Ġa" [MASK] "." (the masked word's own space prefix is in what the model predicts).
    tokenizer.add_special_tokens([AddedToken(t, special=True, lstrip=t == MASK)
                                  for t in vocab if t in SPECIAL_TOKENS])
    tokenizer.encode_special_tokens = split_special_tokens
    return tokenizer


def load_tokenizer(vocab_path: str, do_lower_case: bool = True,
                   split_special_tokens: bool = False) -> Tokenizer:
    """The tokenizer for a vocabulary folder or `vocab.txt` (any BERT vocabulary, or a BPE
    folder: `vocab_kind`).

    Corpus-side encoding passes `split_special_tokens=True` (see `encode_like_reference`).
    """
    merges = read_merges(vocab_path)
    if merges is not None:
        return build_bpe_tokenizer(read_vocab(vocab_path), merges, do_lower_case,
                                   split_special_tokens)
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


def save_tokenizer_folder(vocab: Sequence[str], folder: str, do_lower_case: bool = True,
                          merges: Sequence[tuple[str, str]] | None = None) -> None:
    """Write `vocab.txt`, `tokenizer.json` and the configs `transformers` needs to load the folder;
    with `merges`, a byte-level BPE folder (`save_bpe_folder`)."""
    if merges is not None:
        save_bpe_folder(vocab, merges, folder, do_lower_case)
        return
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


def save_bpe_folder(vocab: Sequence[str], merges: Sequence[tuple[str, str]], folder: str,
                    do_lower_case: bool = True) -> None:
    """A byte-level BPE folder: `vocab.txt` (ids are line numbers, as every stage reads them),
    `merges.txt`, and `tokenizer.json` with the configs that `transformers.AutoTokenizer` loads
    (as `PreTrainedTokenizerFast`: the `tokenizer.json` decides every id). `merges.txt` goes
    before `vocab.txt`, so a folder with a `vocab.txt` is never a BPE one without its merges."""
    from common import storage

    tokenizer = build_bpe_tokenizer(vocab, merges, do_lower_case)
    storage.makedirs(folder)
    storage.atomic_write_text(storage.join(folder, MERGES_NAME),
                              "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    storage.atomic_write_text(storage.join(folder, "vocab.txt"), "\n".join(vocab) + "\n")
    storage.atomic_write_text(storage.join(folder, "tokenizer.json"), tokenizer.to_str())
    specials = {"unk_token": UNK, "sep_token": SEP, "pad_token": PAD, "cls_token": CLS,
                "mask_token": MASK}
    storage.atomic_write_json(storage.join(folder, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "do_lower_case": do_lower_case,  # read back by recorded_lower_case (shards, export)
        **specials,
        "model_max_length": 512,
    })
    storage.atomic_write_json(storage.join(folder, "special_tokens_map.json"), specials)
