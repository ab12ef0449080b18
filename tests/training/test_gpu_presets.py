"""The GPU presets: micro-batches from the written-down memory estimate, one set of values in
the training preset, the example YAML and the flow, packing, compile, LAMB's precision."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flows import config as flow_config
from model.bert import PRESETS as MODELS
from model.heads import BertForPreTraining
from training import config as cfg
from training import memory

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["bert_base", "bert_large"])
def test_the_estimates_parameter_count_is_the_models(name):
    model = MODELS[name]()
    with torch.device("meta"):  # shapes only
        built = BertForPreTraining(model)
    assert memory.parameter_count(model) == sum(p.numel() for p in built.parameters())


def test_memory_estimate_of_the_presets_micro_batches():
    """The numbers written in training/config.py's preset comment, per rank of 8, bf16, ZeRO-1."""
    rows = {}
    for name in ("bert_base", "bert_large"):
        for seq_len in (128, 512):
            e = memory.estimate(MODELS[name](), seq_len, 32, ranks=8)
            rows[name, seq_len] = (round(e.model_states / memory.GIB, 2),
                                   round(e.activations_per_sequence / 2**20),
                                   round(e.total / memory.GIB, 1),
                                   e.largest_micro_batch(80 * 10**9))
    assert rows == {("bert_base", 128): (0.62, 42, 4.9, 1538),
                    ("bert_base", 512): (0.62, 169, 8.9, 384),
                    ("bert_large", 128): (1.88, 106, 8.2, 599),
                    ("bert_large", 512): (1.88, 424, 18.1, 149)}
    # per layer and token 34 H bytes in bf16: 24 layers x 512 tokens x 34 x 1024 = 408 MiB,
    # plus the embeddings and the 80 masked positions' logits
    large = memory.estimate(MODELS["bert_large"](), 512, 1)
    assert large.activations_per_sequence == 24 * 512 * 34 * 1024 + 512 * 5 * 1024 \
        + 80 * 30522 * 6


def test_large_preset_yaml_and_flow_agree_on_the_batches():
    """One micro-batch per step on 8 GPUs in both phases (32 x 8 = 256), everywhere."""
    preset = cfg.large()
    yaml = cfg.resolve("large", str(REPO / "training" / "configs" / "bert_large_8gpu.yaml"))
    flow = flow_config.large()
    for config in (preset, yaml, flow.pretrain):
        assert [(p.micro_batch_size, p.global_batch_size) for p in config.phases] == \
            [(32, 256), (32, 256)]
        assert config.engine.compile and config.model.preset == "bert_large"
    assert flow.launch.nproc_per_node == 8
    assert [p.gradient_accumulation_steps(8) for p in preset.phases] == [1, 1]
    base = cfg.base()
    assert [p.micro_batch_size for p in base.phases] == [32, 32] and base.engine.compile
    assert not cfg.tiny().engine.compile  # CPU: eager
    for phases, packed in ((flow_config.base().shards, True), (flow_config.large().shards, True),
                           (flow_config.tiny().shards, False)):
        assert phases.phase1.pack is phases.phase2.pack is packed


def test_lamb_in_bf16_is_refused_with_deepspeeds_reason():
    with pytest.raises(ValueError, match="optimizer.name=lamb cannot be combined with "
                                         "engine.precision=bf16: DeepSpeed 0.19 runs a bf16 "
                                         "LAMB only at engine.zero_stage=0"):
        cfg.resolve("large", None, ["optimizer.name=lamb", "engine.zero_stage=0"])
    with pytest.raises(ValueError, match="optimizer.name=lamb cannot be combined with "
                                         "engine.zero_stage=2"):
        cfg.resolve("large", None, ["optimizer.name=lamb"])
    lamb = cfg.resolve("large", None, ["optimizer.name=lamb", "engine.precision=fp32",
                                       "engine.zero_stage=0"])
    assert lamb.optimizer.name == "lamb"


def test_padded_vocabulary_trains_and_exports_the_real_rows(minilm_dir, tmp_path):
    """Training pads the word embedding to a multiple of 64 rows (30,522 -> 30,528); the MLM
    scores and the Hugging Face export keep 30,522, so transformers loads the export and
    scores as our model does, and our own checkpoint keeps the padding exactly."""
    import transformers

    from model.bert import bert_tiny
    from model.hf import export_hf_folder, load_checkpoint, load_hf_checkpoint, save_checkpoint

    torch.manual_seed(0)
    config = bert_tiny(vocab_multiple=64)
    model = BertForPreTraining(config).eval()
    assert (config.vocab_size, config.embedding_rows) == (30522, 30528)
    assert model.bert.embeddings.word.weight.shape == (30528, 128)
    assert model.mlm.decoder.weight is model.bert.embeddings.word.weight
    ids = torch.randint(1000, 30522, (2, 12))
    positions = torch.tensor([[1, 4, 9], [0, 2, 11]])
    with torch.no_grad():
        ours = model(ids, positions)
    assert ours.mlm_logits.shape == (2, 3, 30522)

    export_hf_folder(model, str(minilm_dir), str(tmp_path / "hf"))
    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert hf.bert.embeddings.word_embeddings.weight.shape == (30522, 128)
    with torch.no_grad():
        theirs = hf(input_ids=ids)
    rows = torch.arange(2)[:, None]
    torch.testing.assert_close(ours.mlm_logits, theirs.prediction_logits[rows, positions])
    torch.testing.assert_close(ours.nsp_logits, theirs.seq_relationship_logits)
    reloaded = load_hf_checkpoint(str(tmp_path / "hf")).eval()  # unpadded, same scores
    assert reloaded.config.embedding_rows == 30522
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids, positions).mlm_logits, ours.mlm_logits)

    save_checkpoint(model, str(tmp_path / "ours"))
    again = load_checkpoint(str(tmp_path / "ours"))
    assert again.config == config
    assert torch.equal(again.bert.embeddings.word.weight, model.bert.embeddings.word.weight)
