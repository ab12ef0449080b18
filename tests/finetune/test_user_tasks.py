"""Tasks from a YAML task file (finetune/user): MRPC and CoNLL-2003 defined through files score
as the built-in tasks do on the same seed, and a bad task file is one line naming the entry."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from finetune import cli as finetune_cli
from finetune.user import use_task_file

SHORT = ["--max_train_examples", "48", "--max_eval_examples", "24", "--epochs", "1",
         "--batch_size", "8",
         "--learning_rates", "5e-5", "--seeds", "3", "--max_seq_length", "64", "--no_progress",
         "--num_threads", "1"]
"""A run of a few optimizer steps on MiniLM."""

MRPC = """\
tasks:
  - name: my-mrpc
    type: sequence_classification
    format: tsv
    train: {data}/glue/MRPC/train.tsv
    dev: {data}/glue/MRPC/dev.tsv
    test: {data}/glue/MRPC/test.tsv
    columns: {{text_a: "#1 String", text_b: "#2 String", label: Quality, id: index}}
    labels: ["0", "1"]
    metric: [f1, accuracy]
"""

CONLL = """\
tasks:
  - name: my-conll
    type: token_classification
    format: conll
    train: {data}/conll2003/train.txt
    dev: {data}/conll2003/valid.txt
    test: {data}/conll2003/test.txt
    num_columns: 4
    delimiter: space
    labels: [O, B-PER, I-PER, B-LOC, I-LOC, B-ORG, I-ORG, B-MISC, I-MISC]
    scheme: IOB2
    metric: seqeval_f1
"""


@pytest.fixture(autouse=True)
def _no_user_tasks_after():
    """The registry holds the task file last read: each test leaves it empty."""
    yield
    use_task_file(None)


def _run(minilm_dir: Path, data: Path, out: Path, tasks: str, *extra: str) -> dict:
    code = finetune_cli.main(["--model", str(minilm_dir), "--data", str(data), "--tasks", tasks,
                              "--output", str(out), *SHORT, *extra])
    assert code == 0
    return json.loads((out / "results.json").read_text())["tasks"][0]


def _same_runs(builtin: dict, user: dict) -> None:
    """The same metrics, and runs with the same steps and final training loss."""
    for key in ("metrics", "score", "best_learning_rate", "seeds", "num_train_examples",
                "num_dev_examples"):
        assert user[key] == builtin[key], key
    fields = ("learning_rate", "seed", "metrics", "score", "steps", "final_loss")
    assert [{k: r[k] for k in fields} for r in user["runs"]] == \
        [{k: r[k] for k in fields} for r in builtin["runs"]]
    assert user["runs"][0]["steps"] == 6


def _mrpc_folder(shared_data: Path, tmp_path: Path) -> Path:
    """glue/MRPC with the real train and dev files and the first 40 rows of the test file
    (predicting all 1,725 takes minutes on a CPU)."""
    folder = tmp_path / "data" / "glue" / "MRPC"
    folder.mkdir(parents=True)
    source = shared_data / "glue" / "MRPC"
    for name in ("train.tsv", "dev.tsv"):
        shutil.copyfile(source / name, folder / name)
    lines = (source / "test.tsv").read_bytes().splitlines(keepends=True)
    (folder / "test.tsv").write_bytes(b"".join(lines[:41]))
    return tmp_path / "data"


def test_mrpc_from_a_task_file_scores_as_the_builtin(shared_data, minilm_dir, tmp_path):
    data = _mrpc_folder(shared_data, tmp_path)
    tasks_file = tmp_path / "tasks.yaml"
    tasks_file.write_text(MRPC.format(data=data))
    builtin = _run(minilm_dir, data, tmp_path / "builtin", "mrpc")
    user = _run(minilm_dir, data, tmp_path / "user", "my-mrpc", "--tasks_file", str(tasks_file))
    assert (user["family"], user["task"]) == ("user", "my-mrpc")
    assert builtin["num_dev_examples"] == {"dev": 24}
    assert set(user["metrics"]) == {"f1", "accuracy"}
    _same_runs(builtin, user)
    # the test file's predictions, ids from its index column, as the built-in submission's
    ours = (tmp_path / "user" / "submission" / "my-mrpc.tsv").read_text()
    theirs = (tmp_path / "builtin" / "submission" / "MRPC.tsv").read_text()
    assert ours == theirs and len(ours.splitlines()) == 41


def test_conll2003_from_a_task_file_scores_as_the_builtin(shared_data, minilm_dir, tmp_path):
    tasks_file = tmp_path / "tasks.yaml"
    tasks_file.write_text(CONLL.format(data=shared_data))
    builtin = _run(minilm_dir, shared_data, tmp_path / "builtin", "conll2003")
    user = _run(minilm_dir, shared_data, tmp_path / "user", "user",
                "--tasks_file", str(tasks_file))
    assert (user["family"], user["task"]) == ("user", "my-conll")
    assert set(user["metrics"]) >= {"f1", "precision", "recall", "test_f1"}
    _same_runs(builtin, user)
    for split in ("dev", "test"):
        name = f"predictions_{split}.txt"
        assert (tmp_path / "user" / "my-conll" / name).read_text() == \
            (tmp_path / "builtin" / "conll2003" / name).read_text()


# ---------------------------------------------------------------------------------------------
# Bad task files and bad data: one line naming the file and the entry
# ---------------------------------------------------------------------------------------------

PAIRS = """\
tasks:
  - name: pairs
    type: sequence_classification
    format: {fmt}
    train: train.{fmt}
    dev: dev.{fmt}
    columns: {{text_a: first, text_b: second, label: gold}}
    labels: ["no", "yes"]
    metric: accuracy
