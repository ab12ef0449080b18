"""BERT's own SQuAD code, run in this process: the peer of SQuAD windows and answers.

The peer is `run_squad.py` + `tokenization.py` of google-research/bert as the PyPI package
`bert-tensorflow` (1.0.4) ships them (a dev dependency that pulls in no TensorFlow). Its data
functions (`read_squad_examples`, `convert_examples_to_features`, `write_predictions`,
`get_final_text`) need TensorFlow only for file reading, logging and flags, so `load()` imports
the module behind a stand-in `tensorflow.compat.v1` (`peers.shim`) with exactly those:
`gfile.GFile`/`Open` = `open` (UTF-8), absl's `logging`, and absl flags defined in a
`FlagValues` of the peer's own (`run_squad.py` and `create_pretraining_data.py` define some flags under the same names;
`tokenization.py` defines its one flag on absl's global FLAGS, marked parsed here). Its
model and optimizer modules build TensorFlow graphs that these functions never call: empty
stand-ins take their place during the import. Nothing of ours replaces any of the peer's own
logic. Used by tests/test_squad_*.py and benchmarks/bench_squad.py.
"""
from __future__ import annotations

import collections
import json
import tempfile
import types
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from peers import shim

GRAPH_MODULES = ("bert.modeling", "bert.optimization")

RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])


RUN_SQUAD = shim.Peer("bert.run_squad", "BERT's reference run_squad.py", own_flags=True,
                     gfile=("GFile", "Open"), stand_ins=GRAPH_MODULES)
available = RUN_SQUAD.available
load = RUN_SQUAD.load
"""`load()`: the peer's `run_squad` module (its flags parsed at their defaults)."""


def set_flags(peer: types.ModuleType, version_2: bool, null_score_diff_threshold: float = 0.0
              ) -> None:
    """The flags that `read_squad_examples` and `write_predictions` read."""
    peer.FLAGS.version_2_with_negative = version_2
    peer.FLAGS.null_score_diff_threshold = null_score_diff_threshold
    peer.FLAGS.verbose_logging = False


def read_examples(peer: types.ModuleType, path: str, training: bool, version_2: bool) -> list:
    """The peer's SquadExamples of an official JSON file.

    Training reads a copy that keeps each question's first answer: the peer trains on exactly
    one (it refuses dev files with three), as we do."""
    set_flags(peer, version_2)
    if not training:
        return peer.read_squad_examples(path, is_training=False)
    dataset = json.loads(Path(path).read_text(encoding="utf-8"))
    for article in dataset["data"]:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                qa["answers"] = qa["answers"][:1]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "train.json"
        copy.write_text(json.dumps(dataset), encoding="utf-8")
        return peer.read_squad_examples(str(copy), is_training=True)


def convert(peer: types.ModuleType, examples: list, vocab_file: str, do_lower_case: bool,
            max_seq_length: int, doc_stride: int, max_query_length: int,
            training: bool) -> list:
    """The peer's InputFeatures (one per window) of its examples."""
    tokenizer = peer.tokenization.FullTokenizer(vocab_file, do_lower_case=do_lower_case)
    features: list = []
    peer.convert_examples_to_features(examples, tokenizer, max_seq_length, doc_stride,
                                      max_query_length, training, features.append)
    return features


def predictions(peer: types.ModuleType, examples: list, features: list,
                start_logits: Sequence[np.ndarray], end_logits: Sequence[np.ndarray],
                do_lower_case: bool, version_2: bool, n_best_size: int = 20,
                max_answer_length: int = 30, null_score_diff_threshold: float = 0.0
                ) -> tuple[dict[str, str], dict[str, float]]:
    """The peer's write_predictions on logits per feature: ({qid: text}, {qid: null odds})."""
    set_flags(peer, version_2, null_score_diff_threshold)
    results = [RawResult(f.unique_id, [float(x) for x in s], [float(x) for x in e])
               for f, s, e in zip(features, start_logits, end_logits)]
    with tempfile.TemporaryDirectory() as tmp:
        files = [str(Path(tmp) / name) for name in ("pred.json", "nbest.json", "odds.json")]
        peer.write_predictions(examples, features, results, n_best_size, max_answer_length,
                               do_lower_case, *files)
        preds = json.loads(Path(files[0]).read_text(encoding="utf-8"))
        odds = json.loads(Path(files[2]).read_text(encoding="utf-8")) if version_2 else {}
    return preds, odds
