"""The make_shards Beam job end to end on real text: shards, manifest, verification, formats."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import errors, shard_format, storage
from common.tokenization import load_tokenizer, read_vocab, save_tokenizer_folder
from pipelines import jobs, make_shards, verify_shards
from pipelines.corpus.documents import CORPUS_SCHEMA
from pipelines.shards import batches, reading, shard_files
from pipelines.shards.config import ShardJobConfig, ShardsConfig
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_reference,
    read_reference_text,
)

BOOKS = ("austen-persuasion.txt", "chesterton-brown.txt", "shakespeare-caesar.txt")


def book_documents(books: Path, name: str, paragraphs: int = 240, per_doc: int = 12) -> list[list[str]]:
    """Documents of `per_doc` paragraphs from the start of a book, one sentence per entry."""
    import blingfire

    text = (books / name).read_bytes().decode("utf-8", "replace").replace("\r\n", "\n")
    paras = [" ".join(p.split()) for p in text.split("\n\n") if p.strip()][:paragraphs]
    return [blingfire.text_to_sentences(" ".join(paras[s:s + per_doc])).split("\n")
            for s in range(0, len(paras), per_doc)]


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> dict:
    """The same documents as reference-format text files and as corpus Parquet files."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "text").mkdir()
    (root / "parquet").mkdir()
    # Every file ends with a blank line, so it holds the same documents as its Parquet twin in
    # reference mode too (the reference reads on across files; the sample ends without one).
    (root / "text" / "a-sample.txt").write_bytes(
        (shared_data / "reference" / "sample_text.txt").read_bytes() + b"\n")
    sample_docs = (shared_data / "reference" / "sample_text.txt").read_text().split("\n\n")
    all_docs = {"a-sample": [[s for s in d.split("\n") if s.strip()] for d in sample_docs]}
    for name in BOOKS:
        docs = book_documents(shared_data / "books", name)
        stem = "b-" + name.removesuffix(".txt")
        all_docs[stem] = docs
        (root / "text" / f"{stem}.txt").write_text("".join("\n".join(d) + "\n\n" for d in docs))
    for i, (stem, docs) in enumerate(sorted(all_docs.items())):
        docs = [d for d in docs if d]
        table = pa.Table.from_pylist([{
            "doc_id": f"books/{stem}/{j}", "source": "books", "source_file": stem, "title": stem,
            "passages": [" ".join(d)], "sentences": d} for j, d in enumerate(docs)],
            schema=CORPUS_SCHEMA)
        pq.write_table(table, root / "parquet" / f"corpus-{i:05d}-of-{len(all_docs):05d}.parquet")
    return {"text": root / "text", "parquet": root / "parquet"}


def _run(corpus_dir, out, minilm_dir, *extra) -> dict:
    return make_shards.main([
        "--input", str(corpus_dir), "--vocab", str(minilm_dir), "--output", str(out),
        "--dupe_factor", "2", "--num_shards", "3", "--rows_per_block", "64",
        "--instances_per_pack_bucket", "300", "--join_buckets", "7", *extra])


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _shard_files(folder: Path) -> dict[str, str]:
    return {p.name: _sha(p) for p in sorted(folder.iterdir()) if p.suffix in (".tar", ".jsonl")}


