"""BERT's own `extract_features.py` (bert-tensorflow==1.0.4), run in this process without
TensorFlow: the peer of `bert-features` (input reading, tokenization, truncation, [CLS]/[SEP]).

As `peers.bert_generator` does for the instance generator, `load()` imports the peer behind a
stand-in `tensorflow.compat.v1` holding only what its import and its reading code touch:
`gfile.GFile`, absl's `logging`, and `flags` bound to a private absl `FlagValues` (the peer
defines flags such as `max_seq_length` that the generator defines too; two definitions on
absl's global FLAGS would clash). `tensorflow.contrib.layers` is an empty stand-in: only the
peer's model code, never called here, uses it. Used by tests/finetune/features/test_features.py.
"""
from __future__ import annotations

import functools
import sys
import types

from peers.bert_generator import PEER, _gfile_open, available

SHIM_MODULES = ("tensorflow", "tensorflow.compat", "tensorflow.compat.v1", "tensorflow.contrib")


def load() -> types.ModuleType:
    """The peer's `extract_features` module (its tokenizer is `bert.tokenization`)."""
    reason = available()
    if reason:
        raise RuntimeError(reason.replace("instance generator", "extract_features") + f" ({PEER})")
    if "bert.extract_features" not in sys.modules:
        import absl.flags
        import absl.logging

        private = absl.flags.FlagValues()
        flags = types.SimpleNamespace(FLAGS=private, **{
            name: functools.partial(getattr(absl.flags, name), flag_values=private)
            for name in ("DEFINE_string", "DEFINE_integer", "DEFINE_bool")})
        v1 = types.ModuleType("tensorflow.compat.v1")
        v1.flags, v1.logging = flags, absl.logging
        v1.gfile = types.SimpleNamespace(GFile=_gfile_open)
        compat = types.ModuleType("tensorflow.compat")
        compat.v1 = v1
        contrib = types.ModuleType("tensorflow.contrib")
        contrib.layers = types.SimpleNamespace()
        tf = types.ModuleType("tensorflow")
        tf.compat, tf.contrib = compat, contrib
        sys.modules.update(zip(SHIM_MODULES, (tf, compat, v1, contrib)))
        try:
            import bert.extract_features  # noqa: F401  (binds the stand-in)
        finally:
            for name in SHIM_MODULES:  # nothing else may see a fake tensorflow
                sys.modules.pop(name, None)
        private.mark_as_parsed()
        absl.flags.FLAGS.mark_as_parsed()  # bert.tokenization reads its flag's default
    return sys.modules["bert.extract_features"]
