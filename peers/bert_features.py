"""BERT's own `extract_features.py` (bert-tensorflow==1.0.4), run in this process without
TensorFlow: the peer of `bert-features` (input reading, tokenization, truncation, [CLS]/[SEP]).

As `peers.bert_generator` does for the instance generator, `load()` imports the peer behind a
stand-in `tensorflow.compat.v1` (`peers.shim`) holding only what its import and its reading
code touch: `gfile.GFile`, absl's `logging`, and `flags` bound to a private absl `FlagValues`
(the peer defines flags such as `max_seq_length` that the generator defines too; two definitions on
absl's global FLAGS would clash). `tensorflow.contrib.layers` is an empty stand-in: only the
peer's model code, never called here, uses it. Used by tests/finetune/features/test_features.py.
"""
from __future__ import annotations

import types

from peers import shim
from peers.bert_generator import available
from peers.shim import PEER


def load() -> types.ModuleType:
    """The peer's `extract_features` module (its tokenizer is `bert.tokenization`)."""
    reason = available()
    if reason:
        raise RuntimeError(reason.replace("instance generator", "extract_features") + f" ({PEER})")
    return shim.import_peer("bert.extract_features", own_flags=True,
                            stand_ins=("tensorflow.contrib", "tensorflow.contrib.layers"))
