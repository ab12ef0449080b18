"""The SQuAD span head against transformers' BertForQuestionAnswering on the real MiniLM
weights, and the squad family's steps (prepare, batch, loss, outputs, score) on the demo's
sample files."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from finetune.checkpoint import load_encoder, load_tokenizer
from finetune.squad import FAMILY, TASKS
from finetune.squad.family import THRESHOLD_FILE
from model.heads import BertForQuestionAnswering
from model.hf import export_hf_folder, hf_to_ours, load_checkpoint, save_checkpoint

SAMPLE = "data/sample"


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    return load_encoder(str(minilm_dir))


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return load_tokenizer(str(minilm_dir))


def _inputs(tokenizer):
    enc = tokenizer.encode("Who won Super Bowl 50?", "The Denver Broncos defeated the Carolina "
                           "Panthers 24-10 to earn their third Super Bowl title.")
    ids = torch.tensor([enc.ids])
    return ids, torch.tensor([enc.type_ids]), torch.ones_like(ids)


def test_head_round_trips_through_transformers(encoder, tokenizer, tmp_path, minilm_dir):
    import transformers

    torch.manual_seed(0)
    ours = BertForQuestionAnswering.from_encoder(encoder).eval()
    export_hf_folder(ours, str(minilm_dir), str(tmp_path / "hf"))
    theirs = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "hf").eval()
    ids, types, mask = _inputs(tokenizer)
    positions = torch.tensor([14]), torch.tensor([16])
    with torch.no_grad():
        a = ours(ids, types, mask, *positions)
        b = theirs(input_ids=ids, token_type_ids=types, attention_mask=mask,
                   start_positions=positions[0], end_positions=positions[1])
    torch.testing.assert_close(a.start_logits, b.start_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.end_logits, b.end_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(a.loss, b.loss, rtol=1e-5, atol=1e-5)  # no padding: same loss
    # and back: HF's keys load into ours with nothing missing or left over
    state, ignored = hf_to_ours(theirs.state_dict())
    again = BertForQuestionAnswering(ours.config)
    result = again.load_state_dict(state, strict=False)
    # transformers' span model has no pooler (ours keeps the encoder's, unused by the head)
    assert (result.missing_keys, result.unexpected_keys) == (
        ["bert.pooler.dense.weight", "bert.pooler.dense.bias"], [])
    assert [k for k in ignored if not k.endswith("position_ids")] == []
    torch.testing.assert_close(again.qa_outputs.weight, ours.qa_outputs.weight)
    save_checkpoint(ours, str(tmp_path / "ours"))
    loaded = load_checkpoint(str(tmp_path / "ours"))
    assert isinstance(loaded, BertForQuestionAnswering)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in ours.state_dict().items())


def test_loss_ignores_padding(encoder, tokenizer):
    torch.manual_seed(0)
    model = BertForQuestionAnswering.from_encoder(encoder).eval()
    ids, types, mask = _inputs(tokenizer)
    padded = [torch.nn.functional.pad(t, (0, 7)) for t in (ids, types, mask)]
    positions = torch.tensor([14]), torch.tensor([16])
    with torch.no_grad():
        torch.testing.assert_close(model(*padded, *positions).loss,
                                   model(ids, types, mask, *positions).loss)


@pytest.mark.parametrize("task", TASKS)
def test_family_steps_on_the_sample(task, encoder, tokenizer, tmp_path):
    FAMILY.check_files(task, SAMPLE)
    prepared = FAMILY.prepare(task, SAMPLE, tokenizer, 384, max_train_examples=40,
                              max_eval_examples=12, skip_bad_records=False)
    counts = {"squad1": (40, 12, 12), "squad2": (40, 12, 12)}[task]
    assert (prepared.num_train_examples, prepared.num_dev_examples["dev"],
            len(prepared.dev["dev"])) == counts
    assert FAMILY.recipe(task).batch_size == {"squad1": 32, "squad2": 48}[task]
    torch.manual_seed(0)
    model = FAMILY.build_head(encoder, task)
    batch = FAMILY.make_batch(prepared.train, [0, 1, 2, 3], 384, train=True)
    loss = FAMILY.loss(model, batch)
    assert loss.ndim == 0 and 3.0 < loss.item() < 7.0  # ~log(window length) at the start
    model.eval()
    dev = prepared.dev["dev"]
    start, end = [], []
    with torch.no_grad():
        for first in range(0, len(dev), 16):
            out = FAMILY.outputs(model, FAMILY.make_batch(
                dev, range(first, min(first + 16, len(dev))), 384, train=False))
            assert out["start_logits"].shape[1] == 384
            start.append(out["start_logits"].numpy())
            end.append(out["end_logits"].numpy())
    scored = FAMILY.score(prepared, "dev", {"start_logits": np.concatenate(start),
                                            "end_logits": np.concatenate(end)})
    predictions = json.loads(scored.files["predictions.json"])
    assert len(predictions) == counts[1] and scored.score == scored.metrics["f1"]
    assert 0.0 <= scored.metrics["exact"] <= scored.metrics["f1"] <= 1.0
    if task == "squad2":
        odds = json.loads(scored.files["null_odds.json"])
        tau = json.loads(scored.files[THRESHOLD_FILE])["null_score_diff_threshold"]
        assert odds.keys() == predictions.keys()
        assert all((predictions[q] == "") == (odds[q] > tau) for q in odds)
        assert {"HasAns_f1", "NoAns_f1"} <= scored.metrics.keys()
