"""make_shards' options: the validation split, MLM-only, the vocabulary's casing, bad options named,
documents of same-named files, the wire batch."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from common import shard_format, storage
from common.tokenization import read_vocab, save_tokenizer_folder
from pipelines import make_shards, verify_shards
from pipelines.shards import batches as shard_batches
from pipelines.shards import config as shards_config
from pipelines.shards import reading as shard_inputs
from pipelines.shards import shard_files as shards
from tests.pipelines.make_shards.shard_runs import (
    _reference_run,
    _run,
)


def test_validation_split(corpus, minilm_dir, tmp_path):
    manifest = _run(corpus["text"], tmp_path, minilm_dir, "--validation_fraction", "0.25",
                    "--num_shards", "2")
    assert set(manifest["splits"]) == {"train", "validation"}
    assert [e["file"] for e in manifest["shards"]] == [
        "train-000000.tar", "train-000001.tar", "validation-000000.tar", "validation-000001.tar"]
    # Held out by doc_id ("<file name>:<document number>"), each split with its own index.
    doc_ids = [f"{p.name}:{i}" for p in sorted(corpus["text"].iterdir())
               for i in range(len(p.read_text().strip().split("\n\n")))]
    held_out = sum(shard_inputs.split_of(d, 0.25) == "validation" for d in doc_ids)
    counters = manifest["counters"]
    assert (len(doc_ids), held_out) == (CORPUS_DOCUMENTS, CORPUS_HELD_OUT_025)
    assert counters["documents_validation"] == held_out
    assert counters["documents_train"] == len(doc_ids) - held_out == counters["documents"] - held_out
    assert verify_shards.verify_folder(str(tmp_path), progress=False)[0] == []


@pytest.mark.parametrize("mode", ["scalable", "reference"])
def test_text_files_of_the_same_name_in_subfolders_are_different_documents(
        corpus, minilm_dir, tmp_path, mode):
    """wikiextractor writes AA/wiki_00, AB/wiki_00, ...: a document's id is the file's path below
    the input folder and its number, so `AA/wiki_00:3` and `AB/wiki_00:3` are two documents
    (each held out by its own hash); a top-level file keeps its bare name."""
    folder = tmp_path / "extracted"
    sample = (corpus["text"] / "a-sample.txt").read_bytes()
    for name in ("AA/wiki_00", "AB/wiki_00", "top.txt"):
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(sample)
    assert [p.name for p in shard_inputs.read_parts(storage.expand_input_files(str(folder)),
                                                    1 << 20)] == [
        "AA/wiki_00", "AB/wiki_00", "top.txt"]
    manifest = _run(folder, tmp_path / "out", minilm_dir, "--validation_fraction", "0.5",
                    "--num_shards", "1", "--mode", mode)
    per_file = len(sample.decode().strip().split("\n\n"))
    doc_ids = [f"{name}:{i}" for name in ("AA/wiki_00", "AB/wiki_00", "top.txt")
               for i in range(per_file)]
    held_out = sum(shard_inputs.split_of(d, 0.5) == "validation" for d in doc_ids)
    # With ids by base name the two wiki_00 copies would always share a split.
    assert held_out != sum(shard_inputs.split_of(f"{name}:{i}", 0.5) == "validation"
                           for name in ("wiki_00", "wiki_00", "top.txt") for i in range(per_file))
    assert (manifest["counters"]["documents_validation"],
            manifest["counters"]["documents"]) == (held_out, 3 * per_file)


def test_mlm_only(corpus, minilm_dir, tmp_path):
    manifest = _run(corpus["text"], tmp_path, minilm_dir, "--no_next_sentence")
    assert not manifest["nsp"] and manifest["totals"]["num_random_next"] == 0
    assert manifest["counters"].get("random_next_requests", 0) == 0
    for e in manifest["shards"]:
        for row in shards.read_rows(str(tmp_path / e["file"])):
            assert row.next_sentence_labels.tolist() == [shard_format.NO_NSP_LABEL]
            assert (row.input_ids == 102).sum() == 1 and not row.segment_ids.any()


def test_bad_options_name_the_flag(corpus, minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="--mode"):
        shards_config.ShardJobConfig(mode="fast")
    with pytest.raises(ValueError, match="--validation_fraction"):
        _run(corpus["text"], tmp_path, minilm_dir, "--validation_fraction", "1.5")
    with pytest.raises(FileNotFoundError, match="nope"):
        _run(tmp_path / "nope*", tmp_path, minilm_dir)
    assert not os.path.exists(tmp_path / storage.MANIFEST_NAME)


def test_wire_batch_drops_segment_ids_only_when_it_can_rebuild_them():
    from pipelines.shards import packing
    from pipelines.shards.instances import Instance

    def instance(segments, label):
        ids = np.arange(101, 101 + len(segments), dtype=np.int32)
        return Instance(ids, np.array(segments, np.uint8), np.array([1], np.int32), ids[1:2],
                        label)

    usual = [instance([0, 0, 0, 1, 1], 0), instance([0, 0, 0], -1), instance([0, 0, 1], 1)]
    n = len(usual)
    batch = packing.InstanceBatch.from_instances(usual, np.arange(n), np.arange(n), np.zeros(n),
                                                 np.zeros(n))
    wire = shard_batches.WireBatch.of(batch)
    assert wire.segment0_lengths.tolist() == [3, 3, 2] and len(wire.batch.segment_ids) == 0
    assert wire.unpack().segment_ids.tolist() == batch.segment_ids.tolist()
    assert wire.unpack().input_ids.tolist() == batch.input_ids.tolist()
    # Segment ids that do not go 0... then 1... travel as they are.
    odd = packing.InstanceBatch.from_instances(
        [*usual, instance([0, 1, 0], 0)], np.arange(n + 1), np.arange(n + 1), np.zeros(n + 1),
        np.zeros(n + 1))
    kept = shard_batches.WireBatch.of(odd)
    assert kept.segment0_lengths is None and kept.unpack() is odd


def test_the_vocabulary_folder_decides_the_casing(corpus, minilm_dir, tmp_path):
    """A cased vocabulary folder (train_vocab --cased) is not lower-cased behind its back; a bare
    vocab.txt keeps the reference's default (lower case); a contradicting flag is refused."""
    cased = tmp_path / "cased"
    save_tokenizer_folder(read_vocab(str(minilm_dir)), str(cased), do_lower_case=False)
    bare = tmp_path / "bare" / "vocab.txt"
    bare.parent.mkdir()
    shutil.copy(minilm_dir / "vocab.txt", bare)
    assert [make_shards.resolve_do_lower_case(flag, str(vocab)) for flag, vocab in [
        (None, cased), (None, minilm_dir), (None, bare), (False, bare), (False, cased),
        (None, cased / "vocab.txt"), (False, cased / "vocab.txt"),
        (None, minilm_dir / "vocab.txt")]] == [False, True, True, False, False, False, False, True]
    # `--vocab cased/vocab.txt` names the same cased vocabulary as `--vocab cased`.
    with pytest.raises(ValueError, match=r"--do_lower_case=true contradicts --vocab .*cased/"
                                         r"vocab.txt, whose tokenizer files say do_lower_case="):
        make_shards.resolve_do_lower_case(True, str(cased / "vocab.txt"))
    with pytest.raises(ValueError, match=r"--do_lower_case=true contradicts --vocab .*cased, "
                                         r"whose tokenizer files say do_lower_case=false"):
        _reference_run(corpus["text"] / "a-sample.txt", tmp_path / "x", cased, "--do_lower_case")
    sample = corpus["text"] / "a-sample.txt"
    by_folder = _reference_run(sample, tmp_path / "by_folder", cased)
    by_flag = _reference_run(sample, tmp_path / "by_flag", bare, "--do_lower_case=false")
    lowered = _reference_run(sample, tmp_path / "lowered", bare)
    assert by_folder["options"]["job"]["do_lower_case"] is False
    assert lowered["options"]["job"]["do_lower_case"] is True
    assert ([s["sha256"] for s in by_folder["shards"]] == [s["sha256"] for s in by_flag["shards"]]
            != [s["sha256"] for s in lowered["shards"]])


