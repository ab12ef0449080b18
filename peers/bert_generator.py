"""BERT's own instance generator, run in this process: the peer of reference-mode parity.

The peer is `create_pretraining_data.py` + `tokenization.py` of google-research/bert as the PyPI
package `bert-tensorflow` (1.0.4) ships them (a dev dependency; it pulls in no TensorFlow). They
need TensorFlow only for file reading, logging and flags, so `load()` imports them behind a
stand-in `tensorflow.compat.v1` with exactly those three: `gfile.GFile` = `open` (text, UTF-8,
lines split on "\\n" only, as TensorFlow's GFile) and absl's `logging` and `flags` (what TF1
wraps). Nothing of ours replaces any of the peer's own logic: it reads and tokenizes itself.
Used by tests/pipelines/shards/test_reference_parity.py and benchmarks/bench_instances.py.
"""
from __future__ import annotations

import importlib.util
import random
import sys
import types
from pathlib import Path

from pipelines.shards.instances import InstanceConfig

PEER = "bert-tensorflow==1.0.4"
SHIM_MODULES = ("tensorflow", "tensorflow.compat", "tensorflow.compat.v1")


def available() -> str | None:
    """None if the peer can run here, else why not (for a skip or a benchmark note)."""
    spec = importlib.util.find_spec("bert")
    folders = (spec and spec.submodule_search_locations) or []
    if not any((Path(p) / "create_pretraining_data.py").is_file() for p in folders):
        return f"needs BERT's reference generator: pip install --no-deps {PEER}"
    if "bert.create_pretraining_data" not in sys.modules and \
            importlib.util.find_spec("tensorflow") is not None:
        return "a real tensorflow is installed; the peer runs here without it"
    return None


def _gfile_open(name: str, mode: str = "r"):
    if "b" in mode:
        return open(name, mode)
    return open(name, mode, encoding="utf-8", newline="\n")


def load() -> types.ModuleType:
    """The peer's `create_pretraining_data` module (its `tokenization` is `bert.tokenization`)."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    if "bert.create_pretraining_data" not in sys.modules:
        import absl.flags
        import absl.logging

        v1 = types.ModuleType("tensorflow.compat.v1")
        v1.flags, v1.logging = absl.flags, absl.logging
        v1.gfile = types.SimpleNamespace(GFile=_gfile_open)
        compat = types.ModuleType("tensorflow.compat")
        compat.v1 = v1
        tf = types.ModuleType("tensorflow")
        tf.compat = compat
        sys.modules.update(zip(SHIM_MODULES, (tf, compat, v1)))
        try:
            import bert.create_pretraining_data  # noqa: F401  (binds the stand-in)
        finally:
            for name in SHIM_MODULES:  # nothing else may see a fake tensorflow
                sys.modules.pop(name, None)
        absl.flags.FLAGS.mark_as_parsed()  # the peer reads its flag defaults
    return sys.modules["bert.create_pretraining_data"]


def instances_from_documents(peer: types.ModuleType, docs: list[list[list[str]]],
                             vocab_words: list[str], cfg: InstanceConfig) -> list:
    """The peer's create_training_instances after reading (documents of token-string segments):
    shuffle, walk every document in every pass with its own create_instances_from_document,
    shuffle."""
    rng = random.Random(cfg.random_seed)
    docs = list(docs)
    rng.shuffle(docs)
    out = []
    for _ in range(cfg.dupe_factor):
        for d in range(len(docs)):
            out.extend(peer.create_instances_from_document(
                docs, d, cfg.max_seq_length, cfg.short_seq_prob, cfg.masked_lm_prob,
                cfg.max_predictions_per_seq, vocab_words, rng))
    rng.shuffle(out)
    return out
