"""The shared foundation: atomic writes, input expansion, the beam command, the tokenizer."""
from __future__ import annotations

import collections
import functools
import json
import logging
import os
import subprocess
import sys

import numpy as np
import pytest

from common import shard_format, storage
from common.tokenization import load_tokenizer, read_vocab, save_tokenizer_folder
from pipelines import jobs


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


def test_expand_inputs_walks_subfolders_in_sorted_order_skipping_side_outputs(tmp_path):
    """A folder is every file under it (books/fiction/..., books/poetry/...), never our jobs'
    dead letters, duplicates or manifests, hidden entries or Beam's leftover temp folders."""
    books = tmp_path / "books"
    inputs = ["crlf.txt", "fiction/caesar.txt", "poetry/blake.txt", "poetry/old/x.txt"]
    skipped = [".git/HEAD", "poetry/.draft.txt", "dead_letter/dead_letter-00000-of-00001.jsonl",
               "duplicates/duplicates-00000-of-00001.jsonl", "poetry/manifest.json",
               "manifest.json", "beam-temp-make_shards-1f2e/part"]
    for name in inputs + skipped:
        (books / name).parent.mkdir(parents=True, exist_ok=True)
        (books / name).write_text("x")
    (books / "poetry" / "again").symlink_to(books)  # a loop: each real folder read once
    linked = tmp_path / "linked"
    (linked / "drama").mkdir(parents=True)
    (linked / "drama" / "hamlet.txt").write_text("x")
    (books / "linked").symlink_to(linked)  # a linked folder of books is read like any other
    inputs.insert(2, "linked/drama/hamlet.txt")
    expected = [str(books / name) for name in inputs]
    assert storage.expand_inputs(str(books)) == expected
    assert storage.expand_inputs(str(books) + "/") == expected
    # A glob is what it says: `*` stays in one folder.
    assert storage.expand_inputs(str(books / "*")) == [str(books / "crlf.txt")]


_OBJECTS: dict[str, bytes] = {}
"""Objects by full name, as an object store (gs://, s3://) holds them: no folders."""
_CALLS: collections.Counter[str] = collections.Counter()
"""Requests made to the object store: "list" (one listing by prefix) or "lookup" (one object's
existence or metadata; on GCS each is a round trip)."""


@functools.cache
def _object_store_filesystem():
    """A Beam filesystem for the `objtest://` scheme over `_OBJECTS` (Beam finds every
    FileSystem subclass by its scheme, so it is defined once), listing by prefix as GCS does."""
    from apache_beam.io.filesystem import FileMetadata, FileSystem

    class ObjectStoreFileSystem(FileSystem):
        @classmethod
        def scheme(cls):
            return "objtest"

        def join(self, base, *paths):
            return "/".join([base.rstrip("/"), *paths])

        def split(self, path):
            return tuple(path.rsplit("/", 1))

        def has_dirs(self):
            return False

        def exists(self, path):
            _CALLS["lookup"] += 1
            return path in _OBJECTS

        def size(self, path):
            _CALLS["lookup"] += 1
            return len(_OBJECTS[path])

        def last_updated(self, path):
            return 0.0

        def metadata(self, path):
            _CALLS["lookup"] += 1
            return FileMetadata(path, len(_OBJECTS[path]), 0.0)

        def _list(self, prefix):
            _CALLS["list"] += 1  # a listing carries each object's size
            for name in sorted(_OBJECTS):
                if name.startswith(prefix):
                    yield FileMetadata(name, len(_OBJECTS[name]), 0.0)

        def mkdirs(self, path):
            pass

        def open(self, path, *args, **kwargs):
            import io
            return io.BytesIO(_OBJECTS[path])

        def create(self, path, *args, **kwargs):
            raise NotImplementedError

        copy = rename = delete = checksum = create

    return ObjectStoreFileSystem


