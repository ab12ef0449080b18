"""Every fine-tuning family on the modern encoder: a `modernbert_tiny` checkpoint (exported as
transformers' ModernBertForMaskedLM, with MiniLM's vocabulary) goes through `bert-finetune` for
GLUE, SQuAD v1.1 and v2.0, multiple choice, NER and a task of your own, as a BERT checkpoint
does."""
from __future__ import annotations

import json

import pytest
import torch

from finetune import cli as finetune_cli
from finetune.user import use_task_file
from flows.config import SAMPLE
from model.encoders import PRESETS
from model.heads import BertForPreTraining
from model.hf import export_hf_folder

SHORT = ["--max_train_examples", "16", "--max_eval_examples", "8", "--epochs", "1",
         "--batch_size", "8", "--learning_rates", "1e-4", "--seeds", "1",
         "--max_seq_length", "128", "--no_progress", "--num_threads", "1"]

PAIRS = """\
tasks:
  - name: my-pairs
    type: sequence_classification
    format: tsv
    train: {data}/glue/RTE/train.tsv
    dev: {data}/glue/RTE/dev.tsv
    columns: {{text_a: sentence1, text_b: sentence2, label: label, id: index}}
    labels: [entailment, not_entailment]
    metric: accuracy
"""


@pytest.fixture(scope="module")
def modernbert_dir(minilm_dir, tmp_path_factory):
    """A freshly initialised modernbert_tiny on MiniLM's 30,522-token vocabulary, exported."""
    vocab_size = len((minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    torch.manual_seed(0)
    model = BertForPreTraining(PRESETS["modernbert_tiny"](vocab_size=vocab_size),
                               next_sentence=False)
    folder = tmp_path_factory.mktemp("modernbert_tiny")
    export_hf_folder(model, str(minilm_dir), str(folder))
    assert json.loads((folder / "config.json").read_text())["model_type"] == "modernbert"
    return folder


def test_every_family_fine_tunes_the_modern_encoder(modernbert_dir, shared_data, tmp_path):
    data = tmp_path / "data"  # the bundled GLUE and SQuAD samples, the shared Cosmos QA and WNUT
    (data / "cosmosqa").mkdir(parents=True)
    for name, source in (("glue", SAMPLE / "glue"), ("squad", SAMPLE / "squad"),
                         ("wnut17", shared_data / "wnut17")):
        (data / name).symlink_to(source)
    valid = shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"
    for name in ("train.csv", "valid.csv"):  # the shared rows are Cosmos QA's validation only
        (data / "cosmosqa" / name).symlink_to(valid)
    tasks_file = tmp_path / "tasks.yaml"
    tasks_file.write_text(PAIRS.format(data=data))
    out = tmp_path / "run"
    try:
        code = finetune_cli.main(["--model", str(modernbert_dir), "--data", str(data),
                                  "--tasks", "rte,squad1,squad2,cosmosqa,wnut17,my-pairs",
                                  "--tasks_file", str(tasks_file), "--output", str(out),
                                  *SHORT])
    finally:
        use_task_file(None)
    assert code == 0
    tasks = json.loads((out / "results.json").read_text())["tasks"]
    assert [(t["family"], t["task"].lower()) for t in tasks] == [
        ("glue", "rte"), ("squad", "squad1"), ("squad", "squad2"),
        ("multiple_choice", "cosmosqa"), ("ner", "wnut17"), ("user", "my-pairs")]
    # seeded CPU runs repeat exactly: each score (8 dev examples, so a coarse fraction) and,
    # to float rounding, the last training loss of its one run
    assert {t["task"]: t["score"] for t in tasks} == {
        "RTE": 0.375, "squad1": 1 / 48, "squad2": 0.25, "cosmosqa": 0.125, "wnut17": 0.0125,
        "my-pairs": 0.375}
    assert {t["task"]: run["final_loss"] for t in tasks for run in t["runs"]} == pytest.approx({
        "RTE": 1.3791264, "squad1": 4.2272177, "squad2": 3.4144478, "cosmosqa": 1.3861684,
        "wnut17": 2.9517753, "my-pairs": 1.3791264}, abs=1e-6)
    assert all(task["num_train_examples"] == 16 for task in tasks)


def test_the_flows_export_stage_checks_the_class_the_export_names(modernbert_dir, tmp_path):
    """flows/steps.py `export_hf` loads the folder as the class its config.json names
    (ModernBertForMaskedLM here, not BERT's pre-training class on another model's config)."""
    import transformers

    from flows import steps
    from flows.config import resolve
    from flows.stages import StageResult

    cfg = resolve("modernbert_tiny", {"output": str(tmp_path / "run")})
    run = StageResult("pretrain", str(tmp_path / "pretrain"), "0" * 16, False, 0.0,
                      {"hf_dir": str(modernbert_dir)})
    result = steps.export_hf(cfg, run)
    peer = transformers.ModernBertForMaskedLM.from_pretrained(str(modernbert_dir))
    assert result.path == str(modernbert_dir)
    assert result.manifest["parameters"] == sum(p.numel() for p in peer.parameters())
