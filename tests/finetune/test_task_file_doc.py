"""docs/finetuning.md's task-file examples, read by the real parser on the data they name, and
the recipe a small task of such a file gets."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from finetune.checkpoint import load_tokenizer
from finetune.family import Recipe
from finetune.user import readers
from finetune.user.family import UserFamily
from finetune.user.spec import load_task_file

DOC = Path(__file__).resolve().parents[2] / "docs" / "finetuning.md"


def yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def test_the_doc_shows_one_example_per_task_type():
    kinds = [re.search(r"type: (\w+)", block).group(1) for block in yaml_blocks()]
    assert kinds == ["sequence_classification", "regression", "token_classification",
                     "extractive_qa"]


@pytest.mark.parametrize("index", range(4))
def test_each_yaml_example_parses_and_reads_its_data(shared_data, minilm_dir, tmp_path, index):
    for folder in ("glue", "conll2003", "squad"):
        (tmp_path / folder).symlink_to(shared_data / folder)
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml_blocks()[index])
    (task,) = load_task_file(str(path))
    family = UserFamily((task,))
    family.check_files(task.name, "")  # every file present, every named column in its header
    expected = {
        "my-mrpc": ("sequence_classification", ("f1", "accuracy"), ("0", "1"), 3668,
                    Recipe(epochs=3.0, learning_rates=(5e-5, 3e-5))),
        "my-stsb": ("regression", ("pearson", "spearman"), (), 5749, Recipe()),
    }
    if task.type in ("sequence_classification", "regression"):
        kind, metrics, labels, rows, recipe = expected[task.name]
        assert (task.type, task.metrics, task.labels) == (kind, metrics, labels)
        assert readers.count_rows(task.train, task.format, 10_000) == rows
        assert family.recipe(task.name) == recipe  # above 1,000 rows: the paper's recipe
        split = family.prepare(task.name, "", load_tokenizer(str(minilm_dir)), 32, 5, 5,
                               False)
        assert split.num_train_examples == 5 and dict(split.num_dev_examples) == {"dev": 5}
    elif task.type == "token_classification":
        assert (task.name, task.num_columns, task.delimiter, task.scheme) == (
            "my-ner", 4, " ", "IOB2")
        assert task.labels[0] == "O" and len(task.labels) == 9 and task.test.endswith("test.txt")
    else:
        assert (task.name, task.version_2, task.metrics) == ("my-qa", True, ("squad",))


def test_a_small_task_trains_for_enough_steps_at_higher_rates(shared_data, tmp_path):
    """200 MRPC rows: 7 steps per epoch at batch 32, so 20 epochs (140 steps) over 1e-4, 5e-5,
    3e-5; an entry's own recipe still wins."""
    rows = (shared_data / "glue" / "MRPC" / "train.tsv").read_text().splitlines(True)
    (tmp_path / "train.tsv").write_text("".join(rows[:201]))
    (tmp_path / "dev.tsv").write_text("".join(rows[:1] + rows[201:251]))
    block = yaml_blocks()[0].replace("glue/MRPC/", "").replace(
        "    test: test.tsv     # optional, unlabelled: predicted as submission/my-mrpc.tsv\n", "")
    path = tmp_path / "tasks.yaml"
    path.write_text(block.replace("    recipe: {epochs: 3, learning_rates: [5e-5, 3e-5]}\n", ""))
    (task,) = load_task_file(str(path))
    assert UserFamily((task,)).recipe("my-mrpc") == Recipe(epochs=20.0,
                                                           learning_rates=(1e-4, 5e-5, 3e-5))
    path.write_text(block)
    (task,) = load_task_file(str(path))
    assert UserFamily((task,)).recipe("my-mrpc") == Recipe(epochs=3.0,
                                                           learning_rates=(5e-5, 3e-5))