def test_expand_inputs_remote_folder_with_or_without_trailing_slash():
    _object_store_filesystem()
    _OBJECTS.clear()
    _OBJECTS.update({f"objtest://bucket/{name}": b"x" for name in (
        "books/crlf.txt", "books/fiction/caesar.txt", "books/dead_letter/d.jsonl",
        "books/.hidden", "books/manifest.json", "books2/other.txt", "single.txt")})
    expected = ["objtest://bucket/books/crlf.txt", "objtest://bucket/books/fiction/caesar.txt"]
    assert storage.expand_inputs("objtest://bucket/books/") == expected
    assert storage.expand_inputs("objtest://bucket/books") == expected  # the README's spelling
    assert storage.expand_inputs("objtest://bucket/single.txt") == ["objtest://bucket/single.txt"]
    assert storage.expand_inputs("objtest://bucket/books/*.txt") == expected[:1]
    with pytest.raises(FileNotFoundError, match="objtest://bucket/book'"):
        storage.expand_inputs("objtest://bucket/book")


def test_a_remote_folder_costs_one_listing_not_a_lookup_per_object(shared_data, tmp_path):
    """100k book objects must not mean 200k sequential metadata requests: sizes and names come
    from the one listing, for extract_books (whole run) and extract_wikipedia's inputs."""
    from pipelines import extract_books, extract_wikipedia

    _object_store_filesystem()
    _OBJECTS.clear()
    text = (shared_data / "books" / "blake-poems.txt").read_bytes()
    names = [f"author{a}/book{b}/text.txt" for a in range(10) for b in range(3)] + ["top.txt"]
    _OBJECTS.update({f"objtest://bucket/books/{name}": text[:1000 + i] for i, name in
                     enumerate(names)})
    _OBJECTS["objtest://bucket/books/_SUCCESS"] = b""
    _CALLS.clear()
    manifest = extract_books.main(["--input", "objtest://bucket/books",
                                  "--output", str(tmp_path / "out")])
    # One lookup: is `books` an object? No: one listing of `books/`; then only the 31 reads.
    assert dict(_CALLS) == {"lookup": 1, "list": 1}
    assert [(i["path"], i["bytes"]) for i in manifest["inputs"]] == sorted(
        (f"objtest://bucket/books/{name}", 1000 + i) for i, name in enumerate(names))
    assert manifest["counts"]["documents"] == 31
    _CALLS.clear()
    dumps = extract_wikipedia.select_dumps("objtest://bucket/books/")
    assert dict(_CALLS) == {"list": 1}
    assert [(d.name, d.size_bytes) for d in dumps][:2] == [("author0/book0/text.txt", 1000),
                                                           ("author0/book1/text.txt", 1001)]


def test_hadoop_markers_and_symlink_order_in_a_local_folder(tmp_path):
    """Spark/Hadoop output folders hold `_SUCCESS` and `_temporary/` (unfinished task output):
    no input. Two routes to one folder: the first in sorted order is kept, whatever order the
    filesystem lists them in (here the real folder is created, so listed, first)."""
    src = tmp_path / "parts"
    for name in ["part-00000.txt", "_SUCCESS", "_temporary/0/_temporary/attempt_1/part-00001.txt",
                 "z_real/book.txt", "sub/_SUCCESS", "sub/part-00002.txt"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_text("x" * len(name))
    (src / "a_link").symlink_to(src / "z_real")
    files = storage.expand_input_files(str(src))
    assert [(f.name, f.size_bytes) for f in files] == [
        ("a_link/book.txt", 15), ("part-00000.txt", 14), ("sub/part-00002.txt", 18)]
    assert [f.path for f in files] == [str(src / f.name) for f in files]
    assert storage.expand_inputs(str(src / "*")) == [str(src / "part-00000.txt")]


@pytest.fixture
def root_logging():
    """Restores the root logger's handlers: a job run under capsys binds one to the captured
    stderr, which is closed after the test (later log records would then fail to write)."""
    handlers = logging.root.handlers[:]
    yield
    logging.root.handlers = handlers


def test_user_errors_are_one_line_exit_2_and_bugs_keep_their_traceback(capsys, tmp_path,
                                                                         root_logging):
    """Our checks' errors are one line; the same types raised inside a library are bugs."""
    from pipelines import extract_books

    def nothing(argv):
        raise jobs.nothing_produced("documents", "books/", 2, "out/dead_letter/d.jsonl")

    def library_value_error(argv):
        json.loads("{")  # a ValueError from inside the json package: a bug, not the user's

    def bug(argv):
        raise KeyError("a bug")

    args = ["--input", str(tmp_path / "nope"), "--output", str(tmp_path / "out")]
    assert jobs.main("extract_books", extract_books.main, args) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"extract_books: error: --input {str(tmp_path / 'nope')!r} matches no files")
    assert jobs.main("extract_books", nothing, []) == 1
    assert capsys.readouterr().err == (
        "extract_books: error: 0 documents from --input books/: 2 bad record(s) set aside in "
        "out/dead_letter/d.jsonl; no manifest written\n")
    with pytest.raises(FileNotFoundError, match="matches no files"):
        jobs.main("extract_books", extract_books.main, ["--debug", *args])
    with pytest.raises(json.JSONDecodeError):
        jobs.main("extract_books", library_value_error, [])
    with pytest.raises(KeyError):
        jobs.main("extract_books", bug, [])


