"""Multiple choice: the head against transformers' BertForMultipleChoice on the same weights,
packed batches, the family's loss and score, and a short run through `bert-finetune`."""
from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest
import torch

from finetune.multiple_choice import FAMILY, TASKS
from finetune.multiple_choice import data as mc_data
from finetune.multiple_choice import family as mc
from model.heads import BertForMultipleChoice
from model.hf import export_hf_folder, load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    from finetune.checkpoint import load_encoder

    return load_encoder(str(minilm_dir))


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from finetune.checkpoint import load_tokenizer

    return load_tokenizer(str(minilm_dir))


@pytest.fixture(scope="module")
def cosmos12(shared_data, tokenizer):
    """12 real Cosmos QA questions (48 sequences): the first 8 and 4 with truncated choices."""
    split = mc_data.read_choice_csv(
        str(shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"), mc_data.SPECS["cosmosqa"])
    head = mc_data.encode_split(tokenizer, split.examples[:100], 128)
    truncated = [i for i, x in enumerate(head.input_ids) if any(len(s) == 128 for s in x)]
    examples = split.examples[:8] + [split.examples[i] for i in truncated[:4]]
    return examples, mc_data.encode_split(tokenizer, examples, 128)


@pytest.fixture(scope="module")
def exported(encoder, minilm_dir, tmp_path_factory):
    """Our model with a fresh head, and transformers' AutoModelForMultipleChoice loading it."""
    import transformers

    torch.manual_seed(3)
    ours = BertForMultipleChoice.from_encoder(encoder).eval()
    folder = tmp_path_factory.mktemp("mc_export")
    export_hf_folder(ours, str(minilm_dir), str(folder))
    peer = transformers.AutoModelForMultipleChoice.from_pretrained(folder).eval()
    assert type(peer).__name__ == "BertForMultipleChoice"
    return ours, peer, folder


def hf_batch(folder, examples):
    """The peer's own tokenization and padding: (B, C, T) tensors."""
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    flat = tokenizer([e.first for e in examples for _ in e.choices],
                     [c for e in examples for c in e.choices], truncation=True, max_length=128,
                     padding=True, return_tensors="pt")
    return {k: v.view(len(examples), len(examples[0].choices), -1) for k, v in flat.items()}


def test_scores_equal_transformers_multiple_choice(exported, cosmos12):
    """Per-choice scores on the same weights: the plain forward, the packed and the padded
    layout of the family all equal AutoModelForMultipleChoice's logits; so does the loss."""
    ours, peer, folder = exported
    examples, encoded = cosmos12
    batch = hf_batch(folder, examples)
    labels = torch.tensor([e.label for e in examples])
    indices = list(range(len(examples)))
    with torch.no_grad():
        expected = peer(**batch, labels=labels)
        plain = ours(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], labels)
        packed = mc.choice_scores(ours, mc.pack_choices(encoded, indices, 128))
        padded = mc.choice_scores(ours, mc.pad_choices(encoded, indices))
        family_loss = FAMILY.loss(ours, FAMILY.make_batch(encoded, indices, 128, train=True))
        long = FAMILY.make_batch(encoded, indices, 128, train=True, row_length=512)
        long_scores, long_loss = mc.choice_scores(ours, long), FAMILY.loss(ours, long)
    assert expected.logits.shape == (12, 4)
    assert any(len(s) == 128 for x in encoded.input_ids for s in x)  # truncation is covered
    torch.testing.assert_close(plain.logits, expected.logits)
    torch.testing.assert_close(packed, expected.logits)
    torch.testing.assert_close(padded, expected.logits)
    torch.testing.assert_close(plain.loss, expected.loss)
    torch.testing.assert_close(family_loss, expected.loss)
    assert long.input_ids.shape == (11, 512)  # 48 choices of ~99 tokens, 4-5 to a row
    torch.testing.assert_close(long_scores, expected.logits)
    torch.testing.assert_close(long_loss, expected.loss)


def test_packing_shares_rows_and_keeps_each_choice_in_place(cosmos12):
    _, encoded = cosmos12
    indices = [5, 0, 11, 3]  # any order: outputs follow it
    packed = mc.pack_choices(encoded, indices, 512)
    lengths = [len(s) for i in indices for s in encoded.input_ids[i]]
    assert packed.rows.shape == packed.slots.shape == (4, 4)
    assert packed.input_ids.shape[0] < 16 and packed.input_ids.shape[1] <= 512
    assert int((packed.sequence_ids >= 0).sum()) == sum(lengths)
    for b, i in enumerate(indices):
        for c in range(4):
            r, k = int(packed.rows[b, c]), int(packed.slots[b, c])
            start = int(packed.cls_positions[r, k])
            tokens = packed.input_ids[r, start:start + len(encoded.input_ids[i][c])]
            assert tokens.tolist() == encoded.input_ids[i][c].tolist()
            assert (packed.sequence_ids[r, start:start + len(tokens)] == k).all()
    assert packed.labels.tolist() == [int(encoded.labels[i]) for i in indices]


def test_score_is_accuracy_with_a_predictions_file(exported, cosmos12):
    ours, peer, folder = exported
    examples, encoded = cosmos12
    prepared = mc.Prepared("cosmosqa", encoded, {"dev": encoded}, 12, {"dev": 12})
    with torch.no_grad():
        scores = FAMILY.outputs(ours, FAMILY.make_batch(encoded, range(12), 128, train=False))
        expected = peer(**hf_batch(folder, examples)).logits.argmax(-1)
    scored = FAMILY.score(prepared, "dev", {k: v.numpy() for k, v in scores.items()})
    right = sum(int(p) == e.label for p, e in zip(expected, examples))
    assert scored.metrics == {"accuracy": right / 12} and scored.score == right / 12
    predictions = json.loads(scored.files["predictions.json"])
    assert predictions == {e.example_id: int(p) for e, p in zip(examples, expected)}
    with pytest.raises(ValueError, match=r"cosmosqa dev: scores of shape \(11, 4\) for 12"):
        FAMILY.score(prepared, "dev", {"scores": scores["scores"][:11].numpy()})


def test_checkpoint_round_trip_keeps_the_head(exported, tmp_path):
    ours, _, _ = exported
    save_checkpoint(ours, str(tmp_path))
    again = load_checkpoint(str(tmp_path))
    assert isinstance(again, BertForMultipleChoice)
    for (name, a), (_, b) in zip(ours.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_family_recipe_and_tasks(encoder):
    assert TASKS == ("swag", "cosmosqa")
    recipe = FAMILY.recipe("swag")
    assert (recipe.max_seq_length, recipe.batch_size, recipe.epochs, recipe.learning_rates) == \
        (128, 16, 3.0, (2e-5,))
    with pytest.raises(ValueError, match="unknown multiple-choice task 'hellaswag'"):
        FAMILY.recipe("hellaswag")
    torch.manual_seed(0)
    head = FAMILY.build_head(encoder, "swag")
    assert isinstance(head, BertForMultipleChoice)
    assert all(torch.equal(a, b) for a, b in zip(head.bert.state_dict().values(),
                                                  encoder.state_dict().values()))
    assert head.bert is not encoder


def test_prepare_reads_subsets_and_counts(shared_data, tokenizer, tmp_path):
    data = tmp_path / "cosmosqa"
    data.mkdir()
    source = shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"
    assert mc_data.split_by_group(str(source), "context", 5, str(data / "train.csv"),
                                  str(data / "valid.csv")) == (2379, 606)
    FAMILY.check_files("cosmosqa", str(data))
    prepared = FAMILY.prepare("cosmosqa", str(data), tokenizer, 128, max_train_examples=40,
                              max_eval_examples=12, skip_bad_records=False)
    assert prepared.num_train_examples == 40 and prepared.num_dev_examples == {"dev": 12}
    assert len(prepared.train) == 40 and len(prepared.dev["dev"]) == 12
    again = FAMILY.prepare("cosmosqa", str(data), tokenizer, 128, 40, 12, False)
    assert again.train.example_ids == prepared.train.example_ids
    assert np.array_equal(again.dev["dev"].labels, prepared.dev["dev"].labels)


# ---------------------------------------------------------------------------------------------
# End to end through `bert-finetune`
# ---------------------------------------------------------------------------------------------

SWAG_HEADER = ["", "video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
               "ending0", "ending1", "ending2", "ending3", "label"]


def swag_train_csv(sample_json, path):
    """transformers' SWAG sample (SWAG's first 10 training rows as JSON lines) in the official
    CSV layout; the columns the sample lacks are left empty."""
    import csv

    rows = [json.loads(line) for line in sample_json.read_text(encoding="utf-8").splitlines()]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(SWAG_HEADER)
        for i, row in enumerate(rows):
            writer.writerow([i, "", "", "", *(row[c] for c in SWAG_HEADER[4:6]), "",
                             *(row[f"ending{k}"] for k in range(4)), row["label"]])
    return len(rows)


def finetune(minilm_dir, data, out, task, *flags):
    from finetune.cli import main

    return main(["--model", str(minilm_dir), "--data", str(data), "--output", str(out),
                 "--tasks", task, "--seeds", "1", "--epochs", "1", "--no_progress", *flags])


def check_run(out, task, labels: dict[str, int], steps: int):
    """results.json's accuracy is that of the predictions file against the gold labels."""
    summary = json.loads((out / "results.json").read_text())
    (result,) = summary["tasks"]
    assert (result["task"], result["family"]) == (task, "multiple_choice")
    assert [r["steps"] for r in result["runs"]] == [steps]
    assert summary["task_configs"][task]["learning_rates"] == [2e-5]  # the SWAG recipe
    predictions = json.loads((out / task / "predictions.json").read_text())
    assert sorted(predictions) == sorted(labels)
    assert set(predictions.values()) <= {0, 1, 2, 3}
    right = sum(predictions[i] == label for i, label in labels.items())
    assert result["metrics"]["accuracy"] == pytest.approx(right / len(labels))
    assert f"| {task} | accuracy" in (out / "summary.md").read_text()


def test_bert_finetune_cosmos_qa_slice(shared_data, minilm_dir, tmp_path):
    """32 training questions of the passage split (2 steps of 16), 16 dev questions; the
    test.jsonl of the official layout holds those 16 dev questions without their labels."""
    data = tmp_path / "data"
    (data / "cosmosqa").mkdir(parents=True)
    mc_data.split_by_group(str(shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"),
                           "context", 5, str(data / "cosmosqa" / "train.csv"),
                           str(data / "cosmosqa" / "valid.csv"))
    dev = mc_data.subset(mc_data.read_split(str(data / "cosmosqa"), mc_data.SPECS["cosmosqa"],
                                            "dev"), 16)
    ids = [e.example_id for e in dev.examples]
    with open(data / "cosmosqa" / "valid.csv", encoding="utf-8", newline="") as f:
        rows = {row["id"]: row for row in csv.DictReader(f)}
    (data / "cosmosqa" / "test.jsonl").write_text("".join(
        json.dumps({k: v for k, v in rows[i].items() if k != "label"}) + "\n" for i in ids),
        encoding="utf-8")
    out = tmp_path / "out"
    assert finetune(minilm_dir, data, out, "cosmosqa", "--max_train_examples", "32",
                    "--max_eval_examples", "16") == 0
    check_run(out, "cosmosqa", {e.example_id: e.label for e in dev.examples}, steps=2)
    config = json.loads((out / "config.json").read_text())
    assert config["families"] == {"multiple_choice": {"pack_sequences": True,
                                                      "predict_test": True}}
    # The leaderboard's file: one label per line in test.jsonl's order; the same questions as
    # dev, so the same choices as dev's predictions.json.
    dev_choices = json.loads((out / "cosmosqa" / "predictions.json").read_text())
    assert (out / "submission" / "cosmosqa.lst").read_text().splitlines() == \
        [str(dev_choices[i]) for i in ids]
    (result,) = json.loads((out / "results.json").read_text())["tasks"]
    assert result["test_predictions"] == {"cosmosqa.lst": 16}


def test_bert_finetune_swag_rows(shared_data, minilm_dir, tmp_path):
    """SWAG's first 10 training rows (one step of 16 questions) and first 11 dev rows, in the
    official files' layout."""
    swag = tmp_path / "data" / "swag"
    swag.mkdir(parents=True)
    assert swag_train_csv(shared_data / "swag" / "train-first10.sample.json",
                          swag / "train.csv") == 10
    (swag / "val.csv").write_bytes((shared_data / "swag" / "val-first11.csv").read_bytes())
    labels = {str(i): label for i, label in enumerate([2, 2, 2, 2, 2, 0, 0, 2, 1, 0, 2])}
    # The official test.csv's layout: val.csv's columns without the label.
    rows = list(csv.reader(io.StringIO((swag / "val.csv").read_text(encoding="utf-8"),
                                       newline="")))
    assert rows[0][-1] == "label"
    with open(swag / "test.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(row[:-1] for row in rows)
    out = tmp_path / "out"
    assert finetune(minilm_dir, tmp_path / "data", out, "swag") == 0
    check_run(out, "swag", labels, steps=1)

    # The best run predicts the test file for SWAG's leaderboard (`,pred`, by row index): the
    # same questions as dev, so the same choices as dev's predictions.json.
    dev_choices = json.loads((out / "swag" / "predictions.json").read_text())
    submission = list(csv.reader(io.StringIO((out / "submission" / "swag.csv").read_text())))
    assert submission == [["", "pred"]] + [[str(i), str(dev_choices[str(i)])]
                                           for i in range(11)]
    assert not (out / "submission.zip").exists()  # GLUE's zip only
    (result,) = json.loads((out / "results.json").read_text())["tasks"]
    assert result["test_predictions"] == {"swag.csv": 11}
    assert finetune(minilm_dir, tmp_path / "data", tmp_path / "no_test", "swag", "--no_test") == 0
    assert not (tmp_path / "no_test" / "submission").exists()


def test_no_packing_flag_reaches_the_family():
    from finetune.cli import build_parser, with_options

    base = ["--model", "m", "--data", "d", "--output", "o", "--tasks", "swag"]
    assert with_options(FAMILY, build_parser().parse_args(base)).pack_sequences
    padded = with_options(FAMILY, build_parser().parse_args([*base, "--no_packing"]))
    assert not padded.pack_sequences and padded.name == "multiple_choice"


def test_missing_swag_folder_and_file_are_named(minilm_dir, tmp_path, capsys):
    from finetune.cli import main

    data = tmp_path / "data"
    (data / "cosmosqa").mkdir(parents=True)
    base = ["--model", str(minilm_dir), "--data", str(data), "--output", str(tmp_path / "o"),
            "--no_progress"]
    assert main([*base, "--tasks", "swag,cosmosqa"]) == 2
    assert capsys.readouterr().err == (
        f"bert-finetune: error: --data {data}: no swag/ folder (for swag)\n")
    assert main([*base, "--tasks", "multiple_choice"]) == 2  # the family: both tasks
    assert "no swag/ folder (for swag)" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    assert main([*base, "--tasks", "cosmosqa"]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == [
        (f"  {data}/cosmosqa/train.csv: no cosmosqa train file (the folder needs train.csv "
         "and valid.csv)")]