@pytest.mark.parametrize("fraction", [0.05, 0.25, 0.5])
def test_split_of_holds_out_the_requested_share(fraction):
    """Over 10,000 document ids the held-out share is the fraction within 4 standard deviations
    of a binomial draw; the ids held out at half the fraction are a strict subset of them (one
    threshold on the id's hash)."""
    ids = [f"wiki/AA/wiki_{i // 100:02d}:{i % 100}" for i in range(10_000)]
    held_out = {d for d in ids if shard_inputs.split_of(d, fraction) == "validation"}
    sigma = (fraction * (1 - fraction) / len(ids)) ** 0.5
    share = len(held_out) / len(ids)
    assert abs(share - fraction) < 4 * sigma, f"held out {share:.4f} for fraction {fraction}"
    smaller = {d for d in ids if shard_inputs.split_of(d, fraction / 2) == "validation"}
    assert smaller < held_out


def test_split_of_without_a_fraction_holds_out_nothing():
    ids = [f"doc:{i}" for i in range(10_000)]
    assert {shard_inputs.split_of(d, 0.0) for d in ids} == {"train"}
    assert {shard_inputs.split_of(d, 1.0) for d in ids} == {"validation"}


# Measured once: the documents of the `corpus` fixture's text files held out at 0.25 (the
# documents test_validation_split's Beam job must count as validation).
CORPUS_DOCUMENTS, CORPUS_HELD_OUT_025 = 63, 21


def test_validation_share_of_the_test_corpus_is_the_measured_count(corpus):
    doc_ids = [f"{p.name}:{i}" for p in sorted(corpus["text"].iterdir())
               for i in range(len(p.read_text().strip().split("\n\n")))]
    held_out = sum(shard_inputs.split_of(d, 0.25) == "validation" for d in doc_ids)
    assert (len(doc_ids), held_out) == (CORPUS_DOCUMENTS, CORPUS_HELD_OUT_025)
