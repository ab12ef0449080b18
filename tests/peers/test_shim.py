"""`peers.shim`: google-research/bert modules imported behind a stand-in tensorflow that no
other code sees afterwards, and the reason a peer cannot run."""
from __future__ import annotations

import sys

import pytest

from peers import bert_features, bert_generator, bert_squad, shim

NEEDS_PEER = pytest.mark.skipif(bert_squad.available() is not None,
                                reason=str(bert_squad.available()))


def test_unavailable_names_the_missing_peer_file():
    assert shim.unavailable("bert.no_such_module", "a peer of nothing") == (
        "needs a peer of nothing: pip install --no-deps bert-tensorflow==1.0.4")
    assert shim.Peer("bert.no_such_module", "nothing").available() == (
        "needs nothing: pip install --no-deps bert-tensorflow==1.0.4")
    with pytest.raises(RuntimeError, match="^needs nothing: pip install"):
        shim.Peer("bert.no_such_module", "nothing").load()


def test_gfile_open_reads_lines_as_tensorflow_does(tmp_path):
    path = tmp_path / "a.txt"
    path.write_bytes("é\r\nb\n".encode())
    with shim.gfile_open(str(path)) as f:
        assert f.readlines() == ["é\r\n", "b\n"]
    with shim.gfile_open(str(path), "rb") as f:
        assert f.read() == "é\r\nb\n".encode()


def test_private_flags_do_not_touch_absl_global_flags():
    import absl.flags

    flags = shim.private_flags()
    flags.DEFINE_integer("shim_test_only_flag", 3, "a flag of a FlagValues of its own")
    assert "shim_test_only_flag" in flags.FLAGS
    assert "shim_test_only_flag" not in absl.flags.FLAGS


@NEEDS_PEER
def test_the_three_peers_load_with_no_stand_in_left():
    squad, generator, features = bert_squad.load(), bert_generator.load(), bert_features.load()
    assert (squad.__name__, generator.__name__, features.__name__) == (
        "bert.run_squad", "bert.create_pretraining_data", "bert.extract_features")
    assert [name for name in sys.modules if name.split(".")[0] == "tensorflow"] == []
    assert squad.FLAGS.is_parsed() and features.FLAGS.is_parsed()
    assert squad.FLAGS.max_seq_length == 384 and features.FLAGS.max_seq_length == 128
    assert bert_squad.load() is squad
    assert (bert_squad.RUN_SQUAD.module, bert_generator.GENERATOR.module) == (
        "bert.run_squad", "bert.create_pretraining_data")
