"""BERT's own instance generator, run in this process: the peer of reference-mode parity.

The peer is `create_pretraining_data.py` + `tokenization.py` of google-research/bert as the PyPI
package `bert-tensorflow` (1.0.4) ships them (a dev dependency; it pulls in no TensorFlow). They
need TensorFlow only for file reading, logging and flags, so `load()` imports them behind a
stand-in `tensorflow.compat.v1` with exactly those three (`peers.shim`: `gfile.GFile` = `open`
and absl's `logging` and `flags`, what TF1 wraps). Nothing of ours replaces any of the peer's
own logic: it reads and tokenizes itself.
Used by tests/pipelines/shards/test_reference_parity.py and benchmarks/bench_instances.py.
"""
from __future__ import annotations

import random
import types

from peers import shim
from pipelines.shards.instances import InstanceConfig

GENERATOR = shim.Peer("bert.create_pretraining_data", "BERT's reference generator")
available = GENERATOR.available
load = GENERATOR.load
"""`load()`: the peer's `create_pretraining_data` module (its `tokenization` is
`bert.tokenization`)."""


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
