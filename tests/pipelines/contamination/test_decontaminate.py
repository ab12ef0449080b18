"""decontaminate: the audited corpus without exactly the planted passages, same schema."""
from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from flows import audit_contamination as audit_cli
from pipelines import decontaminate
from pipelines.corpus.documents import CORPUS_SCHEMA
from pipelines.corpus.sentences import split_passages

FILLER = "A short passage about nothing in particular, written for this test."


def _rows(folder) -> dict[str, dict]:
    rows = [r for path in sorted(folder.glob("corpus-*.parquet"))
            for r in pq.read_table(path).to_pylist()]
    return {r["doc_id"]: r for r in rows}


@pytest.fixture(scope="module")
def clean(planted, tmp_path_factory):
    output = tmp_path_factory.mktemp("clean") / "corpus"
    manifest = decontaminate.main(["--input", str(planted.corpus), "--audit", str(planted.audit),
                                   "--output", str(output)])
    return output, manifest


def test_removes_exactly_the_planted_passages(planted, clean):
    output, manifest = clean
    before, after = _rows(planted.corpus), _rows(output)
    assert set(before) - set(after) == {"planted/b"}  # its only passage was planted
    assert after["planted/a"]["passages"] == [FILLER, FILLER + " Two."]
    assert after["planted/c"]["passages"] == [FILLER + " Three."]
    assert after["planted/d"]["passages"] == [FILLER + " Four."]
    for doc_id in ("planted/a", "planted/c", "planted/d"):
        assert after[doc_id]["sentences"] == split_passages(after[doc_id]["passages"])
    untouched = [d for d in before if not d.startswith("planted/")]
    assert len(untouched) == 7 and all(after[d] == before[d] for d in untouched)
    assert manifest["counts"] == {
        "input_files": 1, "documents_read": 11, "documents": 10, "documents_dropped": 1,
        "passages_read": 159, "passages_removed": 5, "passages": 154,
        "sentences": sum(len(r["sentences"]) for r in after.values()), "bad_records": 0}


def test_output_is_a_corpus_addressed_by_its_inputs(planted, clean):
    output, manifest = clean
    assert pq.read_schema(output / "corpus-00000-of-00001.parquet").equals(CORPUS_SCHEMA)
    assert manifest["stage"] == "decontaminate"
    assert manifest["audit_config_hash"] == planted.manifest["config_hash"]
    assert manifest["input_config_hashes"] == planted.manifest["input_config_hashes"]


def test_the_clean_corpus_audits_clean(planted, clean, tmp_path):
    output, _ = clean
    manifest = audit_cli.main([
        "--input", str(output), "--output", str(tmp_path / "audit"),
        "--eval_data", str(planted.eval_data), "--tasks", "squad1,rte"])
    assert manifest["counts"]["passages_contaminated"] == 0
    assert {t: r["examples_overlapping"] for t, r in manifest["report"].items()} == {
        "squad1": 0, "rte": 0}


def test_an_audit_of_another_corpus_is_refused(planted, clean, tmp_path):
    output, _ = clean
    (audited,) = planted.manifest["input_config_hashes"].values()
    with pytest.raises(ValueError, match=rf"audited the corpus with config_hash {audited}, "
                                         rf"not --input {output}"):
        decontaminate.main(["--input", str(output), "--audit", str(planted.audit),
                            "--output", str(tmp_path / "again")])
