"""make_shards on bad input: wrong columns, null rows, corrupt row groups and binary files counted as
dead letters, no instance means no manifest; the reader against the reference reader."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import errors, storage
from common.tokenization import load_tokenizer
from pipelines.shards import reading as shard_inputs
from pipelines.shards.instances import (
    read_reference_text,
)
from tests.pipelines.make_shards.shard_runs import (
    _reference_run,
    _run,
    _shard_files,
    book_documents,
)


def test_text_twins_of_parquet_are_skipped(tmp_path):
    files = [str(tmp_path / f"corpus-00000-of-00001.{ext}") for ext in ("parquet", "txt")]
    assert shard_inputs.select_inputs(files) == files[:1]
    assert shard_inputs.select_inputs(files[1:]) == files[1:]


def test_wrong_parquet_columns_are_named(minilm_dir, tmp_path):
    docs_only = tmp_path / "documents"
    docs_only.mkdir()
    pq.write_table(pa.table({"doc_id": ["x"], "passages": [["A passage."]]}),
                   docs_only / "documents-00000-of-00001.parquet")
    with pytest.raises(errors.NoOutputError, match=r"^0 instances"):  # the run makes nothing
        _run(docs_only, tmp_path / "out2", minilm_dir)
    (letter,) = (tmp_path / "out2" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    assert "documents-00000-of-00001.parquet: no column(s) ['sentences']" in letter
    assert sorted(p.name for p in (tmp_path / "out2").iterdir()) == ["dead_letter"]


def test_null_rows_and_empty_documents_are_counted(corpus, minilm_dir, tmp_path):
    docs = [d for d in book_documents(corpus["text"], "b-austen-persuasion.txt", 60, 12) if d]
    rows = [{"doc_id": f"d{i}", "sentences": d} for i, d in enumerate(docs)]
    rows.insert(1, {"doc_id": "empty", "sentences": ["   ", "\x01\x02"]})  # no tokens
    rows.insert(3, {"doc_id": "null", "sentences": None})
    folder = tmp_path / "corpus"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(
        [("doc_id", pa.string()), ("sentences", pa.list_(pa.string()))])),
        folder / "corpus-00000-of-00001.parquet")
    manifest = _run(folder, tmp_path / "out", minilm_dir, "--num_shards", "1")
    counters = manifest["counters"]
    assert (counters["documents"], counters["empty_documents"], counters["bad_records"]) == (
        len(docs), 1, 1)
    (letter,) = (tmp_path / "out" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    assert json.loads(letter)["record"] == "row 3"


def test_reader_equals_the_reference_reader_on_raw_books(shared_data, minilm_dir):
    """Our batched reader gives read_reference_text's documents, also on CRLF and Latin-1 input."""
    tokenizer = load_tokenizer(str(minilm_dir))
    for name in ("melville-moby_dick.txt", "shakespeare-caesar.txt"):
        path = shared_data / "books" / name
        data = path.read_bytes()[:200_000]
        docs, bad = shard_inputs.parse_reference_text(data, str(path))
        ours = shard_inputs.tokenize_documents(tokenizer, docs)
        ours = [np.split(t, np.cumsum(lengths)[:-1]) for t, lengths in ours if len(lengths)]
        theirs = read_reference_text(data.decode("utf-8", "ignore").split("\n"), tokenizer)
        assert len(ours) == len(theirs) > 100
        for a, b in zip(ours, theirs):
            assert len(a) == len(b)
            assert all(np.array_equal(x, y) for x, y in zip(a, b))
        # caesar has two Latin-1 bytes: both lines reported, named by file and line
        assert [(b.file, b.record) for b in bad] == (
            [(str(path), "line 119"), (str(path), "line 663")] if "caesar" in name else [])


def test_literal_special_tokens_in_corpus_text_stay_plain_text(minilm_dir):
    """BERT's reference splits a literal "[MASK]" in text into "[", "mask", "]"; so must we,
    or corpus text would inject real mask/separator tokens into instances."""
    from common.tokenization import load_tokenizer, read_vocab
    from pipelines.shards.reading import tokenize_documents

    vocab = read_vocab(str(minilm_dir))
    tokenizer = load_tokenizer(str(minilm_dir), split_special_tokens=True)
    [(tokens, lengths)] = tokenize_documents(tokenizer, [["Fill the [MASK] in.", "[SEP] here"]])
    assert [vocab[i] for i in tokens] == ["fill", "the", "[", "mask", "]", "in", ".",
                                          "[", "sep", "]", "here"]
    assert lengths.tolist() == [7, 4]


