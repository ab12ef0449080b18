"""build_corpus in waves (pipelines/waves.py): scattered by content, deduplicated per content
wave, scattered by doc_id, finished per id wave: the same bytes as one pipeline."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from common import storage
from pipelines import build_corpus, extract_books, extract_wikipedia, jobs, parquet_io, waves
from pipelines.corpus.documents import DOCUMENT_SCHEMA

SAMPLE = Path(__file__).resolve().parents[3] / "data" / "sample"


def _doc(doc_id: str, passages: list[str], source_file: str) -> dict:
    return {"doc_id": doc_id, "source": doc_id.split("/")[0], "source_file": source_file,
            "title": "T", "passages": passages}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> str:
    """The bundled Wikipedia and books samples, plus a folder with a duplicate in other case
    and spacing, a doc_id used for two texts, a document without sentences and a file that is
    not Parquet."""
    root = tmp_path_factory.mktemp("waves")
    extract_wikipedia.main(["--input", str(SAMPLE / "wiki"), "--output", str(root / "wiki")])
    extract_books.main(["--input", str(SAMPLE / "books"), "--output", str(root / "books")])
    hand = root / "hand"
    docs = [_doc("books/hand-copy", ["HELLO there.  Mr. Smith   left."], "copy.txt"),
            _doc("books/hand-a", ["Hello there. Mr. Smith left."], "a.txt"),
            _doc("books/austen-emma", ["Not the novel at all. A different text."], "z/emma.txt"),
            _doc("books/blank", ["   "], "blank.txt")]
    parquet_io.write_shard(str(hand), "documents", 0, 1, docs, DOCUMENT_SCHEMA)
    (hand / "documents-broken.parquet").write_bytes(b"PAR1 this is not parquet")
    storage.write_manifest(str(hand), {"stage": "hand-made", "config_hash": "0123456789abcdef"})
    return ",".join(str(root / name) for name in ("wiki", "books", "hand"))


def _outputs(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def test_waves_give_the_bytes_of_one_pipeline(inputs, tmp_path):
    one = build_corpus.main(["--input", inputs, "--output", str(tmp_path / "one"),
                             "--text_output", "--num_shards", "5", "--wave_mb", "0"])
    many = build_corpus.main(["--input", inputs, "--output", str(tmp_path / "many"),
                              "--text_output", "--num_shards", "5", "--wave_mb", "0.2"])
    assert (one["waves"], many["waves"]) == (1, 5)
    assert _outputs(tmp_path / "many") == _outputs(tmp_path / "one")
    assert many["counts"] == one["counts"]
    assert (one["counts"]["duplicates_removed"], one["counts"]["doc_id_conflicts"],
            one["counts"]["documents_without_sentences"], one["counts"]["bad_records"]) == (1, 1, 1, 3)
    assert many["ledger"] == one["ledger"]
    assert many["outputs"] == one["outputs"]
    assert not (tmp_path / "many" / waves.SCRATCH).exists()
    letters = [json.loads(line)["record"] for line in
               (tmp_path / "many" / "dead_letter" / "dead_letter-00000-of-00001.jsonl")
               .read_text().splitlines()]
    assert sorted(letters) == ["books/austen-emma", "books/blank", "rows after 0"]


def test_waves_on_two_workers_and_a_killed_runs_scratch(inputs, tmp_path):
    first = build_corpus.main(["--input", inputs, "--output", str(tmp_path / "a"),
                               "--wave_mb", "0.2"])
    stale = tmp_path / "b" / waves.SCRATCH / "ids" / "p00000" / "left.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text(json.dumps(_doc("books/ghost", ["A ghost."], "ghost.txt")) + "\n")
    second = build_corpus.main(["--input", inputs, "--output", str(tmp_path / "b"),
                                "--wave_mb", "0.2", "--direct_num_workers=2",
                                "--direct_running_mode=multi_processing"])
    assert first["num_shards"] == first["waves"] == 5  # automatic: a shard per wave
    assert _outputs(tmp_path / "b") == _outputs(tmp_path / "a")
    assert second["counts"] == first["counts"]


def test_fewer_shards_than_waves_is_refused(inputs, tmp_path):
    with pytest.raises(ValueError, match=r"--num_shards 2 is fewer than the 5 waves of "
                                         r"--wave_mb 0.2"):
        build_corpus.main(["--input", inputs, "--output", str(tmp_path / "x"),
                           "--num_shards", "2", "--wave_mb", "0.2"])


def test_unset_wave_size_follows_the_runner():
    config = build_corpus.BuildCorpusConfig(input="i", output="o")
    local = build_corpus.resolve_wave_mb(config, jobs.beam_pipeline_options([]))
    dataflow = build_corpus.resolve_wave_mb(config, jobs.beam_pipeline_options(
        ["--runner=DataflowRunner"]))
    assert (local.wave_mb, dataflow.wave_mb) == (build_corpus.LOCAL_WAVE_MB, 0.0)
    with pytest.raises(ValueError, match="needs a local output folder"):
        waves.scratch_folder("gs://my-bucket/corpus")


def test_partitions_are_the_corpus_shards():
    """An id wave writes exactly one corpus shard: its partition is the shard's hash."""
    ids = [f"books/{i}" for i in range(200)]
    assert [waves.partition_of(i, 7) for i in ids] == [parquet_io.stable_shard(i, 7) for i in ids]
    assert waves.wave_count(10 * 2 ** 20, 4) == 3 and waves.wave_count(10, 0) == 1
    assert os.path.basename(waves.scratch_folder("/tmp/x")) == waves.SCRATCH


