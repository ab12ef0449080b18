"""`bert-finetune` and the task registry: task names, family folders, errors before training."""
from __future__ import annotations

import dataclasses
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
            "(or a family: glue, squad, multiple_choice, ner, user; or all)"
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


# ---------------------------------------------------------------------------------------------
# Settings: flags generated from CommandConfig, --set, --config, errors naming the setting

REQUIRED = ["--model", "m", "--data", "d", "--output", "o", "--tasks", "rte"]


def _settings(argv, base=None):
    from finetune.cli import CommandConfig, command_config

    base = base or CommandConfig(data=None, tasks=())
    return command_config(build_parser().parse_args(argv), base)


def test_every_setting_is_a_flag_with_its_docstring_as_help():
    from finetune.cli import CommandConfig
    from finetune.config import TasksConfig
    from finetune.options import LoopOptions

    parser = build_parser()
    flags = {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}
    fields = [f.name for f in dataclasses.fields(CommandConfig)]
    assert set(fields) <= set(flags) and set(flags) - set(fields) == {"config", "set", "debug"}
    # the flow's finetune section is the same class: its fields are bert-finetune's flags
    assert {f.name for f in dataclasses.fields(TasksConfig)} <= set(fields)
    assert {f.name for f in dataclasses.fields(LoopOptions)} <= \
        {f.name for f in dataclasses.fields(TasksConfig)}
    assert flags["learning_rates"].help == (
        "Peak learning rates tried, the best on dev kept (comma-separated); empty: each task's "
        "family grid (GLUE: 5e-5,4e-5,3e-5,2e-5).")
    text = " ".join(parser.format_help().split())
    assert "--no_packing pad instead of packing: --pack_sequences=false" in text
    assert "--max_eval_examples MAX_EVAL_EXAMPLES Score a fixed random subset" in text


def test_todays_flags_keep_their_meaning():
    """Every flag of the hand-written parser, with the value types it had."""
    from finetune.tasks import get_task

    config = _settings([
        *REQUIRED[:6], "--tasks", "rte, mrpc", "--vocab", "v", "--learning_rates", "2e-5,3e-5",
        "--seeds", "1,2", "--epochs", "2", "--batch_size", "16", "--max_seq_length", "64",
        "--eval_batch_size", "8", "--warmup_proportion", "0.2", "--weight_decay", "0",
        "--adam_epsilon", "1e-8", "--max_grad_norm", "0", "--max_train_examples", "100",
        "--max_eval_examples", "50", "--no_bf16", "--device", "cpu", "--no_packing",
        "--skip_bad_rows", "--no_test", "--no_progress", "--num_threads", "1",
        "--head_init", "normal", "--row_length", "256", "--report_to", "mlflow"])
    assert (config.model, config.vocab, config.data, config.output, config.tasks) == \
        ("m", "v", "d", "o", ("rte", "mrpc"))
    assert (config.pack_sequences, config.predict_test, config.num_threads) == (False, False, 1)
    loop_config = config.for_task(get_task("rte"))
    assert dataclasses.asdict(loop_config) == {
        "seeds": (1, 2), "eval_batch_size": 8, "warmup_proportion": 0.2, "weight_decay": 0.0,
        "adam_epsilon": 1e-8, "max_grad_norm": 0.0, "bf16": False, "max_train_examples": 100,
        "max_eval_examples": 50, "skip_bad_rows": True, "progress": False, "device": "cpu",
        "head_init": "normal", "row_length": 256, "report_to": ("mlflow",), "max_seq_length": 64, "batch_size": 16, "epochs": 2.0, "learning_rates": (2e-5, 3e-5)}
    assert [type(s) for s in loop_config.seeds] == [int, int]
    assert _settings([*REQUIRED, "--bf16"]).bf16 is True
    assert _settings([*REQUIRED, "--pack_sequences=false"]).pack_sequences is False