"""


def _task_file(tmp_path: Path, text: str) -> str:
    path = tmp_path / "tasks.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("change, message", [
    (("type: sequence_classification", "type: summarization"),
     ("tasks[0] (pairs): type 'summarization' is not one of sequence_classification, "
      "regression, token_classification, extractive_qa")),
    (("metric: accuracy", "metric: seqeval_f1"),
     "tasks[0] (pairs): metric 'seqeval_f1' is not one of accuracy, f1, mcc"),
    (("format: csv", "format: conll"),
     "tasks[0] (pairs): format 'conll' is not one of csv, tsv, jsonl"),
    (("label: gold}", "gold: label}"),
     "tasks[0] (pairs): columns: unknown gold; missing label (known: text_a, text_b, label, id)"),
    (('labels: ["no", "yes"]', 'labels: ["yes"]'),
     "tasks[0] (pairs): labels must be 2 or more distinct values, got ['yes']"),
    (("    metric: accuracy\n", "    metric: accuracy\n    recipe: {epochs: 0}\n"),
     "tasks[0] (pairs): recipe: epochs must be > 0, got 0"),
    (("    metric: accuracy\n", "    metric: accuracy\n    scheme: IOB2\n"),
     "tasks[0] (pairs): unknown key(s) scheme for type sequence_classification"),
    (("name: pairs", "name: MRPC"),
     "tasks[0] (MRPC): the name 'MRPC' is the built-in glue task mrpc; give it another name"),
])
def test_a_bad_entry_is_one_line_naming_the_file_and_entry(tmp_path, change, message):
    path = _task_file(tmp_path, PAIRS.format(fmt="csv").replace(*change))
    with pytest.raises(ValueError) as error:
        use_task_file(path)
    assert str(error.value).startswith(f"{path}: {message}")
    assert "\n" not in str(error.value)


def test_bert_finetune_names_a_bad_task_file_in_one_line(tmp_path, minilm_dir, capsys):
    path = _task_file(tmp_path, "tasks:\n  - name: pairs\n    type: qa\n")
    with pytest.raises(SystemExit) as code:
        finetune_cli.main(["--model", str(minilm_dir), "--data", str(tmp_path), "--output",
                           str(tmp_path / "out"), "--tasks_file", path, "--tasks", "pairs"])
    assert code.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert last == (f"bert-finetune: error: {path}: tasks[0] (pairs): type 'qa' is not one of "
                    "sequence_classification, regression, token_classification, extractive_qa")


def _pairs_files(tmp_path: Path, fmt: str, bad_label: str = "maybe") -> None:
    rows = [("a cat sat", "a cat was sitting", "yes"), ("it rains", "the sun shines", "no"),
            ("he left", "he went away", bad_label), ("red car", "a red car", "yes")] * 2
    for split, chosen in (("train", rows), ("dev", rows[:4])):
        if fmt == "jsonl":
            text = "".join(json.dumps({"first": a, "second": b, "gold": g}) + "\n"
                           for a, b, g in chosen)
        else:
            text = "first,second,gold\n" + "".join(f'"{a}","{b}",{g}\n' for a, b, g in chosen)
        (tmp_path / f"{split}.{fmt}").write_text(text)


def test_a_label_not_in_the_list_names_the_file_and_line(tmp_path, minilm_dir, capsys):
    _pairs_files(tmp_path, "csv")
    path = _task_file(tmp_path, PAIRS.format(fmt="csv"))
    code = finetune_cli.main(["--model", str(minilm_dir), "--data", str(tmp_path), "--output",
                              str(tmp_path / "out"), "--tasks_file", path, "--tasks", "pairs",
                              "--no_progress"])
    assert code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"bert-finetune: error: {tmp_path}/train.csv: line 4: label 'maybe' is not one of "
        "['no', 'yes'] (task pairs)")


def test_a_missing_column_is_named_before_any_training(tmp_path, minilm_dir, capsys):
    _pairs_files(tmp_path, "jsonl", bad_label="no")
    path = _task_file(tmp_path, PAIRS.format(fmt="jsonl").replace("label: gold", "label: tag"))
    code = finetune_cli.main(["--model", str(minilm_dir), "--data", str(tmp_path), "--output",
                              str(tmp_path / "out"), "--tasks_file", path, "--tasks", "pairs"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"  {tmp_path}/train.jsonl: no column 'tag' for task pairs ({path}: tasks[0] (pairs))" \
        f"; the file has: first, second, gold" in err
    assert not (tmp_path / "out").exists()


def test_bad_rows_go_to_the_user_dead_letter_file(tmp_path, minilm_dir):
    _pairs_files(tmp_path, "jsonl")
    path = _task_file(tmp_path, PAIRS.format(fmt="jsonl"))
    task = _run(minilm_dir, tmp_path, tmp_path / "out", "pairs", "--tasks_file", path,
                "--skip_bad_rows")
    assert (task["family"], task["num_train_examples"], task["bad_rows"]) == ("user", 6, 3)
    letters = (tmp_path / "out" / "dead_letter" / "user_bad_rows.jsonl").read_text().splitlines()
    assert [(r["file"], r["record"], r["reason"]) for r in map(json.loads, letters)] == [
        (f"{tmp_path}/train.jsonl", "line 3", "label 'maybe' is not one of ['no', 'yes']"),
        (f"{tmp_path}/train.jsonl", "line 7", "label 'maybe' is not one of ['no', 'yes']"),
        (f"{tmp_path}/dev.jsonl", "line 3", "label 'maybe' is not one of ['no', 'yes']")]


def test_a_tag_outside_the_tag_set_names_the_line_and_the_entry(tmp_path):
    from finetune.user import FAMILY

    (tmp_path / "train.txt").write_text("Ann S-PER\nruns O\n\nBob B-PER\nLee E-PER\n")
    (tmp_path / "dev.txt").write_text("Ann S-PER\nin O\nRome S-LOC\n")
    text = CONLL.format(data=tmp_path).replace("conll2003/valid.txt", "dev.txt").replace(
        "conll2003/train.txt", "train.txt").replace("    test: " + f"{tmp_path}/conll2003/test.txt\n",
                                                  "").replace("num_columns: 4", "num_columns: 2")
    text = text.replace("[O, B-PER, I-PER, B-LOC, I-LOC, B-ORG, I-ORG, B-MISC, I-MISC]",
                        "[O, B-PER, I-PER, E-PER, S-PER]").replace("IOB2", "BIOES")
    path = _task_file(tmp_path, text)
    use_task_file(path)
    from finetune import user

    with pytest.raises(ValueError) as error:
        user.FAMILY.prepare("my-conll", "", None, 64, None, None, False)
    assert str(error.value) == (f"{tmp_path}/dev.txt:3: tag 'S-LOC' is not a label of {path}: "
                                "tasks[0] (my-conll) labels (O, B-PER, E-PER, I-PER, S-PER)")
    assert FAMILY.tasks == ()  # the module's FAMILY is replaced, never changed in place


def test_the_package_exports_its_registry_s_task_file_and_registries_are_apart(tmp_path):
    """`finetune.user`'s FAMILY, TASKS and DATA_FOLDERS are `REGISTRY`'s; another registry
    reading a task file leaves them as they are."""
    from finetune import user

    _pairs_files(tmp_path, "csv", bad_label="no")
    path = _task_file(tmp_path, PAIRS.format(fmt="csv"))
    other = user.UserTaskRegistry()
    other.use(path)
    assert (other.task_names, other.data_folders) == (("pairs",), {"pairs": str(tmp_path)})
    assert (user.TASKS, user.DATA_FOLDERS, user.FAMILY.tasks) == ((), {}, ())
    use_task_file(path)
    assert (user.TASKS, user.DATA_FOLDERS) == (("pairs",), {"pairs": str(tmp_path)})
    assert user.FAMILY is user.REGISTRY.family and user.FAMILY.tasks == other.family.tasks


def test_extractive_qa_from_any_path_writes_the_squad_files(shared_data, minilm_dir, tmp_path):
    """SQuAD v2.0 files under names the built-in tasks do not read, scored as v2.0."""
    squad = shared_data / "squad"
    path = _task_file(tmp_path, f"""\