def test_beam_command_prints_a_user_error_in_one_line(tmp_path):
    beam = os.path.join(os.path.dirname(sys.executable), "beam")
    out = subprocess.run([beam, "run", "pipelines/extract_books.py", "--input",
                          str(tmp_path / "nope"), "--output", str(tmp_path / "out")],
                         check=False, capture_output=True, text=True,
                         cwd=os.path.dirname(os.path.dirname(storage.__file__)))
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == (
        f"extract_books: error: --input {str(tmp_path / 'nope')!r} matches no files")


def test_a_literal_local_path_with_glob_characters_is_read(tmp_path):
    """`books [v2]` exists as a folder: it is that folder, not a glob matching nothing."""
    folder = tmp_path / "books [v2]"
    folder.mkdir()
    (folder / "a.txt").write_text("x")
    assert storage.expand_inputs(str(folder)) == [str(folder / "a.txt")]
    assert storage.expand_inputs(str(folder / "a.txt")) == [str(folder / "a.txt")]


def test_remote_vocabulary_folder_without_trailing_slash(minilm_dir, tmp_path):
    """`--vocab gs://bucket/vocab` (README) reads the folder's vocab.txt and its casing."""
    from common.tokenization import recorded_lower_case

    _object_store_filesystem()
    save_tokenizer_folder(read_vocab(str(minilm_dir)), str(tmp_path), do_lower_case=False)
    _OBJECTS.clear()
    _OBJECTS.update({f"objtest://bucket/vocab/{p.name}": p.read_bytes() for p in tmp_path.iterdir()})
    assert read_vocab("objtest://bucket/vocab") == read_vocab(str(minilm_dir))
    assert read_vocab("objtest://bucket/vocab/") == read_vocab(str(minilm_dir))
    assert read_vocab("objtest://bucket/vocab/vocab.txt") == read_vocab(str(minilm_dir))
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    # A vocab.txt path: its folder's tokenizer_config.json decides; a vocab.txt alone, nothing.
    assert [recorded_lower_case(p) for p in (
        "objtest://bucket/vocab", "objtest://bucket/vocab/vocab.txt", str(tmp_path),
        str(tmp_path / "vocab.txt"), str(minilm_dir), str(minilm_dir / "vocab.txt"),
        str(bare / "vocab.txt"))] == [False, False, False, False, True, True, None]
    # Another file name beside a folder config is no vocab.txt of that folder: it records none.
    (tmp_path / "uncased_vocab.txt").write_bytes((minilm_dir / "vocab.txt").read_bytes())
    assert recorded_lower_case(str(tmp_path / "uncased_vocab.txt")) is None
