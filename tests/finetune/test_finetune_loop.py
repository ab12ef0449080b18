"""The one fine-tuning loop (finetune/loop.py): GLUE through it gives the numbers the GLUE-only
loop gave; a toy family shows the contract (unit order restored, prediction files written,
seeds per task size)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from common.settings import SettingError
from finetune import checkpoint, loop
from finetune.family import Recipe
from finetune.glue import FAMILY
from finetune.options import RECIPE_FIELDS, FinetuneConfig, LoopOptions, for_recipe
from finetune.report import write_report
from finetune.results import FinetuneResult, select_best
from model.bert import BertModel, bert_tiny
from tests.support.toy_family import FAMILY as TOY
from tests.support.toy_family import ToyFamily, toy_encoder

SAMPLE_ROWS = {"RTE": (24, 16, 8), "STS-B": (16, 24, 20)}
"""(train, dev, test) rows cut from data/sample/glue for the recorded runs."""

# Recorded with the GLUE-only loop of finetune/glue/finetune.py at 5672e50 (finetune_task, the
# same slices, config and seeds, torch threads 1), before the loop became finetune/loop.py:
# (learning rate, seed, dev metrics, final loss) of every run, the chosen rate, and the test
# predictions of the best run.
OLD_RUNS = {
    "RTE": [(1e-4, 1, {"accuracy": 0.4375}, 0.6956624984741211),
            (1e-4, 2, {"accuracy": 0.4375}, 0.6957352161407471),
            (3e-5, 1, {"accuracy": 0.4375}, 0.6876726150512695),
            (3e-5, 2, {"accuracy": 0.375}, 0.7012092471122742)],
    "STS-B": [(1e-4, 1, {"pearson": 0.12414892762899399, "spearman": 0.2771129690773825},
               8.126952171325684),
              (1e-4, 2, {"pearson": 0.13937494158744812, "spearman": 0.12219154541994816},
               8.000744819641113),
              (3e-5, 1, {"pearson": 0.1641019582748413, "spearman": 0.31158844082086784},
               8.126952171325684),
              (3e-5, 2, {"pearson": 0.17156317830085754, "spearman": 0.25398385512289223},
               8.000744819641113)],
}
OLD_BEST_LR = {"RTE": 1e-4, "STS-B": 3e-5}
OLD_TEST = {
    "RTE": ["not_entailment"] * 8,
    "STS-B": ["0.000", "0.000", "0.026", "0.032", "0.027", "0.005", "0.056", "0.000", "0.000",
              "0.000", "0.000", "0.018", "0.005", "0.021", "0.014", "0.021", "0.045", "0.014",
              "0.000", "0.025"],
}


@pytest.fixture
def one_thread():
    """The recording's thread count: float sums then add up in the same order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def sample_slice(root, task: str) -> str:
    from flows.config import SAMPLE

    folder = root / task
    folder.mkdir(parents=True)
    for name, rows in zip(("train.tsv", "dev.tsv", "test.tsv"), SAMPLE_ROWS[task]):
        lines = (SAMPLE / "glue" / task / name).read_text(encoding="utf-8").splitlines(True)
        (folder / name).write_text("".join(lines[:1 + rows]), encoding="utf-8")
    return str(root)


