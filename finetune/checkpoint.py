"""The pre-trained checkpoint a fine-tuning run starts from: the encoder, its tokenizer, and
the checks that they fit each other and the recipe before any training.

`--model` is our exported folder, a `model.hf.save_checkpoint` folder or any Hugging Face BERT
folder. The tokenizer comes without padding or truncation: each family lays out its own
sequences (GLUE truncates pairs, SQuAD slides windows over passages).
"""
from __future__ import annotations

import json
import logging
import os
import re

from model.bert import BertModel

log = logging.getLogger(__name__)


def load_encoder(model_dir: str) -> BertModel:
    """Our `BertModel` with the weights of `model_dir`: a folder `model.hf.save_checkpoint` wrote
    (`bert_config.json`), or our HF export / any Hugging Face BERT folder (`config.json`).

    Errors name the folder: a config that is not JSON, weights that are not readable, and
    weights whose shapes differ from the config's (a config.json of another model size).
    """
    from safetensors import SafetensorError

    from model import hf

    if os.path.isfile(os.path.join(model_dir, hf.CHECKPOINT_CONFIG)):
        config_name, load = hf.CHECKPOINT_CONFIG, hf.load_checkpoint
    elif os.path.isfile(os.path.join(model_dir, "config.json")):
        config_name, load = "config.json", hf.load_hf_encoder
    else:
        raise FileNotFoundError(f"--model {model_dir}: no {hf.CHECKPOINT_CONFIG} or config.json")
    try:
        model = load(model_dir)
    except json.JSONDecodeError as e:
        raise ValueError(f"--model {model_dir}: {config_name} is not JSON ({e})") from None
    except (SafetensorError, RuntimeError) as e:  # torch.load_state_dict / unreadable weights
        raise ValueError(f"--model {model_dir}: {weights_error(e, config_name)}") from e
    except (ValueError, TypeError) as e:  # the config's values; model.hf names the file itself
        if model_dir in str(e):
            raise
        raise ValueError(f"--model {model_dir}: {config_name}: {e}") from e
    return model.bert if hasattr(model, "kind") else model  # a head's encoder, or the encoder


_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape "
                            r"torch\.Size\((\[.*?\])\) from checkpoint, the shape in current "
                            r"model is torch\.Size\((\[.*?\])\)")


def weights_error(error: Exception, config_name: str, shown: int = 3) -> str:
    """One line for a checkpoint that does not load: its first shape mismatches, if any."""
    mismatches = _SIZE_MISMATCH.findall(str(error))
    if not mismatches:
        return f"cannot load the weights: {str(error).strip().splitlines()[0]}"
    listed = "; ".join(f"{name} is {saved} in the weights but {expected} by {config_name}"
                       for name, saved, expected in mismatches[:shown])
    more = f" (and {len(mismatches) - shown} more)" if len(mismatches) > shown else ""
    return f"the weights do not match {config_name}: {listed}{more}"


def load_tokenizer(model_dir: str):
    """The checkpoint folder's tokenizer (`tokenizers.Tokenizer`: WordPiece, or byte-level BPE
    where the folder has merges.txt), no padding and no truncation.

    `tokenizer.json` when the folder has one (our export writes it; so do HF BERT folders), else
    `vocab.txt` (and merges.txt) through `common.tokenization.load_tokenizer` with the folder's
    lower-casing.
    """
    from tokenizers import Tokenizer

    from common.tokenization import load_tokenizer as load_wordpiece

    tokenizer_json = os.path.join(model_dir, "tokenizer.json")
    vocab_txt = os.path.join(model_dir, "vocab.txt")
    if os.path.isfile(tokenizer_json):
        try:
            tokenizer = Tokenizer.from_file(tokenizer_json)
        except Exception as e:  # noqa: BLE001 - `tokenizers` raises a bare Exception here
            raise ValueError(f"{tokenizer_json}: not a tokenizers file ({e})") from None
    elif os.path.isfile(vocab_txt):
        check_unique_tokens(vocab_txt)
        tokenizer = load_wordpiece(model_dir, do_lower_case=_do_lower_case(model_dir))
    else:
        raise FileNotFoundError(f"{model_dir}: no tokenizer.json or vocab.txt")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def check_unique_tokens(vocab_path: str) -> None:
    """Raise naming both lines when a `vocab.txt` lists a token twice.

    Ids are line numbers, so a repeated token leaves an id no text maps to and moves the
    token's id to its last line: a vocabulary that silently does not match the embeddings.
    """
    from common.tokenization import read_vocab

    first_line: dict[str, int] = {}
    for line, token in enumerate(read_vocab(vocab_path), start=1):
        if token in first_line:
            raise ValueError(f"{vocab_path}:{line}: token {token!r} repeats line "
                             f"{first_line[token]}; every vocabulary line must be distinct")
        first_line[token] = line


def _do_lower_case(model_dir: str) -> bool:
    path = os.path.join(model_dir, "tokenizer_config.json")
    if not os.path.isfile(path):
        return True
    with open(path, encoding="utf-8") as f:
        return bool(json.load(f).get("do_lower_case", True))


def check_model_fits(encoder: BertModel, tokenizer, max_seq_length: int, model_dir: str,
                     tokenizer_dir: str) -> None:
    """Raise before any training when the encoder cannot embed what the tokenizer and the
    recipe give it; warn when the tokenizer uses only part of the model's vocabulary.

    A token id >= vocab_size or a position >= max_position_embeddings would otherwise stop
    training with an IndexError deep in torch; a smaller vocabulary runs but maps text to
    rows the model learnt for other tokens (most likely the wrong vocab.txt).
    """
    config = encoder.config
    ids = tokenizer.get_vocab(with_added_tokens=True).values()
    num_ids = max(ids) + 1 if ids else 0  # not the token count: ids can have gaps
    if num_ids > config.vocab_size:
        raise ValueError(
            f"tokenizer of {tokenizer_dir} gives token ids up to {num_ids - 1} ({num_ids} ids) "
            f"but the model {model_dir} has vocab_size {config.vocab_size}: use the model's "
            "own vocabulary (--vocab)")
    if num_ids < config.vocab_size:
        log.warning("tokenizer of %s has %d token ids but the model %s has vocab_size %d: "
                    "check that it is the vocabulary the model was trained with",
                    tokenizer_dir, num_ids, model_dir, config.vocab_size)
    if max_seq_length > config.max_position_embeddings:
        raise ValueError(f"--max_seq_length {max_seq_length} exceeds the model's "
                         f"max_position_embeddings {config.max_position_embeddings} ({model_dir})")
