"""common/manifest.py: the one typed manifest of every data stage. The JSON of folders built
before it reads back into a `Manifest` and writes out again key for key, value for value."""
from __future__ import annotations

import json

import pytest

from common import storage
from common.manifest import Manifest, ShardRecord

SHARD = {"file": "train-000001.tar", "split": "train", "index": 1, "num_rows": 40,
         "num_instances": 52, "num_tokens": 4963, "num_masked": 720,
         "sha256": "ab" * 32, "bytes": 92160}
MAKE_SHARDS = {
    "stage": "make_shards", "config_hash": "0123456789abcdef",
    "options": {"input": ["corpus/corpus-00000-of-00001.parquet"], "vocab": "vocab",
                "instance": {"max_seq_length": 128}, "job": {"pack": False}},
    "vocab": {"path": "vocab/vocab.txt", "sha256": "cd" * 32, "vocab_size": 4000},
    "vocab_size": 4000, "max_seq_length": 128, "max_predictions_per_seq": 20, "packed": False,
    "nsp": True, "format": "shards", "mode": "scalable",
    "next_sentence_label": "1 = B is a random segment, 0 = B is the actual next, -1 = no NSP",
    "shards": [SHARD, {**SHARD, "file": "validation-000000.tar", "split": "validation",
                       "index": 0}],
    "splits": {"train": {"num_shards": 1, "num_rows": 40}},
    "totals": {"num_rows": 80, "num_instances": 104}, "counters": {"documents": 9, "waves": 1},
}
EXTRACT_WIKIPEDIA = {
    "stage": "extract_wikipedia", "output_version": 2,
    "config": {"input": ["dump.xml"], "split_bytes": 0, "max_page_bytes": 16777216,
               "row_group_docs": 4},
    "config_hash": "fedcba9876543210", "counts": {"pages_read": 12, "articles_kept": 9},
    "inputs": [{"path": "dump.xml", "size_bytes": 4096}],
    "outputs": [{"path": "documents-00000-of-00001.parquet", "sha256": "ef" * 32,
                 "size_bytes": 2048, "num_documents": 9}],
    "dead_letter": "dead_letter/dead_letter-00000-of-00001.jsonl",
}
EXTRACT_BOOKS = {
    "stage": "extract_books", "output_version": 3,
    "config": {"input": "books", "output": "out/books", "num_shards": 0, "wave_mb": 64.0},
    "config_hash": "1111222233334444", "num_shards": 1, "counts": {"documents": 3},
    "inputs": [{"path": "books/a.txt", "bytes": 100}], "excluded_inputs": ["books/README"],
    "outputs": [{"path": "documents-00000-of-00001.parquet", "sha256": "01" * 32},
                {"path": "dead_letter/dead_letter-00000-of-00001.jsonl", "sha256": "02" * 32}],
}
TRAIN_VOCAB = {
    "stage": "train_vocab", "config": {"vocab_size": 4000, "kind": "wordpiece"},
    "config_hash": "5555666677778888", "inputs": ["corpus/corpus-00000-of-00001.parquet"],
    "vocab_size": 4000, "vocab_sha256": "03" * 32, "num_texts": 10, "num_bad_records": 0,
    "word_counts_sha256": "04" * 32, "train_seconds": 0.5, "num_learned_tokens": 3000,
}


@pytest.mark.parametrize("data", [MAKE_SHARDS, EXTRACT_WIKIPEDIA, EXTRACT_BOOKS, TRAIN_VOCAB],
                         ids=lambda d: d["stage"])
def test_a_built_folders_json_reads_and_writes_back_the_same(data, tmp_path):
    storage.write_manifest(str(tmp_path), data)
    before = (tmp_path / "manifest.json").read_bytes()
    manifest = Manifest.read(str(tmp_path))
    assert manifest.stage == data["stage"]
    assert manifest.config_hash == data["config_hash"]
    assert manifest.to_json() == data
    assert manifest.write(str(tmp_path)) == data
    assert (tmp_path / "manifest.json").read_bytes() == before


def test_shard_records_are_typed_and_name_their_fields_as_before():
    manifest = Manifest.from_json(MAKE_SHARDS)
    first = manifest.shards[0]
    assert first == ShardRecord("train-000001.tar", "ab" * 32, 92160, "train", 1, 40, 52, 4963,
                                720)
    assert first.to_json() == SHARD
    assert manifest.sections["totals"] == {"num_rows": 80, "num_instances": 104}
    assert manifest.outputs is None and manifest.counts is None
    wiki = Manifest.from_json(EXTRACT_WIKIPEDIA).outputs[0]
    assert (wiki.path, wiki.num_bytes, wiki.num_documents, wiki.split) == (
        "documents-00000-of-00001.parquet", 2048, 9, None)
    book = Manifest.from_json(EXTRACT_BOOKS).outputs[1]
    assert (book.name, book.num_bytes) == ("dead_letter-00000-of-00001.jsonl", None)


def test_a_hand_written_shard_list_names_its_files_by_name():
    record = ShardRecord.from_json({"name": "shards/train-000000.tar", "num_rows": "7"})
    assert (record.name, record.num_rows, record.sha256, record.num_bytes) == (
        "train-000000.tar", 7, None, None)
    with pytest.raises(ValueError, match="without 'file', 'path' or 'name'"):
        ShardRecord.from_json({"num_rows": 7})


def test_a_new_manifest_writes_only_the_fields_it_has(tmp_path):
    manifest = Manifest(stage="job", config_hash="abc", config={"output": str(tmp_path),
                                                               "tasks": ("a", "b")},
                        output_version=3, outputs=(ShardRecord("x.parquet", "00" * 32),),
                        sections={"num_shards": 1})
    assert manifest.to_json() == {
        "stage": "job", "output_version": 3, "config": {"output": str(tmp_path),
                                                         "tasks": ("a", "b")},
        "config_hash": "abc", "outputs": [{"path": "x.parquet", "sha256": "00" * 32}],
        "num_shards": 1}
    read = manifest.write(str(tmp_path))
    assert read["config"]["tasks"] == ["a", "b"]
    assert json.loads((tmp_path / "manifest.json").read_text()) == read
    assert Manifest.read(str(tmp_path / "none")) is None


def test_a_section_may_not_shadow_a_field():
    with pytest.raises(ValueError, match=r"\['counts'\] are fields of Manifest"):
        Manifest(stage="job", config_hash="abc", sections={"counts": {}})
    with pytest.raises(ValueError, match="no 'stage'"):
        Manifest.from_json({"config_hash": "abc"})
