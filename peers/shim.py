"""Importing a module of google-research/bert (`bert-tensorflow==1.0.4`) without TensorFlow.

The peers' code needs TensorFlow only for file reading, logging and flags, so `import_peer`
imports it behind a stand-in `tensorflow.compat.v1` with exactly those: `gfile` entries that
are `open` (text as UTF-8, lines split on "\\n" only, as TensorFlow's GFile), absl's `logging`,
and absl's `flags`, or absl flags bound to a `FlagValues` of the peer's own where two peers
define flags under the same names (`max_seq_length`: two definitions on absl's global FLAGS
would clash). Modules the import touches and the peer's data functions never call (model
graphs, `tensorflow.contrib`) are empty stand-ins. No stand-in stays in `sys.modules` after the
import: nothing else may see a fake tensorflow. Used by peers/bert_generator.py,
peers/bert_features.py and peers/bert_squad.py.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

PEER = "bert-tensorflow==1.0.4"
SHIM_MODULES = ("tensorflow", "tensorflow.compat", "tensorflow.compat.v1")
FLAG_KINDS = ("string", "bool", "integer", "float")


def unavailable(module: str, what: str) -> str | None:
    """None if the peer `module` ("bert.run_squad") can run here, else why not (for a skip or
    a benchmark note); `what` names the peer in that reason."""
    spec = importlib.util.find_spec("bert")
    folders = (spec and spec.submodule_search_locations) or []
    file = module.rpartition(".")[2] + ".py"
    if not any((Path(p) / file).is_file() for p in folders):
        return f"needs {what}: pip install --no-deps {PEER}"
    if module not in sys.modules and importlib.util.find_spec("tensorflow") is not None:
        return "a real tensorflow is installed; the peer runs here without it"
    return None


def gfile_open(name: str, mode: str = "r"):
    """TensorFlow's `GFile`/`Open` as the peers use it: binary as is, text as UTF-8 lines."""
    if "b" in mode:
        return open(name, mode)
    return open(name, mode, encoding="utf-8", newline="\n")


def private_flags() -> types.SimpleNamespace:
    """absl flags bound to a FlagValues of the peer's own: `FLAGS` and `DEFINE_<kind>`."""
    import absl.flags

    values = absl.flags.FlagValues()
    flags = types.SimpleNamespace(FLAGS=values)
    for kind in FLAG_KINDS:
        name = f"DEFINE_{kind}"
        setattr(flags, name, functools.partial(getattr(absl.flags, name), flag_values=values))
    return flags


def import_peer(module: str, *, own_flags: bool = False, gfile: Sequence[str] = ("GFile",),
                stand_ins: Sequence[str] = ()) -> types.ModuleType:
    """`module` (e.g. "bert.run_squad"), imported once behind the stand-in tensorflow, its
    flags parsed at their defaults. `own_flags`: its flags in a FlagValues of its own (else
    absl's global FLAGS); `gfile`: the `tf.gfile` names it calls; `stand_ins`: empty modules
    in place of ones it imports and never uses (one already imported is left as it is)."""
    if module in sys.modules:
        return sys.modules[module]
    import absl.flags
    import absl.logging

    v1 = types.ModuleType("tensorflow.compat.v1")
    v1.flags = private_flags() if own_flags else absl.flags
    v1.logging = absl.logging
    v1.gfile = types.SimpleNamespace(**dict.fromkeys(gfile, gfile_open))
    compat = types.ModuleType("tensorflow.compat")
    compat.v1 = v1
    tf = types.ModuleType("tensorflow")
    tf.compat = compat
    shims = dict(zip(SHIM_MODULES, (tf, compat, v1)))
    shims.update({name: types.ModuleType(name) for name in stand_ins if name not in sys.modules})
    for name, stand_in in shims.items():  # `tf.contrib` as well as `tensorflow.contrib`
        parent, _, child = name.rpartition(".")
        if parent in shims:
            setattr(shims[parent], child, stand_in)
    sys.modules.update(shims)
    try:
        importlib.import_module(module)
    finally:
        for name in shims:
            sys.modules.pop(name, None)
    v1.flags.FLAGS.mark_as_parsed()  # the peer reads its flag defaults
    absl.flags.FLAGS.mark_as_parsed()  # bert.tokenization defines its one flag there
    return sys.modules[module]


@dataclass(frozen=True)
class Peer:
    """One module of the bert package as a peer: whether it runs here, and the module."""
    module: str
    """e.g. "bert.run_squad"."""
    what: str
    """Names the peer in the reason it cannot run."""
    own_flags: bool = False
    gfile: tuple[str, ...] = ("GFile",)
    stand_ins: tuple[str, ...] = ()
    """As `import_peer` takes them."""

    def available(self) -> str | None:
        """None if the peer can run here, else why not (for a skip or a benchmark note)."""
        return unavailable(self.module, self.what)

    def load(self) -> types.ModuleType:
        """The peer's module, imported once (RuntimeError saying why when it cannot run)."""
        reason = self.available()
        if reason:
            raise RuntimeError(reason)
        return import_peer(self.module, own_flags=self.own_flags, gfile=self.gfile,
                           stand_ins=self.stand_ins)
