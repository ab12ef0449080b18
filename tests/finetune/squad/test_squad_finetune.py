"""The SQuAD span head against transformers' BertForQuestionAnswering on the real MiniLM
weights, and the squad family's steps (prepare, batch, loss, outputs, score) on the demo's
sample files."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from finetune.checkpoint import load_encoder, load_tokenizer
from finetune.cli import main
from finetune.squad import FAMILY, TASKS
from finetune.squad import data as squad_data
from finetune.squad.family import THRESHOLD_FILE
from model.bert_hf import state_from_hf
from model.heads import BertForQuestionAnswering
from model.hf import export_hf_folder, load_checkpoint, save_checkpoint
from tests.support.squad_fixtures import squad_slice

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
    state, ignored = state_from_hf(theirs.state_dict())
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


def _official(scorer, data_file, out_dir, with_odds: bool = False) -> dict:
    command = [sys.executable, str(scorer), str(data_file), str(out_dir / "predictions.json")]
    if with_odds:
        command += ["--na-prob-file", str(out_dir / "null_odds.json")]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=120)
    return json.loads(done.stdout)


@pytest.mark.parametrize("task, train, dev, steps", [
    # v1.1 has no training file here: train on Normans paragraphs, score 1973 oil crisis ones
    ("squad1", ("dev-v1.1.json", {2: list(range(6))}), ("dev-v1.1.json", {13: [0, 1, 2]}), 2),
    # v2.0: Zelda paragraphs with unanswerable questions, scored on Normans (another file)
    ("squad2", ("train-v2.0-first11.json", {4: [0, 1]}),
     ("dev-v2.0-normans-rhine.json", {0: [0, 1, 2]}), 2),
])
def test_bert_finetune_runs_squad_split_by_article(task, train, dev, steps, shared_data,
                                                   minilm_dir, tmp_path):
    version = "v1.1" if task == "squad1" else "v2.0"
    folder = tmp_path / "data" / "squad"
    squad_slice(shared_data / "squad" / train[0], folder / f"train-{version}.json", train[1])
    dev_file = squad_slice(shared_data / "squad" / dev[0], folder / f"dev-{version}.json",
                           dev[1])
    out = tmp_path / "out"
    assert main(["--model", str(minilm_dir), "--data", str(tmp_path / "data"), "--output",
                 str(out), "--tasks", task, "--learning_rates", "5e-5", "--seeds", "1",
                 "--epochs", "1", "--batch_size", "16", "--max_seq_length", "192",
                 "--no_progress"]) == 0
    (result,) = json.loads((out / "results.json").read_text())["tasks"]
    assert (result["task"], result["family"], [r["steps"] for r in result["runs"]]) == (
        task, "squad", [steps])
    dev_split = squad_data.read_squad(str(dev_file), training=False, version_2=task == "squad2")
    predictions = json.loads((out / task / "predictions.json").read_text())
    assert list(predictions) == [e.qid for e in dev_split.examples]
    scorers = shared_data.parent / "peers" / "squad"
    metrics = result["runs"][0]["metrics"]
    if task == "squad1":
        theirs = _official(scorers / "evaluate-v1.1.py", dev_file, out / task)
        assert (theirs["exact_match"], theirs["f1"]) == pytest.approx(
            (100 * metrics["exact"], 100 * metrics["f1"]), rel=1e-12)
        return
    theirs = _official(scorers / "evaluate-v2.0.py", dev_file, out / task)
    for key in ("exact", "f1", "HasAns_f1", "NoAns_f1"):
        assert theirs[key] == pytest.approx(100 * metrics[key], rel=1e-12), key
    threshold = json.loads((out / task / THRESHOLD_FILE).read_text())
    odds = json.loads((out / task / "null_odds.json").read_text())
    assert all((predictions[q] == "") == (odds[q] > threshold["null_score_diff_threshold"])
               for q in odds)


def test_packed_windows_give_the_padded_logits_and_loss(shared_data, encoder, tokenizer,
                                                        tmp_path):
    from finetune.squad.family import SquadFamily
    from finetune.squad.features import WindowConfig, cut_windows

    path = squad_slice(shared_data / "squad" / "dev-v2.0-normans-rhine.json",
                       tmp_path / "dev.json", {0: [0, 2, 4, 5, 11]})
    examples = squad_data.read_squad(str(path), training=True, version_2=True).examples
    # the paper's 384-token windows: paragraph 11 slides, the short ones share rows
    windows, _ = cut_windows(examples, tokenizer, WindowConfig(384), training=True)
    assert (len(examples), len(windows)) == (28, 35) and (windows.start_positions > 0).any()
    indices = list(range(len(windows)))[::-1]
    packed_family, padded_family = SquadFamily(), SquadFamily(pack_sequences=False)
    packed = packed_family.make_batch(windows, indices, 384, train=True)
    # rows longer than the windows (the CPU's default, finetune.loop.row_length): W stays 384
    long = packed_family.make_batch(windows, indices, 384, train=True, row_length=512)
    padded = padded_family.make_batch(windows, indices, 384, train=True)
    assert (long.input_ids.shape[0], packed.input_ids.shape[0], len(indices),
            padded.input_ids.shape[0]) == (17, 21, 35, 35)
    assert 384 < long.input_ids.shape[1] <= 512
    assert (int((packed.sequence_ids >= 0).sum()) == int((long.sequence_ids >= 0).sum())
            == int(padded.attention_mask.sum()))
    torch.manual_seed(0)
    model = FAMILY.build_head(encoder, "squad2").eval()
    with torch.no_grad():
        theirs = padded_family.outputs(model, padded)
        for batch in (packed, long):
            ours = packed_family.outputs(model, batch)
            for name in ("start_logits", "end_logits"):
                assert ours[name].shape == theirs[name].shape == (len(windows), 384)
                real = batch.token_mask  # the padded layout leaves its pad positions unmasked
                torch.testing.assert_close(ours[name][real], theirs[name][real], rtol=1e-4,
                                           atol=1e-4)
                assert (ours[name][~real] == torch.finfo(torch.float32).min).all()
            torch.testing.assert_close(packed_family.loss(model, batch),
                                       padded_family.loss(model, padded), rtol=1e-5, atol=1e-5)


def test_no_packing_flag_reaches_the_squad_family():
    from finetune.cli import build_parser, with_options

    base = ["--model", "m", "--data", "d", "--output", "o", "--tasks", "squad1"]
    assert with_options(FAMILY, build_parser().parse_args(base)).pack_sequences
    padded = with_options(FAMILY, build_parser().parse_args([*base, "--no_packing"]))
    assert not padded.pack_sequences and padded.name == "squad" and padded.doc_stride == 128
