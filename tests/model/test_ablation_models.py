"""The model ablations of the paper: MLM-only (Table 5 "No NSP"), any model shape (Table 6) and
the left-to-right baseline (Table 5 "LTR & No NSP"), in the model and through `bert-pretrain`
(DeepSpeed on CPU, fp32) on real shards of the books; exports checked against `transformers`.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open

from common import settings
from model.bert import bert_tiny
from model.heads import BertForNextToken, BertForPreTraining, BertForSequenceClassification
from tests.support.shard_fixtures import book_shards
from training import checkpoint, pretrain
from training import config as cfg
from training.config import PhaseConfig
from training.loader import LoaderConfig, ShardLoader


@pytest.fixture(scope="module")
def data(shared_data, tmp_path_factory):
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    return {"vocab": made.vocab_dir, "learn": made.shards_128,
            "vocab_size": len((made.vocab_dir / "vocab.txt").read_text().split())}


@pytest.fixture(scope="module")
def batch(data):
    """A real micro-batch of 8 rows (static masks, NSP labels) of the 128-token shards."""
    loader = ShardLoader(LoaderConfig(str(data["learn"]), 8, 128, shuffle_buffer=0))
    return next(iter(loader))


def run_config(shard_data, output, /, steps: int = 3, **sections) -> cfg.PretrainConfig:
    """A one-phase bert_tiny run; `sections`: mappings of their settings, as `--set` gives them
    (`objective={"name": "ltr"}`)."""
    phase = PhaseConfig(name="phase1", train_shards=str(shard_data["learn"]), max_seq_length=128,
                        micro_batch_size=8, global_batch_size=8, steps=steps, warmup_steps=1,
                        learning_rate=2e-3)
    config = cfg.PretrainConfig(
        model=cfg.ModelConfig(preset="bert_tiny", dropout=0.0),
        data=cfg.PretrainDataConfig(vocab_dir=str(shard_data["vocab"]), num_workers=0,
                                    shuffle_buffer=0),
        cadence=cfg.CadenceConfig(log_every=1, eval_every=0, eval_batches=1, checkpoint_every=0,
                                  export_hf=True),
        output_dir=str(output), phases=(phase,), seed=7)
    return settings.apply(config, sections)


def train_records(output) -> list[dict]:
    return [r for r in pretrain.read_metrics(str(output)) if r["split"] == "train"]


# ---------------------------------------------------------------- settings

def test_shape_settings_override_the_preset_and_are_checked():
    config = cfg.apply_overrides(cfg.tiny(), [
        "model.num_hidden_layers=3", "model.hidden_size=96", "model.num_attention_heads=4",
        "model.intermediate_size=200"])
    shape = config.model.build(vocab_size=500)
    assert (shape.num_hidden_layers, shape.hidden_size, shape.num_attention_heads,
            shape.intermediate_size, shape.vocab_size) == (3, 96, 4, 200, 500)
    assert cfg.tiny().model.build(vocab_size=500).hidden_size == 128  # the preset's
    with pytest.raises(ValueError, match=r"--set model.hidden_size: must be a multiple of "
                                         r"num_attention_heads \(got hidden_size=100, "
                                         r"num_attention_heads=3"):
        cfg.apply_overrides(cfg.tiny(), ["model.hidden_size=100", "model.num_attention_heads=3"])
    with pytest.raises(ValueError, match="--set objective.name: must be one of mlm_nsp, mlm or "
                                         "ltr, .* got 'rtl'$"):
        cfg.apply_overrides(cfg.tiny(), ["objective.name=rtl"])
    with pytest.raises(ValueError, match="--set data.mask_fraction: acts only with "
                                         "data.dynamic_masking"):
        cfg.apply_overrides(cfg.tiny(), ["data.mask_fraction=0", "data.same_fraction=0.2",
                                         "data.random_fraction=0.8"])
    with pytest.raises(ValueError, match="sum to 1"):
        cfg.apply_overrides(cfg.tiny(), ["data.dynamic_masking=true", "data.mask_fraction=0.5"])
    with pytest.raises(ValueError, match="--set objective.name: ltr cannot be combined with "
                                         "data.dynamic"):
        cfg.apply_overrides(cfg.tiny(), ["objective.name=ltr", "data.dynamic_masking=true"])


# ---------------------------------------------------------------- MLM-only and shapes

def test_mlm_only_custom_shape_trains_exports_and_loads_in_transformers(data, batch, tmp_path):
    """objective.next_sentence=false on shards with NSP labels and a shape no preset has: the loss is
    the MLM loss alone, the checkpoint config records the shape, and the export is a
    BertForMaskedLM of that shape without NSP weights whose logits transformers reproduces."""
    config = run_config(data, tmp_path, objective={"next_sentence": False},
                        model={"num_hidden_layers": 3, "hidden_size": 96,
                               "num_attention_heads": 4, "intermediate_size": 200})
    pretrain.run(config)
    for record in train_records(tmp_path):
        assert record["loss"] == pytest.approx(record["mlm_loss"], abs=1e-6)
        assert "nsp_loss" not in record
    saved = json.loads((tmp_path / "config.json").read_text())
    assert (saved["model"]["num_hidden_layers"], saved["model"]["hidden_size"],
            saved["objective"]["next_sentence"]) == (3, 96, False)
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["architectures"] == ["BertForMaskedLM"]
    assert (hf_config["num_hidden_layers"], hf_config["hidden_size"],
            hf_config["num_attention_heads"], hf_config["intermediate_size"]) == (3, 96, 4, 200)
    with safe_open(str(tmp_path / "hf" / "model.safetensors"), "pt") as f:
        assert not [k for k in f.keys() if "seq_relationship" in k]  # noqa: SIM118
    ours = pretrain.build_model(config, {"vocab_size": data["vocab_size"], "nsp": True},
                                checkpoint.consolidated_state_dict(
                                    str(tmp_path / "checkpoints"),
                                    (tmp_path / "checkpoints" / "latest").read_text().strip()))
    assert ours.nsp is None
    hf = transformers.BertForMaskedLM.from_pretrained(str(tmp_path / "hf")).eval()
    ours.eval()
    ids, types, mask = batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]
    with torch.no_grad():
        expected = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
        hidden = ours.bert(ids, types, mask)
        got = ours.mlm(hidden)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-4)


# ---------------------------------------------------------------- left-to-right

def ltr_model(vocab_size: int, seed: int = 0) -> BertForNextToken:
    torch.manual_seed(seed)
    config = bert_tiny(vocab_size=vocab_size, is_decoder=True, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    return BertForNextToken(config).eval()


def original_ids(batch) -> torch.Tensor:
    """The batch's text with the shards' masks undone."""
    ids = batch["input_ids"].clone()
    labels, positions = batch["masked_lm_ids"], batch["masked_lm_positions"]
    for b in range(ids.shape[0]):
        real = labels[b] >= 0
        ids[b, positions[b][real]] = labels[b][real]
    return ids


def test_ltr_attention_is_causal_within_each_instance(data, batch):
    """Changing token j changes no output before j; in a packed row (two instances) changing
    the first instance changes nothing of the second, and the reverse."""
    model = ltr_model(data["vocab_size"])
    ids, mask = original_ids(batch)[:2], batch["attention_mask"][:2]
    n = int(mask[0].sum())
    with torch.no_grad():
        before = model.bert(ids, attention_mask=mask)
        changed = ids.clone()
        changed[0, 40] = (changed[0, 40] + 7) % data["vocab_size"]
        after = model.bert(changed, attention_mask=mask)
    assert torch.equal(before[0, :40], after[0, :40])
    assert (before[0, 40:n] - after[0, 40:n]).abs().amax(-1).min() > 1e-4  # all later ones move
    assert torch.equal(before[1], after[1])

    split = 50  # one row holding two instances: tokens [0, 50) and [50, n)
    sequence_ids = torch.where(torch.arange(ids.shape[1]) < split, 0, 1)[None].clone()
    sequence_ids[0, n:] = -1
    row = ids[:1]
    with torch.no_grad():
        packed = model.bert(row, sequence_ids=sequence_ids)
        first = row.clone()
        first[0, 10] = (first[0, 10] + 3) % data["vocab_size"]
        second = row.clone()
        second[0, split + 5] = (second[0, split + 5] + 3) % data["vocab_size"]
        packed_first = model.bert(first, sequence_ids=sequence_ids)
        packed_second = model.bert(second, sequence_ids=sequence_ids)
        alone = model.bert(row[:, split:n], position_ids=torch.arange(n - split)[None])
    assert torch.equal(packed[0, split:n], packed_first[0, split:n])
    assert torch.equal(packed[0, :split + 5], packed_second[0, :split + 5])
    torch.testing.assert_close(packed[0, split:n], alone[0])  # the instance as if alone


def test_ltr_loss_is_next_token_cross_entropy_by_hand(data, batch):
    """The loss on a masked shard batch: the masks undone, then the mean over every real token
    t followed by a real token of -log softmax(logits at t)[token t + 1], computed here by hand;
    the same as on the unmasked text. No NSP output."""
    model = ltr_model(data["vocab_size"])
    with torch.no_grad():
        out = model(**{k: v for k, v in batch.items() if k != "layout"})
        text = original_ids(batch)
        logits = model.mlm(model.bert(text, batch["token_type_ids"], batch["attention_mask"]))
    assert out.nsp_logits is None and out.nsp_loss is None
    total, count = 0.0, 0
    for b in range(text.shape[0]):
        n = int(batch["attention_mask"][b].sum())
        log_probs = F.log_softmax(logits[b, :n - 1].double(), dim=-1)
        total -= log_probs[torch.arange(n - 1), text[b, 1:n]].sum().item()
        count += n - 1
    assert int(out.mlm_count) == count
    assert out.loss.item() == pytest.approx(total / count, rel=1e-5)
    assert out.loss.item() == out.mlm_loss.item()

    # Rows 0 and 1 packed into one row: no token predicts across the boundary, so the loss is
    # the token-weighted mean of theirs alone.
    n0, n1 = (int(batch["attention_mask"][b].sum()) for b in (0, 1))
    row = torch.cat([text[0, :n0], text[1, :n1]])[None]
    sequence_ids = torch.cat([torch.zeros(n0), torch.ones(n1)]).long()[None]
    none = torch.zeros((1, 1), dtype=torch.long)
    with torch.no_grad():
        packed = model(row, none, sequence_ids=sequence_ids, masked_lm_ids=none - 100)
        alone = [model(text[b:b + 1, :n], none, masked_lm_ids=none - 100)
                 for b, n in ((0, n0), (1, n1))]
    assert int(packed.mlm_count) == n0 + n1 - 2
    expected = (alone[0].loss * (n0 - 1) + alone[1].loss * (n1 - 1)) / (n0 + n1 - 2)
    torch.testing.assert_close(packed.loss, expected)


def test_ltr_trains_exports_and_matches_transformers_decoder(data, batch, tmp_path):
    """objective.name=ltr through bert-pretrain: the loss falls over a few steps, the export is a
    BertLMHeadModel (is_decoder) whose logits transformers reproduces, padding included."""
    pretrain.run(run_config(data, tmp_path, steps=8, objective={"name": "ltr"}))
    losses = [r["loss"] for r in train_records(tmp_path)]
    print("ltr losses", [round(x, 3) for x in losses])
    assert losses[-1] < losses[0] - 0.4  # measured: 7.63 -> 6.97 after 8 steps
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert hf_config["architectures"] == ["BertLMHeadModel"] and hf_config["is_decoder"]
    hf = transformers.BertLMHeadModel.from_pretrained(str(tmp_path / "hf")).eval()
    from model.hf import load_hf_checkpoint
    ours = load_hf_checkpoint(str(tmp_path / "hf"), next_sentence=False).eval()
    assert ours.config.is_decoder and isinstance(ours, BertForNextToken)
    text, mask = original_ids(batch), batch["attention_mask"]
    with torch.no_grad():
        expected = hf(input_ids=text, attention_mask=mask).logits
        got = ours.mlm(ours.bert(text, attention_mask=mask))
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=1e-4, atol=1e-4)


def test_ltr_model_has_no_nsp_head():
    config = bert_tiny(vocab_size=100, is_decoder=True)
    with pytest.raises(ValueError, match="no next-sentence head"):
        BertForPreTraining(config)


def test_ltr_checkpoints_load_as_the_left_to_right_model(tmp_path):
    """Our checkpoint of the left-to-right LM names its own head; one naming the pre-training
    head without NSP on a causal encoder (the same keys) loads as the same model."""
    from model.hf import CHECKPOINT_CONFIG, load_checkpoint, save_checkpoint

    model = ltr_model(100)
    save_checkpoint(model, str(tmp_path))
    meta = json.loads((tmp_path / CHECKPOINT_CONFIG).read_text())
    assert meta["head"] == {"kind": "next_token"}
    for head in (meta["head"], {"kind": "pretraining", "next_sentence": False}):
        (tmp_path / CHECKPOINT_CONFIG).write_text(json.dumps(meta | {"head": head}))
        loaded = load_checkpoint(str(tmp_path))
        assert type(loaded) is BertForNextToken and loaded.config == model.config
        a, b = loaded.state_dict(), model.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_ltr_classifier_pools_the_last_token_padded_and_packed(data, batch):
    """Fine-tuning a left-to-right encoder: the classifier reads each example's last token (the
    only one that has seen the whole example); two examples packed in one row give the logits
    they give padded one per row."""
    torch.manual_seed(1)
    config = bert_tiny(vocab_size=data["vocab_size"], is_decoder=True, hidden_dropout_prob=0.0,
                       attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config, num_labels=3).eval()
    text, mask = original_ids(batch)[:2], batch["attention_mask"][:2]
    n0, n1 = int(mask[0].sum()), int(mask[1].sum())
    with torch.no_grad():
        padded = model(text, attention_mask=mask).logits  # (2, 3)
        last = text.clone()
        last[0, n0 - 1] = 5  # the last real token of example 0
        moved = model(last, attention_mask=mask).logits
        row = torch.cat([text[0, :n0], text[1, :n1]])[None]  # (1, n0 + n1)
        sequence_ids = torch.cat([torch.zeros(n0), torch.ones(n1)]).long()[None]
        hidden = model.bert(row, sequence_ids=sequence_ids)
        pooled = model.bert.pool(hidden, torch.tensor([[0, n0]]), sequence_ids)  # (1, 2, H)
        packed = model.classifier(pooled[0])
    assert not torch.allclose(moved[0], padded[0]) and torch.equal(moved[1], padded[1])
    torch.testing.assert_close(packed, padded)
