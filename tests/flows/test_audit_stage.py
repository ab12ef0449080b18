"""The flow's corpus stages for an honest evaluation: near-duplicates removed, the contamination
audit of the evaluation sets the flow scores (tasks without files left out), and the corpus
decontaminated before the vocabulary (flows/steps.py, without Prefect)."""
from __future__ import annotations

import json
from pathlib import Path

from flows import report as reporting
from flows import steps
from flows.config import resolve

SAMPLE = Path(__file__).resolve().parents[2] / "data" / "sample"


def test_audit_and_decontamination_stages(tmp_path):
    squad = json.loads((SAMPLE / "squad" / "dev-v1.1.json").read_text())
    context = squad["data"][0]["paragraphs"][0]["context"]
    books = (SAMPLE / "books" / "austen-emma.txt").read_text(encoding="utf-8", errors="replace")
    paragraph = next(" ".join(p.split()) for p in books.split("\n\n") if len(p.split()) > 120)
    records = [{"id": "planted", "text": f"{paragraph}\n\n{context}"},
               {"id": "original", "text": paragraph},
               {"id": "copy", "text": paragraph.replace(" the ", " a ", 1)}]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = resolve("tiny", {"output": str(tmp_path / "run"), "data": {
        "wikipedia": "", "books": "", "decontaminate": True,
        "near_duplicates": {"threshold": 0.8},
        "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "in"),
                     "id_field": "id", "split": "file"}]},
        "finetune": {"tasks": ["squad1", "rte", "wnli"]}}, data_only=True)
    assert steps.audited_tasks(cfg) == ("squad1", "rte")  # the sample has no WNLI
    own = [steps.extract_documents(cfg, s) for s in cfg.data.all_sources()]
    corpus = steps.build_corpus(cfg, own)
    assert corpus.manifest["counts"]["near_duplicates_removed"] == 1
    audit = steps.audit_contamination(cfg, corpus)
    report = json.loads((Path(audit.path) / "report.json").read_text())
    assert report["corpus"]["passages_contaminated"] == 1
    result = reporting.report(cfg, [*own, corpus, audit], None, "report-data.md")
    text = (tmp_path / "run" / "report-data.md").read_text()
    assert "## Contamination audit (13-grams)" in text
    squad_dev = report["tasks"]["squad1"]["splits"]["dev"]
    assert squad_dev["examples_overlapping"] == 5  # every question of the planted context
    assert (f"| squad1 | dev | {squad_dev['examples']} | 5 | "
            f"{5 / squad_dev['examples']:.2%} |") in text
    assert "| rte | dev | 100 | 0 | 0.00% | 0.00% |" in text
    assert result["audit"]["corpus"]["passages_contaminated"] == 1
    clean = steps.decontaminate(cfg, corpus, audit)
    assert clean.stage == "corpus-clean"
    again = steps.audit_contamination(cfg, clean)
    assert json.loads((Path(again.path) / "report.json").read_text())[
        "corpus"]["passages_contaminated"] == 0


USER_TASKS = """\
tasks:
  - name: my-mrpc
    type: sequence_classification
    format: tsv
    train: {sample}/glue/MRPC/train.tsv
    dev: {sample}/glue/MRPC/dev.tsv
    test: {sample}/glue/MRPC/test.tsv
    columns: {{text_a: "#1 String", text_b: "#2 String", label: Quality, id: "#1 ID"}}
    labels: ["0", "1"]
    metric: accuracy
  - name: my-ner
    type: token_classification
    format: conll
    train: {shared}/conll2003/train.txt
    dev: {shared}/conll2003/valid.txt
    test: {shared}/conll2003/test.txt
    num_columns: 4
    labels: [O, B-PER, I-PER, B-LOC, I-LOC, B-ORG, I-ORG, B-MISC, I-MISC]
    metric: seqeval_f1
  - name: my-qa
    type: extractive_qa
    format: squad
    train: {sample}/squad/train-v2.0.json
    dev: {sample}/squad/dev-v2.0.json
    version_2: true
    metric: squad
"""