def _rows(folder: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq
    return sorted((r["doc_id"], "\n".join(r["sentences"])) for p in
                  sorted(folder.glob("corpus-*.parquet"))
                  for r in pq.read_table(p, columns=["doc_id", "sentences"]).to_pylist())


def test_weighted_sources_in_waves_give_the_rows_of_one_pipeline(inputs, tmp_path):
    """The Wikipedia sample's pages as two sources, one of weight 2 (each document and its
    `#r1` copy) and one of 0.5: waves write every copy once, in its original's shard, and
    give the rows of one pipeline."""
    import pyarrow.parquet as pq
    pages = [r for p in sorted(Path(inputs.split(",")[0]).glob("documents-*.parquet"))
             for r in pq.read_table(p).to_pylist()]
    for i, row in enumerate(pages):
        row["source"] = ("twice", "half")[i % 2]
    folder = tmp_path / "pages"
    parquet_io.write_shard(str(folder), "documents", 0, 1, pages, DOCUMENT_SCHEMA)
    storage.write_manifest(str(folder), {"stage": "hand-made", "config_hash": "0"})
    sources = json.dumps([{"name": "twice", "kind": "text", "path": "x", "weight": 2},
                          {"name": "half", "kind": "text", "path": "y", "weight": 0.5}])
    common = ["--input", str(folder), "--sources", sources, "--num_shards", "2"]
    one = build_corpus.main([*common, "--output", str(tmp_path / "one"), "--wave_mb", "0"])
    many = build_corpus.main([*common, "--output", str(tmp_path / "many"), "--wave_mb", "0.04"])
    assert (one["waves"], many["waves"]) == (1, 2)
    rows = _rows(tmp_path / "one")
    assert _rows(tmp_path / "many") == rows
    assert _outputs(tmp_path / "many") == _outputs(tmp_path / "one")
    assert many["counts"] == one["counts"] and many["ledger"] == one["ledger"]
    twice, half = one["ledger"]["twice"], one["ledger"]["half"]
    assert (twice["documents_in"], twice["documents_out"], twice["repeats_added"]) == (4, 8, 4)
    assert (half["documents_in"], half["documents_out"], half["sampled_out"]) == (3, 2, 1)
    assert len(rows) == one["counts"]["documents"] == 10
    copies = [doc_id for doc_id, _ in rows if doc_id.endswith("#r1")]
    assert len(copies) == 4
    assert all(dict(rows)[c] == dict(rows)[c.removesuffix("#r1")] for c in copies)
