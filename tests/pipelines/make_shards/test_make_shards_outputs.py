"""The make_shards Beam job end to end on real text: shards and manifest, the same shards from any
worker count, input format or read plan, verification, WebDataset and JSONL, packing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from common import shard_format, storage
from common.tokenization import load_tokenizer, read_vocab
from pipelines import jobs, make_shards, verify_shards
from pipelines.shards import batches as shard_batches
from pipelines.shards import config as shards_config
from pipelines.shards import reading as shard_inputs
from pipelines.shards import shard_files as shards
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_reference,
    read_reference_text,
)
from tests.pipelines.make_shards.shard_runs import (
    _run,
    _sha,
    _shard_files,
)


def test_manifest_totals_equal_a_recount(one_worker):
    out, manifest = one_worker
    problems, recount = verify_shards.verify_folder(str(out), progress=False)
    assert problems == []
    totals = manifest["totals"]
    rows = [r for e in manifest["shards"] for r in shards.read_rows(str(out / e["file"]))]
    labels = np.concatenate([r.next_sentence_labels for r in rows])
    assert totals["num_rows"] == totals["num_instances"] == len(rows) == recount.num_rows
    assert totals["num_tokens"] == sum(len(r.input_ids) for r in rows)
    assert totals["num_masked"] == sum(len(r.masked_lm_positions) for r in rows)
    assert totals["num_random_next"] == int((labels == 1).sum())
    assert totals["random_next_share"] == pytest.approx((labels == 1).mean())
    assert sum(totals["length_histogram"]["counts"]) == len(rows)
    assert manifest["counters"]["instances"] == len(rows)
    assert manifest["vocab"]["sha256"] == _sha(Path(manifest["vocab"]["path"]))
    assert manifest["vocab_size"] == 30522 and manifest["nsp"] and not manifest["packed"]
    assert [e["file"] for e in manifest["shards"]] == [f"train-{i:06d}.tar" for i in range(3)]
    # Round robin after the shuffle: balanced to within one row.
    counts = [e["num_rows"] for e in manifest["shards"]]
    assert max(counts) - min(counts) <= 1
    # The reference's invariants hold in what was written.
    for r in rows[:200]:
        assert r.input_ids[0] == 101 and (r.input_ids == 102).sum() == 2
        assert len(r.input_ids) <= 128 and np.all(np.diff(r.masked_lm_positions) > 0)


def test_scalable_job_equals_create_instances_scalable(one_worker, corpus, minilm_dir):
    """The Beam wiring (dense index, random-next join, buckets) loses, adds and changes nothing."""
    from pipelines.shards.instances import create_instances_scalable

    out, manifest = one_worker
    tokenizer = load_tokenizer(str(minilm_dir))
    docs = []
    for path in sorted(corpus["text"].iterdir()):  # the job's dense index: files in order
        with open(path, encoding="utf-8", newline="\n") as f:
            docs += read_reference_text(f, tokenizer)
    want = create_instances_scalable(docs, Vocab.from_tokens(read_vocab(str(minilm_dir))),
                                     InstanceConfig(dupe_factor=2))

    def key(ids, segments, positions, masked_ids, label):
        return (tuple(ids), tuple(segments), tuple(positions), tuple(masked_ids), int(label))

    got = sorted(key(r.input_ids.tolist(), r.segment_ids.tolist(),
                     r.masked_lm_positions.tolist(), r.masked_lm_ids.tolist(),
                     r.next_sentence_labels[0])
                 for e in manifest["shards"] for r in shards.read_rows(str(out / e["file"])))
    assert got == sorted(key(i.input_ids.tolist(), i.segment_ids.tolist(),
                             i.masked_lm_positions.tolist(), i.masked_lm_ids.tolist(),
                             i.next_sentence_label) for i in want)


def test_two_workers_and_rerun_give_identical_shards(one_worker, corpus, minilm_dir, tmp_path):
    out, manifest = one_worker
    two = tmp_path / "two"
    manifest2 = _run(corpus["text"], two, minilm_dir, "--direct_num_workers=2",
                     "--direct_running_mode=multi_processing")
    assert _shard_files(two) == _shard_files(out)
    assert manifest2["shards"] == manifest["shards"]
    assert manifest2["config_hash"] == manifest["config_hash"]
    config = jobs.config_from_args(make_shards.build_parser().parse_args([
        "--input", "x", "--output", "y", "--vocab", "v", "--dupe_factor", "2",
        "--instances_per_pack_bucket", "300"]), shards_config.ShardsConfig())
    assert shard_batches.pack_bucket_count(manifest["counters"]["tokens"], config) >= 3
    # Unpacked rows are in shuffle-key order whatever the grouping: other join and pack
    # bucket counts give the same bytes.
    regrouped = _run(corpus["text"], tmp_path / "regrouped", minilm_dir, "--join_buckets", "1",
                     "--instances_per_pack_bucket", "100000", "--read_part_kb", "8")
    assert _shard_files(tmp_path / "regrouped") == _shard_files(out)
    # ... so these speed options leave the config hash as it is (an output option does not:
    # --num_shards below)
    assert regrouped["options"]["job"]["join_buckets"] == 1
    assert regrouped["config_hash"] == manifest["config_hash"]
    # Re-run into the same folder with fewer shards, then as before: identical bytes again,
    # and the shard left over from the 3-shard run is removed.
    fewer = _run(corpus["text"], two, minilm_dir, "--num_shards", "2")
    assert sorted(_shard_files(two)) == ["train-000000.tar", "train-000001.tar"]
    assert fewer["config_hash"] != manifest["config_hash"]
    _run(corpus["text"], two, minilm_dir)
    assert _shard_files(two) == _shard_files(out)


def test_parquet_corpus_gives_the_same_shards_as_text(one_worker, corpus, minilm_dir, tmp_path):
    """Same documents in the same order -> the same dense index -> byte-identical shards."""
    out, _ = one_worker
    bad = tmp_path / "corpus"
    shutil.copytree(corpus["parquet"], bad)
    (bad / "corpus-99999-of-99999.parquet").write_bytes(b"PAR1 this is not parquet")
    manifest = _run(bad, tmp_path / "pq", minilm_dir)
    assert _shard_files(tmp_path / "pq") == _shard_files(out)
    letters = (tmp_path / "pq" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    assert len(letters) == 1 and json.loads(letters[0])["file"].endswith("corpus-99999-of-99999.parquet")
    assert manifest["counters"]["bad_records"] == 1


def test_files_read_in_parts_give_the_same_shards(one_worker, corpus, minilm_dir, tmp_path):
    """Work units smaller than a file (text: shares of its documents; Parquet: its row groups)
    keep the dense document order: the same bytes on 2 workers, a bad line reported once."""
    out, manifest = one_worker
    text = tmp_path / "text"
    shutil.copytree(corpus["text"], text)
    book = text / "b-austen-persuasion.txt"
    data = book.read_bytes()
    # A blank line that is not UTF-8: still a document break, so the documents are unchanged.
    separator = data.index(b"\n\n") + 1
    book.write_bytes(data[:separator] + b"\xff" + data[separator:])
    files = storage.expand_input_files(str(text))
    parts = shard_inputs.read_parts(files, 8 * 1024)
    assert len(parts) > 2 * len(files)
    assert {u.num_parts for u in parts if u.path == str(book)} == {
        min(shard_inputs.MAX_TEXT_PARTS, -(-book.stat().st_size // (8 * 1024)))}
    got = _run(text, tmp_path / "text-out", minilm_dir, "--read_part_kb", "8",
               "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert _shard_files(tmp_path / "text-out") == _shard_files(out)
    (letter,) = (tmp_path / "text-out" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    line = data[:separator].count(b"\n") + 1
    assert json.loads(letter)["record"] == f"line {line}" and got["counters"]["bad_records"] == 1
    assert got["counters"]["documents"] == manifest["counters"]["documents"]

    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for path in sorted(corpus["parquet"].iterdir()):
        pq.write_table(pq.read_table(path), parquet / path.name, row_group_size=5)
    bogus = parquet / "corpus-99999-of-99999.parquet"
    bogus.write_bytes(b"PAR1" + b"not parquet " * 300)  # 4 parts, each fails to open it
    got = _run(parquet, tmp_path / "parquet-out", minilm_dir, "--read_part_kb", "1")
    assert _shard_files(tmp_path / "parquet-out") == _shard_files(out)
    (letter,) = (tmp_path / "parquet-out" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    assert json.loads(letter)["file"] == str(bogus) and got["counters"]["bad_records"] == 1


def test_reference_mode_reads_parquet_like_text(corpus, minilm_dir, tmp_path):
    args = ["--mode", "reference", "--format", "jsonl", "--num_shards", "1", "--dupe_factor", "1"]
    text = _run(corpus["text"], tmp_path / "text", minilm_dir, *args)
    parquet = _run(corpus["parquet"], tmp_path / "parquet", minilm_dir, *args)
    assert text["totals"]["num_instances"] > 500
    assert _shard_files(tmp_path / "text") == _shard_files(tmp_path / "parquet")
    assert parquet["counters"]["documents"] == text["counters"]["documents"]


def test_webdataset_reads_the_rows_back(one_worker):
    import webdataset as wds

    out, manifest = one_worker
    urls = [str(out / e["file"]) for e in manifest["shards"]]
    got = []
    for sample in wds.WebDataset(urls, shardshuffle=False).decode():
        got += shard_format.decode_block(sample[shard_format.MEMBER_SUFFIX])
    want = [r for u in urls for r in shards.read_rows(u)]
    assert len(got) == len(want) == manifest["totals"]["num_rows"]
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a.input_ids, b.input_ids)
        np.testing.assert_array_equal(a.masked_lm_ids, b.masked_lm_ids)
        assert a.input_ids.dtype == np.uint16


def test_verify_catches_flipped_byte_and_truncation(one_worker, tmp_path, capsys):
    out, _ = one_worker
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert verify_shards.main([str(copy), "--quiet"]) == 0
    flipped, truncated = copy / "train-000001.tar", copy / "train-000002.tar"
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x01
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-3000])
    capsys.readouterr()
    assert verify_shards.main([str(copy), "--quiet"]) == 1
    report = capsys.readouterr().out
    bad_lines = [line for line in report.splitlines() if line.startswith("  train-")]
    assert any("train-000001.tar: sha256 mismatch" in line for line in bad_lines)
    assert any("train-000002.tar" in line and "truncated" in line for line in bad_lines)
    assert not any("train-000000.tar" in line for line in bad_lines)


def test_jsonl_has_the_same_instances_as_shards(one_worker, corpus, minilm_dir, tmp_path):
    out, _ = one_worker
    manifest = _run(corpus["text"], tmp_path / "jsonl", minilm_dir, "--format", "jsonl")
    vocab = read_vocab(str(minilm_dir))
    assert [e["file"] for e in manifest["shards"]] == [f"train-{i:06d}.jsonl" for i in range(3)]
    for i in range(3):
        lines = (tmp_path / "jsonl" / f"train-{i:06d}.jsonl").read_text().splitlines()
        rows = shards.read_rows(str(out / f"train-{i:06d}.tar"))
        assert len(lines) == len(rows)
        for line, row in zip(lines, rows):
            obj = json.loads(line)
            assert set(obj) == {"tokens", "segment_ids", "masked_lm_positions",
                                "masked_lm_labels", "next_sentence_label"}
            assert obj["tokens"] == [vocab[t] for t in row.input_ids]
            assert obj["segment_ids"] == row.segment_ids.tolist()
            assert obj["masked_lm_positions"] == row.masked_lm_positions.tolist()
            assert obj["masked_lm_labels"] == [vocab[t] for t in row.masked_lm_ids]
            assert obj["next_sentence_label"] == int(row.next_sentence_labels[0])
    assert verify_shards.verify_folder(str(tmp_path / "jsonl"), progress=False)[0] == []
    with pytest.raises(ValueError, match="--pack"):
        _run(corpus["text"], tmp_path / "x", minilm_dir, "--format", "jsonl", "--pack")


def test_reference_mode_equals_create_instances_reference(shared_data, minilm_dir, tmp_path):
    sample = shared_data / "reference" / "sample_text.txt"
    manifest = make_shards.main([
        "--input", str(sample), "--vocab", str(minilm_dir), "--output", str(tmp_path),
        "--mode", "reference", "--format", "jsonl", "--dupe_factor", "3", "--num_shards", "1"])
    with open(sample, encoding="utf-8", newline="\n") as f:
        docs = read_reference_text(f, load_tokenizer(str(minilm_dir)))
    vocab_tokens = read_vocab(str(minilm_dir))
    want = create_instances_reference(docs, Vocab.from_tokens(vocab_tokens),
                                      InstanceConfig(dupe_factor=3))
    got = [json.loads(line) for line in (tmp_path / "train-000000.jsonl").read_text().splitlines()]
    assert manifest["totals"]["num_instances"] == len(want) == len(got)
    for g, w in zip(got, want):
        assert g["tokens"] == [vocab_tokens[i] for i in w.input_ids]
        assert g["segment_ids"] == w.segment_ids.tolist()
        assert g["masked_lm_positions"] == w.masked_lm_positions.tolist()
        assert g["masked_lm_labels"] == [vocab_tokens[i] for i in w.masked_lm_ids]
        assert g["next_sentence_label"] == w.next_sentence_label


def test_packing_via_the_job(one_worker, corpus, minilm_dir, tmp_path):
    out, unpacked = one_worker
    packed = _run(corpus["text"], tmp_path / "packed", minilm_dir, "--pack")
    assert packed["packed"] and packed["totals"]["num_instances"] == unpacked["totals"]["num_instances"]
    assert packed["totals"]["num_rows"] < unpacked["totals"]["num_rows"]
    assert packed["totals"]["padding_share"] < unpacked["totals"]["padding_share"]
    assert packed["totals"]["padding_share_unpacked"] == unpacked["totals"]["padding_share"]

    def instances(folder, manifest):
        found = []
        for e in manifest["shards"]:
            for row in shards.read_rows(str(folder / e["file"])):
                assert len(row.input_ids) <= 128
                for k in range(len(row.next_sentence_labels)):
                    where = row.sequence_ids == k
                    found.append((tuple(row.input_ids[where].tolist()),
                                  int(row.next_sentence_labels[k])))
        return sorted(found)

    assert instances(tmp_path / "packed", packed) == instances(out, unpacked)
    assert verify_shards.verify_folder(str(tmp_path / "packed"), progress=False)[0] == []
    # Rows per pack bucket are counted from the instances' lengths before packing (so that
    # packing and shard assignment share a stage): 2 workers give the same bytes.
    _run(corpus["text"], tmp_path / "packed2", minilm_dir, "--pack", "--direct_num_workers=2",
         "--direct_running_mode=multi_processing")
    assert _shard_files(tmp_path / "packed2") == _shard_files(tmp_path / "packed")
