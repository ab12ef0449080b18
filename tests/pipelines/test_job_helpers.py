"""What the Beam jobs share: `waves.run_to_shards` (extract -> shards + dead letters),
`jobs.stage_manifest` / `jobs.publish_manifest`, `parquet_io.check_rows_written`, the output
settings `waves.ShardedOutput` and `build_corpus.CorpusOutput`, and `corpus.build.KeepFirstFn`."""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam import pvalue

from common.errors import BadRecord
from common.manifest import Manifest, ShardRecord
from common.settings import SettingError
from pipelines import build_corpus, jobs, parquet_io, waves
from pipelines.corpus import build as corpus_build
from pipelines.corpus.documents import DOCUMENT_SCHEMA


def open_text(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def _doc(doc_id: str, source_file: str = "f", passages: tuple[str, ...] = ("x",)) -> dict:
    return {"doc_id": doc_id, "source": "s", "source_file": source_file, "title": doc_id,
            "passages": list(passages)}


class NumbersFn(beam.DoFn):
    """n -> a document, or a dead letter for an odd n."""

    def process(self, n: int):
        if n % 2:
            yield pvalue.TaggedOutput("dead_letter", BadRecord("in", f"n{n}", "odd").to_json())
        else:
            yield _doc(f"d{n}")


@pytest.mark.parametrize("plan", [(1, 2), (2, 2)], ids=["one pipeline", "waves"])
def test_run_to_shards_writes_documents_and_dead_letters(tmp_path, plan):
    output = str(tmp_path / "out")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "documents-00000-of-00009.parquet").write_bytes(b"an earlier run")
    pipeline = waves.run_to_shards(jobs.beam_pipeline_options([]), list(range(6)),
                                   ("Numbers", NumbersFn()), output, plan,
                                   "documents", DOCUMENT_SCHEMA)
    assert pipeline.result is not None
    shards = parquet_io.finish_shards(output, "documents", 2, DOCUMENT_SCHEMA)
    rows = sorted(r["doc_id"] for p in shards for r in parquet_io.parquet_rows(p))
    assert rows == ["d0", "d2", "d4"]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.parquet")) == [
        "documents-00000-of-00002.parquet", "documents-00001-of-00002.parquet"]
    lines = open_text(parquet_io.dead_letter_path(output)).splitlines()
    dead = [json.loads(line)["record"] for line in lines]
    assert dead == ["n1", "n3", "n5"]
    assert not (tmp_path / "out" / waves.SCRATCH).exists()


def test_stage_manifest_names_the_job_version_config_hash_and_files():
    @dataclass(frozen=True)
    class Config:
        input: str
        output: str

    config = Config("in", "out")
    manifest = jobs.stage_manifest("job", config, "abc", 3, counts={"documents": 1},
                                   inputs=[{"path": "in/a", "bytes": 4}],
                                   outputs=[ShardRecord("a.parquet", "00" * 32)], num_shards=1)
    assert manifest.to_json() == {
        "stage": "job", "output_version": 3, "config": {"input": "in", "output": "out"},
        "config_hash": "abc", "counts": {"documents": 1},
        "inputs": [{"path": "in/a", "bytes": 4}],
        "outputs": [{"path": "a.parquet", "sha256": "00" * 32}], "num_shards": 1}
    bare = jobs.stage_manifest("job", config, "abc", counts={}, inputs=None, outputs=[])
    assert list(bare.to_json()) == ["stage", "config", "config_hash", "counts", "outputs"]


def test_publish_manifest_writes_it_last_and_warns_of_dead_letters(tmp_path, caplog):
    output = str(tmp_path)
    manifest = Manifest(stage="job", config_hash="abc",
                        config={"output": output, "tasks": ("a", "b")},
                        counts={"bad_records": 2})
    with caplog.at_level(logging.INFO, logger="test_jobs"):
        read = jobs.publish_manifest(logging.getLogger("test_jobs"), "job", manifest,
                                     {"documents": 5}, "dead.jsonl")
    assert read == {"stage": "job", "config_hash": "abc",
                    "config": {"output": output, "tasks": ["a", "b"]},
                    "counts": {"bad_records": 2}}
    assert json.loads((tmp_path / "manifest.json").read_text()) == read
    assert [r.getMessage() for r in caplog.records] == [
        "job: {'documents': 5}", "job: 2 bad record(s) set aside in dead.jsonl"]


def test_check_rows_written_compares_rows_with_the_count(tmp_path):
    output = str(tmp_path)
    parquet_io.write_shard(output, "corpus", 0, 1, [_doc("a"), _doc("b")], DOCUMENT_SCHEMA)
    shards = [parquet_io.shard_path(output, "corpus", 0, 1), str(tmp_path / "corpus.txt")]
    parquet_io.check_rows_written(output, shards, 2)
    with pytest.raises(RuntimeError) as e:
        parquet_io.check_rows_written(output, shards, 3)
    assert str(e.value) == f"{output}: 2 rows written but 3 documents counted"


@pytest.mark.parametrize(("make", "message"), [
    (lambda: waves.ShardedOutput(num_shards=-1), "must be >= 0 (0 = automatic), got -1"),
    (lambda: waves.ShardedOutput(wave_mb=-0.5), "must be >= 0 (0 = one pipeline), got -0.5"),
    (lambda: build_corpus.CorpusOutput(num_shards=-2), "must be >= 0 (0 = automatic), got -2"),
    (lambda: build_corpus.BuildCorpusConfig(input="i", output="o", num_shards=-2),
     "must be >= 0 (0 = automatic), got -2"),
])
def test_output_settings_refuse_negative_values(make, message):
    with pytest.raises(SettingError) as e:
        make()
    assert e.value.message == message


class FirstOfKeyFn(corpus_build.KeepFirstFn):
    COUNTERS = ("duplicates_removed",)

    def set_aside(self, key: str, other: dict, kept: dict) -> pvalue.TaggedOutput:
        return pvalue.TaggedOutput("others", f"{key}: {other['doc_id']} for {kept['doc_id']}")


def test_keep_first_fn_keeps_the_smallest_and_sets_the_others_aside():
    out = list(FirstOfKeyFn().process(("k", [_doc("b"), _doc("c"), _doc("a")])))
    assert [(o.tag, o.value) for o in out[:-1]] == [("others", "k: b for a"),
                                                      ("others", "k: c for a")]
    assert out[-1]["doc_id"] == "a"
    conflicts = list(corpus_build.UniqueIdFn().process(
        ("x", [_doc("x", "two.parquet", ("B",)), _doc("x", "one.parquet", ("A",))])))
    assert json.loads(conflicts[0].value) == {
        "file": "two.parquet", "record": "x",
        "reason": "doc_id also used by one.parquet for a different text (kept that one)"}
    assert conflicts[1]["source_file"] == "one.parquet"