@pytest.mark.parametrize("task", ["RTE", "STS-B"])
def test_glue_through_the_loop_gives_the_old_loops_numbers(minilm_dir, tmp_path, one_thread,
                                                          task):
    """Two rates x two seeds on real sample rows: every run's dev metrics and loss, the chosen
    rate and the best run's test predictions are those the GLUE-only loop recorded."""
    encoder = checkpoint.load_encoder(str(minilm_dir))
    tokenizer = checkpoint.load_tokenizer(str(minilm_dir))
    # rows of max_seq_length, as that loop packed them: the dropout masks follow the layout
    cfg = FinetuneConfig(learning_rates=(1e-4, 3e-5), seeds=(1, 2), epochs=1.0,
                              batch_size=8, eval_batch_size=8, progress=False, row_length=128)
    prepared = FAMILY.prepare(task, sample_slice(tmp_path, task), tokenizer, 128, None, None,
                              False)
    result = loop.finetune_task(FAMILY, encoder, prepared, cfg)
    got = [(r.learning_rate, r.seed, r.metrics, r.final_loss) for r in result.runs]
    for (lr, seed, metrics, loss), old in zip(got, OLD_RUNS[task], strict=True):
        assert (lr, seed) == old[:2]
        assert metrics == pytest.approx(old[2], abs=1e-6)
        assert loss == pytest.approx(old[3], abs=1e-5)
    assert result.best_learning_rate == OLD_BEST_LR[task]
    (predictions,) = result.test_predictions
    assert predictions.predictions == OLD_TEST[task]
    assert result.seeds == (1, 2) and result.family == "glue"
    assert_baseline_and_dev_predictions(result, cfg, tmp_path / task, tmp_path / "out")


