"""BERT's own SQuAD code, run in this process: the peer of SQuAD windows and answers.

The peer is `run_squad.py` + `tokenization.py` of google-research/bert as the PyPI package
`bert-tensorflow` (1.0.4) ships them (a dev dependency that pulls in no TensorFlow). Its data
functions (`read_squad_examples`, `convert_examples_to_features`, `write_predictions`,
`get_final_text`) need TensorFlow only for file reading, logging and flags, so `load()` imports
the module behind a stand-in `tensorflow.compat.v1` with exactly those: `gfile.GFile`/`Open` =
`open` (UTF-8), absl's `logging`, and absl flags defined in a `FlagValues` of the peer's own
(`run_squad.py` and `create_pretraining_data.py` define some flags under the same names;
`tokenization.py` defines its one flag on absl's global FLAGS, marked parsed here). Its
model and optimizer modules build TensorFlow graphs that these functions never call: empty
stand-ins take their place during the import. Nothing of ours replaces any of the peer's own
logic. Used by tests/test_squad_*.py and benchmarks/bench_squad.py.
"""
from __future__ import annotations

import collections
import functools
import importlib.util
import json
import sys
import tempfile
import types
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PEER = "bert-tensorflow==1.0.4"
SHIM_MODULES = ("tensorflow", "tensorflow.compat", "tensorflow.compat.v1")
GRAPH_MODULES = ("bert.modeling", "bert.optimization")

RawResult = collections.namedtuple("RawResult", ["unique_id", "start_logits", "end_logits"])


def available() -> str | None:
    """None if the peer can run here, else why not (for a skip or a benchmark note)."""
    spec = importlib.util.find_spec("bert")
    folders = (spec and spec.submodule_search_locations) or []
    if not any((Path(p) / "run_squad.py").is_file() for p in folders):
        return f"needs BERT's reference run_squad.py: pip install --no-deps {PEER}"
    if "bert.run_squad" not in sys.modules and importlib.util.find_spec("tensorflow"):
        return "a real tensorflow is installed; the peer runs here without it"
    return None


def _gfile_open(name: str, mode: str = "r"):
    if "b" in mode:
        return open(name, mode)
    return open(name, mode, encoding="utf-8", newline="\n")


def _flags_module():
    """absl flags bound to a FlagValues of the peer's own."""
    import absl.flags

    values = absl.flags.FlagValues()
    flags = types.SimpleNamespace(FLAGS=values)
    for kind in ("string", "bool", "integer", "float"):
        name = f"DEFINE_{kind}"
        setattr(flags, name, functools.partial(getattr(absl.flags, name), flag_values=values))
    return flags


def load() -> types.ModuleType:
    """The peer's `run_squad` module (its flags parsed at their defaults)."""
    reason = available()
    if reason:
        raise RuntimeError(reason)
    if "bert.run_squad" not in sys.modules:
        import absl.logging

        v1 = types.ModuleType("tensorflow.compat.v1")
        v1.flags, v1.logging = _flags_module(), absl.logging
        v1.gfile = types.SimpleNamespace(GFile=_gfile_open, Open=_gfile_open)
        compat = types.ModuleType("tensorflow.compat")
        compat.v1 = v1
        tf = types.ModuleType("tensorflow")
        tf.compat = compat
        stand_ins = {name: types.ModuleType(name) for name in GRAPH_MODULES
                     if name not in sys.modules}
        sys.modules.update(zip(SHIM_MODULES, (tf, compat, v1)))
        sys.modules.update(stand_ins)
        try:
            import bert.run_squad  # noqa: F401  (binds the stand-ins)
        finally:  # nothing else may see a fake tensorflow or the empty graph modules
            for name in (*SHIM_MODULES, *stand_ins):
                sys.modules.pop(name, None)
        v1.flags.FLAGS.mark_as_parsed()
        import absl.flags

        if not absl.flags.FLAGS.is_parsed():  # tokenization.py defines one flag there
            absl.flags.FLAGS.mark_as_parsed()
    return sys.modules["bert.run_squad"]


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
