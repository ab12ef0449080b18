"""`bert-finetune` and the task registry: task names, family folders, errors before training."""
from __future__ import annotations

import json

import pytest

from finetune import tasks
from finetune.cli import build_parser, config_from_args, main
from finetune.glue import FAMILY, TASKS


def test_registry_maps_tasks_to_families():
    assert tasks.FAMILIES["glue"] == "finetune.glue"
    entry = tasks.get_task("SST2")  # names compare without case, dashes or underscores
    assert (entry.task, entry.family, entry.data_folder) == ("sst-2", FAMILY, "glue")
    assert [e.task for e in tasks.parse_tasks("rte, sts-b")] == ["rte", "sts-b"]
    assert [e.task for e in tasks.parse_tasks("glue")] == list(TASKS)
    assert len(TASKS) == 9 and tasks.parse_tasks("all")[0].task == "cola"
    with pytest.raises(ValueError, match="a task is listed twice"):
        tasks.parse_tasks("rte,glue")
    with pytest.raises(ValueError, match="--tasks: no task given"):
        tasks.parse_tasks(" , ")


def test_unknown_task_is_named_with_the_known_ones(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--model", str(tmp_path), "--data", str(tmp_path), "--output", str(tmp_path / "o"),
              "--tasks", "rte,squad9"])
    assert exit_.value.code == 2
    assert ("bert-finetune: error: --tasks: unknown task 'squad9'; known: cola, sst-2, mrpc, "
            "sts-b, qqp, mnli, qnli, rte, wnli, squad1, squad2, swag, cosmosqa, conll2003, wnut17 "
            "(or a family: glue, squad, multiple_choice, ner; or all)"
            in capsys.readouterr().err)


def test_missing_family_folder_is_named_before_any_training(minilm_dir, tmp_path, capsys):
    """No glue/ under --data: one line naming the folder and the tasks that need it; nothing
    is read, trained or written."""
    (tmp_path / "data" / "squad").mkdir(parents=True)
    code = main(["--model", str(minilm_dir), "--data", str(tmp_path / "data"),
                 "--output", str(tmp_path / "out"), "--tasks", "rte,mrpc", "--no_progress"])
    assert code == 2
    assert capsys.readouterr().err == (
        f"bert-finetune: error: --data {tmp_path}/data: no glue/ folder (for rte, mrpc)\n")
    assert not (tmp_path / "out").exists()


def test_missing_task_files_are_listed_before_any_training(minilm_dir, tmp_path, capsys):
    from flows.config import SAMPLE

    data = tmp_path / "data"
    data.mkdir()
    (data / "glue").symlink_to(SAMPLE / "glue")
    code = main(["--model", str(minilm_dir), "--data", str(data), "--output", str(tmp_path / "o"),
                 "--tasks", "rte,qnli", "--no_progress", "--no_test"])
    assert code == 2
    glue = data / "glue"
    assert capsys.readouterr().err.splitlines() == [
        f"bert-finetune: error: --data {data}: 2 problem(s) found before any fine-tuning:",
        (f"  QNLI train: neither {glue}/QNLI/train.tsv nor a Hugging Face qnli/train.* file "
         f"under {glue}"),
        (f"  QNLI dev: neither {glue}/QNLI/dev.tsv nor a Hugging Face qnli/validation.* file "
         f"under {glue}")]


def test_recipe_is_the_familys_and_flags_override():
    base = ["--model", "m", "--data", "d", "--output", "o", "--tasks", "rte"]
    recipe = FAMILY.recipe("rte")
    cfg = config_from_args(build_parser().parse_args(base), recipe)
    assert (cfg.max_seq_length, cfg.batch_size, cfg.epochs, cfg.learning_rates) == \
        (128, 32, 3.0, (5e-5, 4e-5, 3e-5, 2e-5))
    assert cfg.bf16 is None  # on a GPU yes, on the CPU no
    cfg = config_from_args(build_parser().parse_args(
        [*base, "--epochs", "2", "--learning_rates", "1e-4", "--no_bf16"]), recipe)
    assert (cfg.epochs, cfg.learning_rates, cfg.bf16, cfg.batch_size) == (2.0, (1e-4,), False, 32)


def test_bert_finetune_runs_glue_from_the_data_folder(minilm_dir, tmp_path):
    """End to end on 8 sample RTE rows: summary.md, results.json with the GLUE score, the
    leaderboard zip, config.json."""
    from flows.config import SAMPLE

    glue = tmp_path / "data" / "glue" / "RTE"
    glue.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv", "test.tsv"):
        lines = (SAMPLE / "glue" / "RTE" / name).read_text(encoding="utf-8").splitlines(True)
        (glue / name).write_text("".join(lines[:9]), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["--model", str(minilm_dir), "--data", str(tmp_path / "data"), "--output",
                 str(out), "--tasks", "rte", "--learning_rates", "5e-5", "--seeds", "1",
                 "--epochs", "1", "--batch_size", "8", "--no_progress"]) == 0
    summary = json.loads((out / "results.json").read_text())
    (task,) = summary["tasks"]
    assert (task["task"], task["family"], [r["steps"] for r in task["runs"]]) == ("RTE", "glue", [1])
    assert summary["glue_score"] == task["score"]
    assert summary["task_configs"]["RTE"]["batch_size"] == 8
    assert "| RTE | accuracy" in (out / "summary.md").read_text()
    assert "| GLUE score |" in (out / "summary.md").read_text()
    assert (out / "submission.zip").stat().st_size > 0
    config = json.loads((out / "config.json").read_text())
    assert config["families"] == {"glue": {"pack_sequences": True, "predict_test": True}}