def assert_baseline_and_dev_predictions(result, cfg, data, out) -> None:
    """The baseline is the training rows' majority class (STS-B: their mean) scored on the dev
    rows; RTE's runs all predict not_entailment, which results.json and summary flag; every
    dev example's prediction is in `<task>/predictions_dev.tsv`."""
    train, dev = ([line.split("\t") for line in (data / name).read_text().splitlines()[1:]]
                  for name in ("train.tsv", "dev.tsv"))
    write_report(FinetuneResult((result,), "<minilm>", cfg), str(out))
    summary = json.loads((out / "results.json").read_text())["tasks"][0]
    table = (out / "results.md").read_text()
    if result.task == "RTE":
        gold = [row[-1] for row in dev]
        assert [row[-1] for row in train].count("not_entailment") == 16  # of 24: the majority
        share = gold.count("not_entailment") / len(gold)
        assert share == 0.4375 == result.metrics["accuracy"]
        assert summary["baseline"] == {"kind": "majority class not_entailment",
                                       "metrics": {"accuracy": share}, "score": share}
        assert result.constant == "all not_entailment" and result.constant_runs == 2
        assert summary["constant_predictions"] is True and summary["beats_baseline"] is False
        assert summary["warning"] == (
            "RTE: predictions are constant (all not_entailment); score 43.75 vs majority class "
            "not_entailment baseline 43.75; 2 of 2 runs at the chosen rate predicted a "
            "constant: the run did not learn the task (see docs/finetuning.md, 'Small tasks "
            "and a task that learns nothing')")
        assert "| constant: 43.75 (majority class not_entailment) |" in table
        assert summary["warning"] in table
    else:
        mean = sum(float(row[-1]) for row in train) / len(train)
        assert summary["baseline"] == {"kind": f"training mean {mean:.2f}",
                                       "metrics": {"pearson": 0.0, "spearman": 0.0},
                                       "score": 0.0}
        assert summary["constant_predictions"] is False and summary["beats_baseline"] is True
        assert summary["warning"] is None and f"| 0.00 (training mean {mean:.2f}) |" in table
    lines = (out / result.task / "predictions_dev.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction\tlabel" and len(lines) == 1 + len(dev)
    if result.task == "RTE":
        assert lines[1:] == [f"{row[0]}\tnot_entailment\t{row[-1]}" for row in dev]
    else:
        assert [line.split("\t")[2] for line in lines[1:]] == [
            f"{float(row[-1]):.3f}" for row in dev]


# ---------------------------------------------------------------------------------------------
# A toy family (tests/support/toy_family.py): the contract alone
# ---------------------------------------------------------------------------------------------

def test_predict_restores_unit_order():
    """Evaluation batches units sorted by length; the outputs come back in unit order."""
    prepared = TOY.prepare("small", "", None, 16, None, None, False)
    model = loop.build_model(TOY, toy_encoder(), "small", seed=1)
    cfg = for_recipe(TOY.recipe("small"), eval_batch_size=3, progress=False)
    assert list(np.argsort(prepared.dev["dev"].lengths, kind="stable")) != list(range(10))
    outputs = loop.predict(TOY, model, prepared.dev["dev"], cfg)
    assert outputs["unit"].tolist() == list(range(10))
    first = [int(x[0]) for x in prepared.dev["dev"].input_ids]
    assert outputs["first_token"].tolist() == first
    assert outputs["value"].dtype == np.float32 and outputs["value"].shape == (10,)


def test_small_tasks_run_every_seed_and_the_best_runs_files_are_written(tmp_path):
    """`is_small` picks the seeds; the best run's `Scored.files` land in <output>/<task>/."""
    encoder = toy_encoder()
    cfg = for_recipe(TOY.recipe("x"), seeds=(1, 2), progress=False, device="cpu")
    results = []
    for task in ("small", "large"):
        prepared = TOY.prepare(task, "", None, 16, None, None, False)
        results.append(loop.finetune_task(TOY, encoder, prepared, cfg))
    small, large = results
    assert small.seeds == (1, 2) and large.seeds == (1,)
    assert [r.steps for r in small.runs] == [3, 3]  # ceil(10 / 4) steps of one epoch
    best = select_best(small.runs).best_run
    assert small.files == best.files == {"predictions.json": json.dumps(list(range(10)))}
    paths = write_report(FinetuneResult(tuple(results), "<toy>", cfg), str(tmp_path))
    assert json.loads((tmp_path / "small" / "predictions.json").read_text()) == list(range(10))
    assert paths["files_small"] == str(tmp_path / "small")
    summary = json.loads((tmp_path / "results.json").read_text())
    assert summary["glue_score"] is None and "submission_missing" not in summary
    assert summary["tasks"][0]["files"] == ["predictions.json"]
    assert "| small | accuracy" in (tmp_path / "results.md").read_text()
    assert not list(tmp_path.rglob("*.tmp"))


@dataclasses.dataclass(frozen=True)
class SummedToy(ToyFamily):
    """The toy with a `Summaries` summary: the mean score and a two-file leaderboard."""

    def summary(self, tasks):
        from finetune.capabilities import FamilySummary
        return FamilySummary("toy_score", "toy score", sum(t.score for t in tasks) / len(tasks),
                             ("small.tsv", "large.tsv"))


def test_the_report_asks_each_family_for_its_summary(monkeypatch):
    """A family's summary is a row of the table, a score in results.json beside the GLUE
    score (null: no GLUE task ran) and its leaderboard's missing files."""
    from finetune import report, tasks
    from finetune.results import RunResult, summarise_task
    from tests.support import toy_family

    monkeypatch.setitem(tasks.FAMILIES, "toy", "tests.support.toy_family")
    monkeypatch.setattr(toy_family, "FAMILY", SummedToy())
    run = RunResult("small", 1e-3, 1, {"accuracy": 0.625}, 0.625, 3, 0.5, 1.0, 1.0)
    small = summarise_task("small", [run], 10, {"dev": 8}, 0, 60.0, family="toy")
    result = FinetuneResult((small,), "<toy>", FinetuneConfig(progress=False))
    summary = report.results_dict(result)
    assert (summary["glue_score"], summary["toy_score"]) == (None, 0.625)
    assert summary["submission_missing"] == ["small.tsv", "large.tsv"]
    assert "| toy score |  | 62.50 |" in report.markdown_table(result)


def test_bf16_follows_the_device_unless_set():
    cfg = FinetuneConfig()
    assert loop.uses_bf16(cfg, torch.device("cuda")) and not loop.uses_bf16(cfg, torch.device("cpu"))
    assert loop.uses_bf16(FinetuneConfig(bf16=True), torch.device("cpu"))
    assert not loop.uses_bf16(FinetuneConfig(bf16=False), torch.device("cuda"))


def test_recipe_fields_come_from_the_family_and_flags_override():
    recipe = Recipe(max_seq_length=384, batch_size=32, epochs=2.0, learning_rates=(5e-5,))
    cfg = for_recipe(recipe, epochs=1.0, seeds=(7,))
    assert (cfg.max_seq_length, cfg.batch_size, cfg.epochs, cfg.learning_rates, cfg.seeds) == \
        (384, 32, 1.0, (5e-5,), (7,))
    assert RECIPE_FIELDS == ("max_seq_length", "batch_size", "epochs", "learning_rates")


def test_head_init_normal_redraws_only_the_new_head(minilm_dir):
    """`head_init=normal` draws the new head as transformers does (N(0, 0.02), uncut, 1.137x
    the reference's truncated spread) and leaves every pre-trained weight, the pooler
    included, as the checkpoint has it."""
    from finetune.ner import FAMILY as NER

    encoder = checkpoint.load_encoder(str(minilm_dir))
    for family, task in ((NER, "conll2003"), (FAMILY, "MRPC")):
        cut = loop.build_model(family, encoder, task, seed=5)
        uncut = loop.build_model(family, encoder, task, seed=5, head_init="normal")
        truncated, normal = cut.classifier.weight, uncut.classifier.weight  # (C, 384)
        # 3456 (NER) / 768 (MRPC) draws: the std estimates sit within ~4 standard errors
        tolerance = 4 * 0.02 / (2 * truncated.numel()) ** 0.5
        assert abs(truncated.std().item() - 0.02 / 1.137) < tolerance
        assert abs(normal.std().item() - 0.02) < tolerance
        assert truncated.abs().max() <= 0.04 < normal.abs().max()
        assert torch.equal(uncut.classifier.bias, torch.zeros_like(uncut.classifier.bias))
        for name, value in uncut.bert.state_dict().items():
            assert torch.equal(value, encoder.state_dict()[name]), name
    # the seed decides the head: the same seed draws it again, another seed another head
    first = loop.build_model(NER, encoder, "conll2003", seed=5, head_init="normal")
    again = loop.build_model(NER, encoder, "conll2003", seed=5, head_init="normal")
    other = loop.build_model(NER, encoder, "conll2003", seed=6, head_init="normal")
    assert torch.equal(again.classifier.weight, first.classifier.weight)
    assert not torch.equal(other.classifier.weight, first.classifier.weight)
    with pytest.raises(SettingError, match="^--head_init must be one of truncated_normal or normal, got 'xavier'$"):
        FinetuneConfig(head_init="xavier")


def test_a_diverged_loss_is_named_with_its_step(monkeypatch):
    """Losses are read from the device in blocks (`LOSS_READ_EVERY`), and a non-finite one
    still stops the run with the step it came from."""
    real_step, calls = loop.train_step, []

    def step_nan_at_5(*args):
        loss = real_step(*args)
        calls.append(1)
        return torch.tensor(float("nan")) if len(calls) == 5 else loss

    monkeypatch.setattr(loop, "train_step", step_nan_at_5)
    prepared = TOY.prepare("small", "", None, 16, None, None, False)
    model = loop.build_model(TOY, toy_encoder(), "small", seed=1)
    cfg = for_recipe(TOY.recipe("small"), epochs=3.0, progress=False, device="cpu")
    with pytest.raises(FloatingPointError, match="toy: loss nan at step 5; lower the learning"):
        loop.train(TOY, model, prepared.train, 1e-3, 1, cfg, desc="toy")
    assert len(calls) == 9  # ceil(10 / 4) steps x 3 epochs, read once at the end
    monkeypatch.setattr(loop, "train_step", real_step)
    losses = loop.train(TOY, loop.build_model(TOY, toy_encoder(), "small", seed=1),
                        prepared.train, 1e-3, 1, cfg)
    assert len(losses) == 9 and all(isinstance(x, float) and np.isfinite(x) for x in losses)


def test_to_device_moves_every_host_tensor_and_keeps_the_rest():
    """One move serves every family's batch: tensor fields go to the device ("meta" stands in
    for a GPU here), other fields stay, and a batch already there is returned as it is."""
    from finetune.family import to_device
    from finetune.squad.features import SpanBatch

    ids = torch.tensor([[101, 7, 102]])
    batch = SpanBatch(ids, torch.zeros_like(ids), torch.ones_like(ids), torch.tensor([1]),
                      torch.tensor([1]), seq_length=384)
    moved = to_device(batch, torch.device("meta"))
    assert type(moved) is SpanBatch and moved.seq_length == 384
    assert {f: getattr(moved, f).device.type for f in
            ("input_ids", "token_type_ids", "attention_mask", "start_positions",
             "end_positions")} == dict.fromkeys(
        ("input_ids", "token_type_ids", "attention_mask", "start_positions", "end_positions"),
        "meta")
    assert to_device(moved, torch.device("meta")) is moved
    assert to_device(batch, torch.device("cpu")) is batch


def test_rows_are_long_on_the_cpu_and_max_seq_length_elsewhere():
    """`row_length`: on the CPU min(512, max_position_embeddings), never below max_seq_length;
    on any other device max_seq_length (attention over whole rows there); a set value wins."""
    cfg = for_recipe(TOY.recipe("small"), progress=False)  # max_seq_length 16
    toy = loop.build_model(TOY, toy_encoder(), "small", seed=1)  # max_position_embeddings 32
    assert loop.row_length(cfg, toy) == 32
    assert loop.row_length(dataclasses.replace(cfg, row_length=24), toy) == 24
    assert loop.row_length(cfg, toy.to("meta")) == 16
    wide = TOY.build_head(BertModel(bert_tiny(vocab_size=64, max_position_embeddings=2048)), "x")
    assert loop.row_length(cfg, wide) == loop.CPU_ROW_LENGTH == 512
    assert loop.row_length(dataclasses.replace(cfg, max_seq_length=16, row_length=1024),
                           wide) == 1024


class RowRecordingToy(ToyFamily):
    """The toy family, keeping the row length of every batch the loop asks for."""

    def __init__(self):
        super().__init__()
        object.__setattr__(self, "asked", [])

    def make_batch(self, encoded, indices, max_seq_length, train, row_length=None):
        self.asked.append((train, max_seq_length, row_length))
        return super().make_batch(encoded, indices, max_seq_length, train, row_length)


def test_the_loop_asks_the_family_for_its_row_length():
    family = RowRecordingToy()
    prepared = family.prepare("small", "", None, 16, None, None, False)
    cfg = for_recipe(family.recipe("small"), seeds=(1,), progress=False, device="cpu")
    loop.finetune_task(family, toy_encoder(), prepared, cfg)
    # 3 training batches of 4 (10 units), one evaluation batch of 256
    assert family.asked == [(True, 16, 32)] * 3 + [(False, 16, 32)]
    family.asked.clear()
    loop.finetune_task(family, toy_encoder(), prepared, dataclasses.replace(cfg, row_length=20))
    assert {rows for _, _, rows in family.asked} == {20}


def test_a_row_length_outside_the_model_or_below_max_seq_length_is_refused():
    with pytest.raises(SettingError, match="--row_length must be >= max_seq_length 128, got 64"):
        FinetuneConfig(row_length=64)
    with pytest.raises(SettingError, match="--row_length must be >= 1, got 0"):
        LoopOptions(row_length=0)
    prepared = TOY.prepare("small", "", None, 16, None, None, False)
    cfg = for_recipe(TOY.recipe("small"), row_length=64, progress=False, device="cpu")
    with pytest.raises(SettingError, match="--row_length must be <= the model's "
                                           "max_position_embeddings 32, got 64"):
        loop.finetune_task(TOY, toy_encoder(), prepared, cfg)