def _conll_sentence(path: Path, min_words: int) -> tuple[int, str]:
    """(first line, words joined) of the first sentence of `min_words` words or more."""
    words: list[str] = []
    for number, line in enumerate([*path.read_text().splitlines(), ""], start=1):
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
            continue
        if len(words) >= min_words:
            return number - len(words), " ".join(words)
        words = []
    raise AssertionError(f"{path}: no sentence of {min_words} words")


def test_the_audit_reads_a_task_files_evaluation_sets(tmp_path, shared_data):
    """finetune.tasks_file's tasks are audited as the built-in ones: each planted dev example
    (a classification sentence, a CoNLL sentence, a QA context) is found, and nothing else."""
    from finetune.user import use_task_file

    mrpc = (SAMPLE / "glue" / "MRPC" / "dev.tsv").read_text(encoding="utf-8-sig").splitlines()
    mrpc_row = dict(zip(mrpc[0].split("\t"), mrpc[3].split("\t")))
    ner_line, ner_sentence = _conll_sentence(shared_data / "conll2003" / "valid.txt", 25)
    squad = json.loads((SAMPLE / "squad" / "dev-v2.0.json").read_text())
    paragraph = squad["data"][0]["paragraphs"][2]
    records = [{"id": "mrpc", "text": f"As reported: {mrpc_row['#1 String']}"},
               {"id": "ner", "text": f"A wire story. {ner_sentence}"},
               {"id": "qa", "text": paragraph["context"]}]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "web.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "tasks.yaml").write_text(USER_TASKS.format(sample=SAMPLE, shared=shared_data))
    try:
        cfg = resolve("tiny", {"output": str(tmp_path / "run"), "data": {
            "wikipedia": "", "books": "",
            "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "in"),
                         "id_field": "id", "split": "file"}]},
            "finetune": {"tasks": ["user", "rte"], "tasks_file": str(tmp_path / "tasks.yaml")}},
            data_only=True)
        assert steps.audited_tasks(cfg) == ("my-mrpc", "my-ner", "my-qa", "rte")
        corpus = steps.build_corpus(cfg, [steps.extract_documents(cfg, s)
                                          for s in cfg.data.all_sources()])
        audit = steps.audit_contamination(cfg, corpus)
    finally:
        use_task_file(None)
    overlaps = [json.loads(line) for line in (Path(audit.path) / "overlaps" /
                                              "overlaps-00000-of-00001.jsonl").read_text().splitlines()]
    assert {(r["task"], r["split"], r["example_id"], r["doc_id"]) for r in overlaps} == {
        ("my-mrpc", "dev", mrpc_row["#1 ID"], "web/mrpc"),
        ("my-ner", "dev", f"line {ner_line}", "web/ner"),
        *(("my-qa", "dev", qa["id"], "web/qa") for qa in paragraph["qas"])}
    report = json.loads((Path(audit.path) / "report.json").read_text())["tasks"]
    assert {task: {split: (v["examples"], v["examples_overlapping"])
                   for split, v in entry["splits"].items()} for task, entry in report.items()} == {
        "my-mrpc": {"dev": (100, 1), "test": (100, 0)},
        "my-ner": {"dev": (3250, 1), "test": (3453, 0)},
        "my-qa": {"dev": (115, len(paragraph["qas"]))},
        "rte": {"dev": (100, 0), "test": (100, 0)}}
    assert sorted(audit.manifest["eval_files"]) == sorted(
        [str(SAMPLE / "glue" / "MRPC" / f"{s}.tsv") for s in ("dev", "test")] +
        [str(shared_data / "conll2003" / f"{s}.txt") for s in ("valid", "test")] +
        [str(SAMPLE / "squad" / "dev-v2.0.json")] +
        [str(SAMPLE / "glue" / "RTE" / f"{s}.tsv") for s in ("dev", "test")])