@pytest.fixture(scope="module")
def one_worker(corpus, minilm_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("one") / "shards"
    return out, _run(corpus["text"], out, minilm_dir)


def test_manifest_totals_equal_a_recount(one_worker):
    out, manifest = one_worker
    problems, recount = verify_shards.verify_folder(str(out), progress=False)
    assert problems == []
    totals = manifest["totals"]
    rows = [r for e in manifest["shards"] for r in shard_files.read_rows(str(out / e["file"]))]
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
                 for e in manifest["shards"] for r in shard_files.read_rows(str(out / e["file"])))
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
        "--instances_per_pack_bucket", "300"]), ShardsConfig())
    assert batches.pack_bucket_count(manifest["counters"]["tokens"], config, config) >= 3
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
    parts = reading.read_parts(files, 8 * 1024)
    assert len(parts) > 2 * len(files)
    assert {u.num_parts for u in parts if u.path == str(book)} == {
        min(reading.MAX_TEXT_PARTS, -(-book.stat().st_size // (8 * 1024)))}
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


def test_text_twins_of_parquet_are_skipped(tmp_path):
    files = [str(tmp_path / f"corpus-00000-of-00001.{ext}") for ext in ("parquet", "txt")]
    assert reading.select_inputs(files) == files[:1]
    assert reading.select_inputs(files[1:]) == files[1:]


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


def test_webdataset_reads_the_rows_back(one_worker):
    import webdataset as wds

    out, manifest = one_worker
    urls = [str(out / e["file"]) for e in manifest["shards"]]
    got = []
    for sample in wds.WebDataset(urls, shardshuffle=False).decode():
        got += shard_format.decode_block(sample[shard_format.MEMBER_SUFFIX])
    want = [r for u in urls for r in shard_files.read_rows(u)]
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
        rows = shard_files.read_rows(str(out / f"train-{i:06d}.tar"))
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
            for row in shard_files.read_rows(str(folder / e["file"])):
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


def test_validation_split(corpus, minilm_dir, tmp_path):
    manifest = _run(corpus["text"], tmp_path, minilm_dir, "--validation_fraction", "0.25",
                    "--num_shards", "2")
    assert set(manifest["splits"]) == {"train", "validation"}
    assert [e["file"] for e in manifest["shards"]] == [
        "train-000000.tar", "train-000001.tar", "validation-000000.tar", "validation-000001.tar"]
    # Held out by doc_id ("<file name>:<document number>"), each split with its own index.
    doc_ids = [f"{p.name}:{i}" for p in sorted(corpus["text"].iterdir())
               for i in range(len(p.read_text().strip().split("\n\n")))]
    held_out = sum(reading.split_of(d, 0.25) == "validation" for d in doc_ids)
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
    assert [p.name for p in reading.read_parts(storage.expand_input_files(str(folder)),
                                                    1 << 20)] == [
        "AA/wiki_00", "AB/wiki_00", "top.txt"]
    manifest = _run(folder, tmp_path / "out", minilm_dir, "--validation_fraction", "0.5",
                    "--num_shards", "1", "--mode", mode)
    per_file = len(sample.decode().strip().split("\n\n"))
    doc_ids = [f"{name}:{i}" for name in ("AA/wiki_00", "AB/wiki_00", "top.txt")
               for i in range(per_file)]
    held_out = sum(reading.split_of(d, 0.5) == "validation" for d in doc_ids)
    # With ids by base name the two wiki_00 copies would always share a split.
    assert held_out != sum(reading.split_of(f"{name}:{i}", 0.5) == "validation"
                           for name in ("wiki_00", "wiki_00", "top.txt") for i in range(per_file))
    assert (manifest["counters"]["documents_validation"],
            manifest["counters"]["documents"]) == (held_out, 3 * per_file)


def test_mlm_only(corpus, minilm_dir, tmp_path):
    manifest = _run(corpus["text"], tmp_path, minilm_dir, "--no_next_sentence")
    assert not manifest["nsp"] and manifest["totals"]["num_random_next"] == 0
    assert manifest["counters"].get("random_next_requests", 0) == 0
    for e in manifest["shards"]:
        for row in shard_files.read_rows(str(tmp_path / e["file"])):
            assert row.next_sentence_labels.tolist() == [shard_format.NO_NSP_LABEL]
            assert (row.input_ids == 102).sum() == 1 and not row.segment_ids.any()


def test_bad_options_name_the_flag(corpus, minilm_dir, tmp_path):
    with pytest.raises(ValueError, match="--mode"):
        ShardJobConfig(mode="fast")
    with pytest.raises(ValueError, match="--validation_fraction"):
        _run(corpus["text"], tmp_path, minilm_dir, "--validation_fraction", "1.5")
    with pytest.raises(FileNotFoundError, match="nope"):
        _run(tmp_path / "nope*", tmp_path, minilm_dir)
    assert not os.path.exists(tmp_path / storage.MANIFEST_NAME)


def test_reader_equals_the_reference_reader_on_raw_books(shared_data, minilm_dir):
    """Our batched reader gives read_reference_text's documents, also on CRLF and Latin-1 input."""
    tokenizer = load_tokenizer(str(minilm_dir))
    for name in ("melville-moby_dick.txt", "shakespeare-caesar.txt"):
        path = shared_data / "books" / name
        data = path.read_bytes()[:200_000]
        docs, bad = reading.parse_reference_text(data, str(path))
        ours = reading.tokenize_documents(tokenizer, docs)
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
    wire = batches.WireBatch.of(batch)
    assert wire.segment0_lengths.tolist() == [3, 3, 2] and len(wire.batch.segment_ids) == 0
    assert wire.unpack().segment_ids.tolist() == batch.segment_ids.tolist()
    assert wire.unpack().input_ids.tolist() == batch.input_ids.tolist()
    # Segment ids that do not go 0... then 1... travel as they are.
    odd = packing.InstanceBatch.from_instances(
        [*usual, instance([0, 1, 0], 0)], np.arange(n + 1), np.arange(n + 1), np.zeros(n + 1),
        np.zeros(n + 1))
    kept = batches.WireBatch.of(odd)
    assert kept.segment0_lengths is None and kept.unpack() is odd


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
    (part,) = reading.read_parts(storage.expand_input_files(str(path)), 1024)[:1]
    assert part.num_parts > 1  # the file is read in parts, so the corrupt group is not in part 0
    manifest = _run(folder, tmp_path / "out", minilm_dir, "--read_part_kb", "1",
                    "--num_shards", "1")
    letters = [json.loads(line) for line in
               (tmp_path / "out" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()]
    assert letters and all(entry["record"].startswith("part ") for entry in letters)
    assert all(entry["record"] != f"part 1/{part.num_parts}" for entry in letters)
    assert manifest["counters"]["bad_records"] == len(letters)
    assert 0 < manifest["counters"]["documents"] < 40


def _reference_run(inputs, out, vocab, *extra) -> dict:
    return make_shards.main(["--input", str(inputs), "--vocab", str(vocab), "--output", str(out),
                            "--mode", "reference", "--dupe_factor", "1", "--num_shards", "1",
                            *extra])


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


@pytest.mark.parametrize("fraction", [0.05, 0.25, 0.5])
def test_split_of_holds_out_the_requested_share(fraction):
    """Over 10,000 document ids the held-out share is the fraction within 4 standard deviations
    of a binomial draw; the ids held out at half the fraction are a strict subset of them (one
    threshold on the id's hash)."""
    ids = [f"wiki/AA/wiki_{i // 100:02d}:{i % 100}" for i in range(10_000)]
    held_out = {d for d in ids if reading.split_of(d, fraction) == "validation"}
    sigma = (fraction * (1 - fraction) / len(ids)) ** 0.5
    share = len(held_out) / len(ids)
    assert abs(share - fraction) < 4 * sigma, f"held out {share:.4f} for fraction {fraction}"
    smaller = {d for d in ids if reading.split_of(d, fraction / 2) == "validation"}
    assert smaller < held_out


def test_split_of_without_a_fraction_holds_out_nothing():
    ids = [f"doc:{i}" for i in range(10_000)]
    assert {reading.split_of(d, 0.0) for d in ids} == {"train"}
    assert {reading.split_of(d, 1.0) for d in ids} == {"validation"}


# Measured once: the documents of the `corpus` fixture's text files held out at 0.25 (the
# documents test_validation_split's Beam job must count as validation).
CORPUS_DOCUMENTS, CORPUS_HELD_OUT_025 = 63, 21


def test_validation_share_of_the_test_corpus_is_the_measured_count(corpus):
    doc_ids = [f"{p.name}:{i}" for p in sorted(corpus["text"].iterdir())
               for i in range(len(p.read_text().strip().split("\n\n")))]
    held_out = sum(reading.split_of(d, 0.25) == "validation" for d in doc_ids)
    assert (len(doc_ids), held_out) == (CORPUS_DOCUMENTS, CORPUS_HELD_OUT_025)