def test_config_file_then_set_then_flags(tmp_path):
    """A settings file may hold every setting (no flag needed); --set wins over it, a flag over
    both."""
    path = tmp_path / "finetune.yaml"
    path.write_text("model: m\ndata: d\noutput: o\ntasks: [rte, sts-b]\nepochs: 2\n"
                    "learning_rates: [1.0e-4, 5.0e-5]\nseeds: [3]\nbatch_size: 8\n")
    config = _settings(["--config", str(path)])
    assert (config.tasks, config.epochs, config.learning_rates, config.seeds, config.batch_size) \
        == (("rte", "sts-b"), 2.0, (1e-4, 5e-5), (3,), 8)
    config = _settings(["--config", str(path), "--set", "epochs=4", "--set", "seeds=1,2",
                        "--seeds", "5"])
    assert (config.epochs, config.seeds, config.batch_size) == (4.0, (5,), 8)
    json_path = tmp_path / "finetune.json"
    json_path.write_text('{"model": "m", "data": "d", "output": "o", "tasks": "glue", '
                         '"max_train_examples": 64}')
    assert _settings(["--config", str(json_path)]).max_train_examples == 64


def test_set_and_flags_equal_the_flows_finetune_settings():
    """One settings class: the flow's finetune.* and bert-finetune's flags give one loop
    config for a task."""
    from finetune.tasks import get_task
    from flows.config import resolve
    from flows.finetune_runs import loop_config

    given = {"learning_rates": "2e-5,3e-5", "seeds": "1,2", "epochs": "2",
             "warmup_proportion": "0.05", "max_eval_examples": "40", "skip_bad_rows": "true"}
    flow = resolve("tiny", {"finetune": given})
    cli = _settings([*REQUIRED, *[f"--set={k}={v}" for k, v in given.items()], "--no_progress"])
    rte = get_task("rte")
    assert loop_config(flow, rte) == cli.for_task(rte)
    assert cli.for_task(rte).warmup_proportion == 0.05
    with pytest.raises(ValueError) as error:  # where a flow's run goes is the device pool's
        resolve("tiny", {"finetune": {"device": "cpu"}})
    assert str(error.value) == ("setting finetune.device: the flow sets it (each run takes a "
                                "free device of the pool, flows/devices.py)")


@pytest.mark.parametrize(("argv", "message"), [
    (["--epochs", "0"], "--epochs: must be > 0, got 0.0"),
    (["--seeds", "1,1"], "--seeds: must be distinct and non-empty, got (1, 1)"),
    (["--learning_rates", "2e-5,fast"], "--learning_rates='2e-5,fast': 'fast' is not a number"),
    (["--set", "batch_size=0"], "--set batch_size: must be >= 1, got 0"),
    (["--set", "max_seq_length=1024"], "--set max_seq_length: must be in 2..512, got 1024"),
    (["--set", "seeds=1,x"], "--set seeds='1,x': 'x' is not an int"),
    (["--set", "epoch=2"], "--set epoch: unknown field"),
    (["--num_threads", "0"], "--num_threads: must be >= 1, got 0"),
    (["--device", "gpu0"], "--device: must be auto, cpu, cuda or cuda:N, got 'gpu0'"),
    (["--set", "no_packing=true"], ("setting no_packing was renamed: it is now "
                                    "pack_sequences=false (the flag --no_packing still works)")),
])
def test_a_bad_setting_is_a_usage_error_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*REQUIRED, *argv])
    assert exit_.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.startswith(f"bert-finetune: error: {message}"), last


def test_a_bad_config_file_key_and_missing_settings_are_named(tmp_path, capsys):
    path = tmp_path / "ft.yaml"
    path.write_text("no_test: true\n")
    with pytest.raises(SystemExit):
        main([*REQUIRED, "--config", str(path)])
    assert ("bert-finetune: error: setting no_test was renamed: it is now predict_test=false"
            in capsys.readouterr().err)
    path.write_text("batch_size: 0\n")
    with pytest.raises(SystemExit):
        main([*REQUIRED, "--config", str(path)])
    assert (f"bert-finetune: error: {path}: config key batch_size: must be >= 1, got 0"
            in capsys.readouterr().err)
    with pytest.raises(SystemExit):
        main(["--data", "d", "--tasks", "rte"])
    assert capsys.readouterr().err.endswith(
        "bert-finetune: error: the following arguments are required: --model, --output\n")


def test_bert_glue_takes_the_same_settings():
    from finetune.cli import command_config
    from finetune.glue.cli import GlueCommandConfig
    from finetune.glue.cli import build_parser as glue_parser

    args = glue_parser().parse_args([*REQUIRED, "--set", "epochs=1", "--no_packing"])
    config = command_config(args, GlueCommandConfig())
    assert (config.epochs, config.pack_sequences, config.tasks) == (1.0, False, ("rte",))
    assert "GLUE data folder (TSV or Hugging Face datasets layout)." in \
        " ".join(glue_parser().format_help().split())