def test_a_corrupt_row_group_loses_its_part_with_a_dead_letter(minilm_dir, tmp_path):
    """A part that fails after its file opened (here: garbled pages in row groups 5 of 8) is
    reported by part, never dropped silently because an earlier part of the file read fine."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    rows = [{"doc_id": f"d{i}", "sentences": [f"Sentence {i} of a document with some words."] * 8}
            for i in range(40)]
    path = folder / "corpus-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=5, compression="zstd")
    column = pq.ParquetFile(path).metadata.row_group(5).column(1)
    data = bytearray(path.read_bytes())
    for i in range(column.data_page_offset + 20,
                   column.data_page_offset + column.total_compressed_size - 4):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    (part,) = shard_inputs.read_parts(storage.expand_input_files(str(path)), 1024)[:1]
    assert part.num_parts > 1  # the file is read in parts, so the corrupt group is not in part 0
    manifest = _run(folder, tmp_path / "out", minilm_dir, "--read_part_kb", "1",
                    "--num_shards", "1")
    letters = [json.loads(line) for line in
               (tmp_path / "out" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()]
    assert letters and all(entry["record"].startswith("part ") for entry in letters)
    assert all(entry["record"] != f"part 1/{part.num_parts}" for entry in letters)
    assert manifest["counters"]["bad_records"] == len(letters)
    assert 0 < manifest["counters"]["documents"] < 40


def test_a_run_that_makes_no_instance_fails_without_a_manifest(corpus, minilm_dir, tmp_path):
    """A documents folder (no `sentences`) or a blank-only text: no "complete" empty output."""
    docs = tmp_path / "documents"
    (docs / "dead_letter").mkdir(parents=True)
    table = pq.read_table(corpus["parquet"] / "corpus-00000-of-00004.parquet")
    pq.write_table(table.drop(["sentences"]), docs / "documents-00000-of-00001.parquet")
    (docs / "dead_letter" / "dead_letter-00000-of-00001.jsonl").write_text("")
    (docs / storage.MANIFEST_NAME).write_text("{}")
    out = tmp_path / "out"
    with pytest.raises(errors.NoOutputError, match=(
            r"^0 instances \(0 documents, 0 empty\) from --input .*documents: 1 bad record\(s\) "
            r"set aside in .*out/dead_letter/make_shards.jsonl \(first: .*documents-00000-of-"
            r"00001.parquet file: ValueError: .*no column\(s\) \['sentences'\].*; no manifest")):
        _run(docs, out, minilm_dir)
    assert not (out / storage.MANIFEST_NAME).exists()
    (letter,) = (out / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    assert json.loads(letter)["record"] == "file"
    blank = tmp_path / "blank.txt"
    blank.write_text("\n   \n\t\n\n")
    for mode in ("reference", "scalable"):
        with pytest.raises(errors.NoOutputError, match=r"^0 instances \(0 documents, 0 empty\) "
                                                     r".*: 0 bad record\(s\) set aside"):
            _run(blank, tmp_path / mode, minilm_dir, "--mode", mode)
        assert not (tmp_path / mode / storage.MANIFEST_NAME).exists()


def test_a_binary_file_is_one_dead_letter_and_the_last_log_line_says_so(
        corpus, minilm_dir, tmp_path, capfd):
    """A model file among the text: set aside whole (as extract_books does), not read as
    thousands of garbage instances; the run's last line reports the dead letters."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    shutil.copy(corpus["text"] / "a-sample.txt", inputs / "a-sample.txt")
    (inputs / "weights.bin").write_bytes((minilm_dir / "model.safetensors").read_bytes()[:300_000])
    alone = _run(inputs / "a-sample.txt", tmp_path / "alone", minilm_dir)
    capfd.readouterr()
    mixed = _run(inputs, tmp_path / "mixed", minilm_dir)
    assert _shard_files(tmp_path / "mixed") == _shard_files(tmp_path / "alone")
    assert mixed["totals"]["num_instances"] == alone["totals"]["num_instances"]
    assert mixed["counters"]["bad_records"] == 1
    (letter,) = (tmp_path / "mixed" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    letter = json.loads(letter)
    assert (letter["file"], letter["record"]) == (str(inputs / "weights.bin"), "file")
    assert letter["reason"].startswith(f"ValueError: {inputs / 'weights.bin'}: binary, not text: ")
    last = capfd.readouterr().err.strip().splitlines()[-1]
    assert last.endswith(f"WARNING make_shards: make_shards: 1 bad record(s) set aside in "
                         f"{tmp_path / 'mixed' / 'dead_letter' / 'make_shards.jsonl'}")
    reference = _reference_run(inputs, tmp_path / "reference", minilm_dir)
    assert reference["counters"]["bad_records"] == 1
    assert reference["totals"]["num_instances"] == _reference_run(
        inputs / "a-sample.txt", tmp_path / "reference_alone", minilm_dir)["totals"]["num_instances"]