tasks:
  - name: my-qa
    type: extractive_qa
    format: squad
    train: {squad}/train-v2.0-first11.json
    dev: {squad}/dev-v2.0-normans-rhine.json
    version_2: true
    metric: squad
""")
    out = tmp_path / "out"
    task = _run(minilm_dir, tmp_path, out, "my-qa", "--tasks_file", path, "--max_seq_length",
                "128")
    assert (task["family"], task["num_train_examples"], task["num_dev_examples"]) == \
        ("user", 48, {"dev": 24})
    assert {"exact", "f1", "HasAns_f1", "NoAns_f1"} <= set(task["metrics"])
    assert task["score"] == task["metrics"]["f1"]
    predictions = json.loads((out / "my-qa" / "predictions.json").read_text())
    assert len(predictions) == 24
    assert sorted(json.loads((out / "my-qa" / "null_odds.json").read_text())) == \
        sorted(predictions)


def test_labels_are_read_as_written_not_as_yaml_booleans(tmp_path):
    """`labels: [no, yes]` unquoted: YAML 1.1 reads no/yes as booleans; the labels are the
    strings the data writes, so every row of a yes/no file is read."""
    from finetune.user import readers
    from finetune.user.family import glue_spec

    _pairs_files(tmp_path, "csv", bad_label="no")
    text = PAIRS.format(fmt="csv").replace('labels: ["no", "yes"]', "labels: [no, yes, 01]")
    (task,) = use_task_file(_task_file(tmp_path, text))
    assert task.labels == ("no", "yes", "01")
    dev = readers.read_split(task, glue_spec(task), "dev", str(tmp_path / "dev.csv"),
                             labelled=True, skip_bad_rows=False)
    assert [e.label for e in dev.examples] == [1, 0, 0, 1]


def test_a_task_file_needs_no_data_folder_but_builtin_tasks_do(tmp_path, minilm_dir, capsys):
    _pairs_files(tmp_path, "jsonl", bad_label="no")
    path = _task_file(tmp_path, PAIRS.format(fmt="jsonl"))
    out = tmp_path / "out"
    code = finetune_cli.main(["--model", str(minilm_dir), "--tasks_file", path, "--tasks",
                              "pairs", "--output", str(out), *SHORT])
    assert code == 0
    task = json.loads((out / "results.json").read_text())["tasks"][0]
    assert (task["task"], task["num_train_examples"], task["num_dev_examples"]) == \
        ("pairs", 8, {"dev": 4})
    with pytest.raises(SystemExit) as error:
        finetune_cli.main(["--model", str(minilm_dir), "--tasks_file", path, "--tasks",
                           "pairs,rte", "--output", str(out)])
    assert error.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "bert-finetune: error: the following arguments are required: --data (the folder of "
        "the built-in tasks: rte; a task file's tasks name their own files)")
