"""The shared foundation: atomic writes, input expansion, the beam command, the tokenizer."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from pipelines import shard_format, storage
from pipelines.tokenization import load_tokenizer, read_vocab, save_tokenizer_folder


def test_atomic_write_leaves_no_partial_file_on_error(tmp_path):
    target = tmp_path / "out.bin"
    storage.atomic_write_bytes(str(target), b"old")
    with pytest.raises(RuntimeError), storage.atomic_open(str(target)) as f:
        f.write(b"half")
        raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_expand_inputs_file_glob_folder_and_missing(tmp_path):
    for name in ["a.txt", "b.txt", ".hidden", "manifest.json"]:
        (tmp_path / name).write_text("x")
    expected = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    assert storage.expand_inputs(str(tmp_path)) == expected
    assert storage.expand_inputs(str(tmp_path / "*.txt")) == expected
    assert storage.expand_inputs(f"{tmp_path / 'a.txt'},{tmp_path / 'b.txt'}") == expected
    with pytest.raises(FileNotFoundError, match="nope"):
        storage.expand_inputs(str(tmp_path / "nope*"))


def test_config_hash_is_order_independent_and_sensitive():
    assert storage.config_hash({"a": 1, "b": 2}) == storage.config_hash({"b": 2, "a": 1})
    assert storage.config_hash({"a": 1}) != storage.config_hash({"a": 2})


def test_shard_block_roundtrip_and_positions():
    rows = [
        shard_format.Row(np.array([101, 7, 102, 8, 102]), np.array([0, 0, 0, 1, 1]),
                         np.zeros(5, int), np.array([1, 3]), np.array([7, 8]), np.array([1])),
        shard_format.Row(np.array([101, 9, 102, 10, 102, 101, 11, 102, 12, 102]),
                         np.array([0, 0, 0, 1, 1] * 2), np.array([0] * 5 + [1] * 5),
                         np.array([6]), np.array([11]), np.array([0, 1])),
    ]
    decoded = shard_format.decode_block(shard_format.encode_block(rows, vocab_size=30522))
    assert len(decoded) == 2
    for got, want in zip(decoded, rows):
        for field in ("input_ids", "segment_ids", "sequence_ids", "masked_lm_positions",
                      "masked_lm_ids", "next_sentence_labels"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
    assert decoded[0].input_ids.dtype == np.uint16
    assert shard_format.position_ids(rows[1].sequence_ids).tolist() == [0, 1, 2, 3, 4] * 2


def test_tokenizer_matches_bert_tokenizer_fast(minilm_dir, shared_data, tmp_path):
    import transformers

    save_tokenizer_folder(read_vocab(str(minilm_dir)), str(tmp_path))
    ours = load_tokenizer(str(minilm_dir))
    theirs = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    lines = (shared_data / "books" / "austen-emma.txt").read_text().splitlines()[:3000]
    lines.append("Café naïve 東京 " + "y" * 201)
    got = [e.ids for e in ours.encode_batch(lines, add_special_tokens=False)]
    assert got == theirs(lines, add_special_tokens=False)["input_ids"]
    assert ours.encode("y" * 201, add_special_tokens=False).tokens == ["[UNK]"]


def test_split_special_tokens_is_for_corpus_encoding_only(minilm_dir, tmp_path):
    """Literal "[MASK]" in corpus text is "[", "mask", "]" (BERT's reference tokenizer) with
    split_special_tokens=True; the saved folder keeps the Hugging Face behaviour GLUE relies on."""
    import transformers

    save_tokenizer_folder(read_vocab(str(minilm_dir)), str(tmp_path))
    text = "a [MASK] b[SEP] [unused1]"
    theirs = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    hf_tokens = ["a", "[MASK]", "b", "[SEP]", "[", "unused", "##1", "]"]
    assert theirs.tokenize(text) == hf_tokens
    assert load_tokenizer(str(tmp_path)).encode(text, add_special_tokens=False).tokens == hf_tokens
    corpus = load_tokenizer(str(tmp_path), split_special_tokens=True)
    assert corpus.encode(text).tokens == [
        "[CLS]", "a", "[", "mask", "]", "b", "[", "sep", "]", "[", "unused", "##1", "]", "[SEP]"]
    assert corpus.to_str() == (tmp_path / "tokenizer.json").read_text()  # not saved in the file


def test_word_limit_is_the_references_200_not_transformers_100(minilm_dir, tmp_path):
    """A known, documented difference: transformers 5's BertTokenizer hard-codes a 100-char
    word limit; BERT's reference tokenizer (and ours) uses 200."""
    import transformers

    save_tokenizer_folder(read_vocab(str(minilm_dir)), str(tmp_path))
    ours = load_tokenizer(str(minilm_dir))
    theirs = transformers.BertTokenizerFast.from_pretrained(str(tmp_path))
    word = "x" * 150
    assert len(ours.encode(word, add_special_tokens=False).ids) == 75  # "xx" + 74 x "##xx"
    assert theirs.tokenize(word) == ["[UNK]"]


def test_beam_command_help_lists_job_options():
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "beam"), "--help"],
                         check=False, capture_output=True, text=True)
    assert out.returncode == 0 and "beam run" in out.stdout


def test_beam_command_runs_the_job_file_it_is_given(tmp_path):
    """A user's own job file runs, even when it shares a name with one of ours."""
    from pipelines import cli

    mine = tmp_path / "make_shards.py"
    mine.write_text("def run(argv):\n    print('my job', argv)\n")
    assert cli.load_job(str(mine)).__file__ == str(mine)
    ours = cli.load_job(os.path.join(os.path.dirname(cli.__file__), "make_shards.py"))
    assert ours.__name__ == "pipelines.make_shards"
    beam = os.path.join(os.path.dirname(sys.executable), "beam")
    out = subprocess.run([beam, "run", str(mine), "--x"], check=False, capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout == "my job ['--x']\n"
    missing = subprocess.run([beam, "run", str(tmp_path / "nope.py")], check=False,
                             capture_output=True, text=True)
    assert missing.returncode != 0 and "no job file" in missing.stderr
