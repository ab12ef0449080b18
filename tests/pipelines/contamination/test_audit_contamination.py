"""audit_contamination on a Wikipedia corpus with planted SQuAD dev contexts and an RTE dev
sentence: every planted example is found, and nothing else."""
from __future__ import annotations

import json
import shutil

import pytest

from flows import audit_contamination as audit_cli
from pipelines import jobs

from .conftest import RTE_GUID

SQUAD_DEV_QUESTIONS = 10570
RTE_EXAMPLES = {"dev": 277, "test": 3000}


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_every_planted_example_is_found_and_nothing_else(planted):
    overlaps = _lines(planted.audit / "overlaps" / "overlaps-00000-of-00001.jsonl")
    squad = {r["example_id"] for r in overlaps if r["task"] == "squad1"}
    rte = {(r["split"], r["example_id"]) for r in overlaps if r["task"] == "rte"}
    assert squad == planted.squad_qids
    assert rte == {("dev", RTE_GUID)}
    assert {(r["doc_id"], r["passage"]) for r in overlaps} == planted.passages
    assert len(overlaps) == len(planted.squad_qids) + 1  # each example in one passage
    rte_line = next(r for r in overlaps if r["task"] == "rte")
    assert rte_line["ngram"] == "steve jobs was attacked by sculley and other apple executives " \
                                "for not delivering"


def test_contaminated_passages_are_the_planted_ones(planted):
    listed = _lines(planted.audit / "contaminated_passages.jsonl")
    assert {(r["doc_id"], r["passage"]) for r in listed} == planted.passages
    assert len(listed) == len(planted.passages) == 5


def test_report_counts_examples_and_ngrams_per_task_and_split(planted):
    report = json.loads((planted.audit / "report.json").read_text())
    assert report["ngram"] == 13
    assert report["corpus"] == {"documents": 11, "passages": 150 + 9,
                                "passages_contaminated": 5}
    squad = report["tasks"]["squad1"]
    assert squad["examples"] == SQUAD_DEV_QUESTIONS
    assert squad["examples_overlapping"] == len(planted.squad_qids) == 26
    assert squad["examples_overlapping_share"] == round(26 / SQUAD_DEV_QUESTIONS, 6)
    assert list(squad["splits"]) == ["dev"]
    rte = report["tasks"]["rte"]
    assert {s: v["examples"] for s, v in rte["splits"].items()} == RTE_EXAMPLES
    assert rte["examples_overlapping"] == rte["splits"]["dev"]["examples_overlapping"] == 1
    assert rte["splits"]["test"]["examples_overlapping"] == 0
    # The planted sentence has 26 words: 14 13-grams, all shared (none of them is in the test
    # split's examples).
    assert rte["ngrams_overlapping"] == rte["splits"]["dev"]["ngrams_overlapping"] == 14
    assert rte["ngrams_overlapping_share"] == round(14 / rte["ngrams"], 6)
    assert planted.manifest["report"] == report["tasks"]


def test_manifest_addresses_the_audit_by_its_content(planted):
    manifest = planted.manifest
    assert manifest["stage"] == "audit_contamination"
    assert manifest["config"]["ngram"] == 13 and manifest["config"]["tasks"] == ["squad1", "rte"]
    assert len(manifest["eval_files"]) == 3  # squad dev, RTE dev and test
    assert manifest["counts"]["passages_contaminated"] == 5
    names = {o["path"] for o in manifest["outputs"]}
    assert {"report.json", "contaminated_passages.jsonl", "matched_ngrams.txt",
            "index/eval_ngrams.npz", "overlaps/overlaps-00000-of-00001.jsonl"} <= names


def test_a_larger_ngram_finds_fewer(planted, tmp_path):
    # 27 words: longer than the planted RTE sentence (26), shorter than every planted context.
    manifest = audit_cli.main([
        "--input", str(planted.corpus), "--output", str(tmp_path / "audit"),
        "--eval_data", str(planted.eval_data), "--tasks", "rte,squad1", "--ngram", "27"])
    assert manifest["report"]["rte"]["examples_overlapping"] == 0
    assert manifest["report"]["squad1"]["examples_overlapping"] == len(planted.squad_qids)
    assert manifest["config_hash"] != planted.manifest["config_hash"]


def test_a_missing_task_folder_is_one_line(planted, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no swag/ folder \(for swag\)"):
        audit_cli.main(["--input", str(planted.corpus), "--output", str(tmp_path),
                        "--eval_data", str(planted.eval_data), "--tasks", "swag"])


def test_an_unreadable_corpus_file_is_a_dead_letter(planted, tmp_path):
    corpus = tmp_path / "corpus"
    shutil.copytree(planted.corpus, corpus)
    (corpus / "corpus-00001-of-00002.parquet").write_bytes(b"not parquet at all")
    manifest = audit_cli.main([
        "--input", str(corpus), "--output", str(tmp_path / "audit"),
        "--eval_data", str(planted.eval_data), "--tasks", "rte"])
    assert manifest["counts"]["bad_records"] == 1
    assert manifest["counts"]["passages_contaminated"] == 1  # the RTE sentence, still found
    (dead,) = _lines(tmp_path / "audit" / "dead_letter" / "dead_letter-00000-of-00001.jsonl")
    assert dead["file"].endswith("corpus-00001-of-00002.parquet")
    assert dead["reason"].startswith("unreadable Parquet")


def test_command_line_errors_are_one_line(planted, tmp_path, capsys):
    args = ["--input", str(planted.corpus), "--output", str(tmp_path / "audit")]
    assert jobs.main("audit_contamination", audit_cli.main, args) == 2
    assert capsys.readouterr().err == ("audit_contamination: error: --eval_data is required: "
                                       "the folder of the evaluation sets (the flow's "
                                       "finetune.data)\n")
    assert jobs.main("audit_contamination", audit_cli.main,
                     [*args, "--eval_data", str(planted.eval_data), "--ngram", "0"]) == 2
    assert capsys.readouterr().err == "audit_contamination: error: --ngram: must be >= 1, got 0\n"


TASK_FILE = """\
tasks:
  - name: my-rte
    type: sequence_classification
    format: tsv
    train: {glue}/train.tsv
    dev: {eval}/dev.tsv
    test: {eval}/test.tsv
    columns: {{text_a: sentence1, text_b: sentence2, label: label, id: index}}
    labels: [entailment, not_entailment]
    metric: accuracy
"""


def test_the_command_line_audits_a_task_files_tasks(planted, shared_data, tmp_path):
    """`--tasks_file`: a task file's task is read by its family and audited beside a built-in
    one, its texts hashed (it may read some columns only)."""
    (tmp_path / "tasks.yaml").write_text(TASK_FILE.format(
        glue=shared_data / "glue" / "RTE", eval=planted.eval_data / "glue" / "RTE"))
    manifest = audit_cli.main([
        "--input", str(planted.corpus), "--output", str(tmp_path / "audit"),
        "--eval_data", str(planted.eval_data), "--tasks_file", str(tmp_path / "tasks.yaml"),
        "--tasks", "my-rte,rte"])
    overlaps = _lines(tmp_path / "audit" / "overlaps" / "overlaps-00000-of-00001.jsonl")
    assert sorted((o["task"], o["split"], o["example_id"], o["doc_id"]) for o in overlaps) == [
        ("my-rte", "dev", RTE_GUID, "planted/d"), ("rte", "dev", RTE_GUID, "planted/d")]
    assert manifest["config"]["tasks"] == ["rte"] and manifest["handed_tasks"] == ["my-rte"]
    assert manifest["report"]["my-rte"] == manifest["report"]["rte"]
