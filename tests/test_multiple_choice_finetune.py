"""Multiple choice: the head against transformers' BertForMultipleChoice on the same weights,
packed batches, the family's loss and score, and a short run through `bert-finetune`."""
from __future__ import annotations

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
    from finetune.glue.finetune import load_encoder

    return load_encoder(str(minilm_dir))


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from finetune.glue.data import load_glue_tokenizer

    return load_glue_tokenizer(str(minilm_dir))


@pytest.fixture(scope="module")
def cosmos12(shared_data, tokenizer):
    """12 real Cosmos QA questions (48 sequences, some truncated to 128 tokens)."""
    split = mc_data.read_choice_csv(
        str(shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"), mc_data.SPECS["cosmosqa"])
    examples = split.examples[:12]
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
    assert expected.logits.shape == (12, 4)
    assert any(len(s) == 128 for x in encoded.input_ids for s in x)  # truncation is covered
    torch.testing.assert_close(plain.logits, expected.logits)
    torch.testing.assert_close(packed, expected.logits)
    torch.testing.assert_close(padded, expected.logits)
    torch.testing.assert_close(plain.loss, expected.loss)
    torch.testing.assert_close(family_loss, expected.loss)


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
    data = tmp_path / "data" / "cosmosqa"
    data.mkdir(parents=True)
    source = shared_data / "multiple_choice" / "cosmosqa" / "valid.csv"
    assert mc_data.split_by_group(str(source), "context", 5, str(data / "train.csv"),
                                  str(data / "valid.csv")) == (2379, 606)
    FAMILY.check_files("cosmosqa", str(tmp_path / "data"))
    prepared = FAMILY.prepare("cosmosqa", str(tmp_path / "data"), tokenizer, 128,
                              max_train_examples=40, max_eval_examples=12,
                              skip_bad_records=False)
    assert prepared.num_train_examples == 40 and prepared.num_dev_examples == {"dev": 12}
    assert len(prepared.train) == 40 and len(prepared.dev["dev"]) == 12
    again = FAMILY.prepare("cosmosqa", str(tmp_path / "data"), tokenizer, 128, 40, 12, False)
    assert again.train.example_ids == prepared.train.example_ids
    assert np.array_equal(again.dev["dev"].labels, prepared.dev["dev"].labels)
