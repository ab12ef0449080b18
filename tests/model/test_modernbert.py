"""The ModernBERT encoder against transformers' `ModernBertModel` / `ModernBertForMaskedLM` /
task models on the same weights (random from a seed, copied through our converter)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import transformers
from safetensors.torch import load_file
from torch import Tensor, nn

from model.attention import batch_layout, instance_ids
from model.bert import HiddenStates
from model.cpu_ops import stock_ops
from model.heads import BertForPreTraining
from model.modernbert import (
    PRESETS,
    ModernBertConfig,
    ModernBertModel,
    modernbert_base,
    modernbert_large,
    modernbert_tiny,
)
from model.modernbert_hf import config_from_hf, hf_config, state_from_hf, state_to_hf
from model.real_tokens import token_runs

VOCAB = 512
PAD = 0
WINDOW = 16  # local layers see 8 tokens each side: rows of 40 reach well past it


def tiny(**changes) -> ModernBertConfig:
    """L=3 (layer 0 global, 1 and 2 local), H=128, A=2, a small vocabulary and window."""
    return modernbert_tiny(vocab_size=VOCAB, pad_token_id=PAD, local_attention=WINDOW, **changes)


def hf_model(cls: type, config: ModernBertConfig, attn: str = "sdpa", seed: int = 0,
             **extra) -> nn.Module:
    """transformers' `cls` of `config`, randomly initialised from `seed`, in eval mode."""
    torch.manual_seed(seed)
    hf_cfg = transformers.ModernBertConfig(**hf_config(config, **extra),
                                           attn_implementation=attn)
    model = cls(hf_cfg).eval()
    assert model.config._attn_implementation == attn
    return model


def ours_from(hf: nn.Module, config: ModernBertConfig) -> ModernBertModel:
    """Our encoder with the weights of a transformers ModernBERT model (any class)."""
    model = ModernBertModel(config).eval()
    state, _ = state_from_hf(hf.state_dict(), encoder_prefix="")
    encoder = {k: v for k, v in state.items() if not k.startswith(("mlm.", "classifier."))}
    if "pooler.dense.weight" not in encoder:  # a bare ModernBertModel has no head
        encoder.update({k: v for k, v in model.state_dict().items() if k.startswith("pooler.")})
    model.load_state_dict(encoder, strict=True)
    return model


@pytest.fixture(scope="module")
def config() -> ModernBertConfig:
    return tiny()


@pytest.fixture(scope="module")
def hf_encoder(config) -> nn.Module:
    return hf_model(transformers.ModernBertModel, config)


@pytest.fixture(scope="module")
def ours(hf_encoder, config) -> ModernBertModel:
    return ours_from(hf_encoder, config)


def padded_batch(seed: int = 1) -> tuple[Tensor, Tensor]:
    """Three rows of 40 tokens with 40, 29 and 11 real ones (padding id 0)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (3, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 29:] = 0
    mask[2, 11:] = 0
    return ids.masked_fill(mask == 0, PAD), mask


# ---------------------------------------------------------------------------------------------
# Hidden states


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hidden_states_equal_transformers_on_padded_rows_past_the_window(config, attn):
    hf = hf_model(transformers.ModernBertModel, config, attn)
    ours = ours_from(hf, config)
    assert [layer.is_global for layer in ours.layers] == [True, False, False]
    assert hf.config.layer_types == ["full_attention", "sliding_attention", "sliding_attention"]
    ids, mask = padded_batch()
    real = mask.bool()
    with torch.no_grad():
        theirs = hf(ids, attention_mask=mask, output_hidden_states=True)
        states = ours(ids, attention_mask=mask, output_hidden_states=True)
        last = ours(ids, attention_mask=mask)
    assert isinstance(states, HiddenStates) and len(states.layers) == 4
    assert len(theirs.hidden_states) == 4
    for mine, their in zip(states.layers, theirs.hidden_states):
        torch.testing.assert_close(mine[real], their[real])
    # transformers' last hidden state is after the final norm: so is ours, and so is `.last`
    torch.testing.assert_close(last[real], theirs.last_hidden_state[real])
    torch.testing.assert_close(states.last, last)


def test_unpadded_rows_equal_transformers_without_a_mask(ours, hf_encoder):
    """Rows past the window (local layers masked), rows within it (no mask at all); token
    types are ignored."""
    ids, _ = padded_batch(seed=2)
    short = ids[:, :WINDOW // 2 + 1]
    with torch.no_grad():
        torch.testing.assert_close(ours(ids), hf_encoder(ids).last_hidden_state)
        torch.testing.assert_close(ours(short), hf_encoder(short).last_hidden_state)
        assert torch.equal(ours(ids, token_type_ids=torch.ones_like(ids)), ours(ids))


def test_a_packed_row_equals_each_instance_alone(ours, hf_encoder):
    """Two instances (30 and 24 tokens, both past the window) and 6 padding tokens in one row;
    positions restart at the second instance."""
    g = torch.Generator().manual_seed(3)
    first, second = torch.randint(1, VOCAB, (1, 30), generator=g), \
        torch.randint(1, VOCAB, (1, 24), generator=g)
    ids = torch.cat([first, second, torch.full((1, 6), PAD)], dim=1)
    sequence_ids = torch.tensor([[0] * 30 + [1] * 24 + [-1] * 6])
    with torch.no_grad():
        packed = ours(ids, sequence_ids=sequence_ids)
        with_layout = ours(ids, sequence_ids=sequence_ids,
                           layout=batch_layout(instance_ids(None, sequence_ids, ids)))
        alone = [hf_encoder(first).last_hidden_state, hf_encoder(second).last_hidden_state]
        alone_ours = [ours(first), ours(second)]
    torch.testing.assert_close(packed[:, :30], alone[0])
    torch.testing.assert_close(packed[:, 30:54], alone[1])
    torch.testing.assert_close(torch.cat(alone_ours, dim=1), packed[:, :54])
    assert torch.equal(with_layout, packed)


def test_output_positions_give_the_states_there_from_a_sparse_last_layer(ours):
    """The last layer is local here: its few queries keep their window and instance."""
    ids, mask = padded_batch(seed=4)
    positions = torch.tensor([[0, 5, 39], [0, 28, 3], [10, 0, 1]])
    with torch.no_grad():
        full = ours(ids, attention_mask=mask)
        sparse = ours(ids, attention_mask=mask, output_positions=positions)
    expected = full.gather(1, positions[:, :, None].expand(-1, -1, full.shape[-1]))
    torch.testing.assert_close(sparse, expected)


def test_token_runs_for_flash_attention_are_each_rows_instances():
    """The variable-length kernel's view of a batch (GPU only; the runs are plain tensors):
    a packed row with padding, and a row of one instance."""
    ids = torch.tensor([[0, 0, 0, 1, 1, -1], [0, 0, 0, 0, 0, 0]])
    runs = token_runs(ids, 2, 6, ids.device)
    assert runs.token_index.tolist() == [0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    assert runs.cu_seqlens.tolist() == [0, 3, 5, 11] and runs.cu_seqlens.dtype == torch.int32
    assert runs.max_length == 6
    dense = token_runs(None, 2, 6, ids.device)
    assert dense.token_index.tolist() == list(range(12))
    assert dense.cu_seqlens.tolist() == [0, 6, 12] and dense.max_length == 6


def test_rows_longer_than_max_position_embeddings_are_refused():
    model = ModernBertModel(tiny(max_position_embeddings=32))
    with pytest.raises(ValueError, match=r"^rows of 33 tokens exceed max_position_embeddings 32$"):
        model(torch.ones(1, 33, dtype=torch.long))


# ---------------------------------------------------------------------------------------------
# Heads through the encoder's pooler and token states


def test_pool_and_token_states_are_transformers_prediction_head(config):
    seq = hf_model(transformers.ModernBertForSequenceClassification, config, num_labels=3)
    tok = hf_model(transformers.ModernBertForTokenClassification, config, num_labels=5, seed=1)
    ids, mask = padded_batch(seed=5)
    for hf, pick in ((seq, lambda m, h: m.pool(h)), (tok, lambda m, h: m.token_states(h))):
        ours = ours_from(hf, config)
        state, ignored = state_from_hf(hf.state_dict())
        assert ignored == []
        classifier = nn.Linear(config.hidden_size, hf.config.num_labels)
        classifier.load_state_dict({"weight": state["classifier.weight"],
                                    "bias": state["classifier.bias"]})
        with torch.no_grad():
            logits = classifier(pick(ours, ours(ids, attention_mask=mask)))
            theirs = hf(ids, attention_mask=mask).logits
        real = mask.bool() if logits.dim() == 3 else slice(None)
        torch.testing.assert_close(logits[real], theirs[real])


# ---------------------------------------------------------------------------------------------
# Masked LM: loss and every gradient


def pretraining_model(hf: nn.Module, config: ModernBertConfig) -> BertForPreTraining:
    """Our MLM-only pre-training model (model/heads.py) on the modernbert encoder, with the
    weights of transformers' `ModernBertForMaskedLM` `hf` (the pooler too: transformers'
    `head`, as fine-tuning reads it)."""
    state, ignored = state_from_hf(hf.state_dict())
    assert ignored == ["decoder.weight"]  # tied to the word embeddings
    ours = BertForPreTraining(config, next_sentence=False).eval()
    result = ours.load_state_dict(state, strict=False)
    assert result.missing_keys == ["mlm.decoder.weight"] and result.unexpected_keys == []
    assert ours.mlm.decoder.weight is ours.bert.word_embeddings.weight
    return ours


@pytest.mark.parametrize("every_token", [False, True], ids=["masked_positions", "every_token"])
def test_masked_lm_loss_and_every_gradient_equal_transformers(config, every_token):
    """The pre-training batch's `masked_lm_positions` (B, M, 0 = padding) and `masked_lm_ids`
    (-100 = padding) against transformers' (B, T) labels, -100 where nothing is masked; or
    every token a masked position (P = T: the last layer computes every query)."""
    hf = hf_model(transformers.ModernBertForMaskedLM, config)
    ours = pretraining_model(hf, config)
    ids, mask = padded_batch(seed=6)
    positions = torch.tensor([[1, 7, 20, 39], [3, 28, 0, 0], [0, 10, 0, 0]])  # 0: padding
    scored = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]).bool()
    labels = torch.full_like(ids, -100)  # (B, T)
    for row, (at, keep) in enumerate(zip(positions, scored)):
        labels[row, at[keep]] = ids[row, at[keep]]
    if every_token:
        positions, targets = torch.arange(ids.shape[1]).expand_as(ids), labels  # (B, T)
    else:
        targets = ids.gather(1, positions).masked_fill(~scored, -100)  # (B, M)
    their_loss = hf(ids, attention_mask=mask, labels=labels).loss
    their_loss.backward()
    out = ours(ids, masked_lm_positions=positions, attention_mask=mask, masked_lm_ids=targets)
    out.loss.backward()
    torch.testing.assert_close(out.loss, their_loss)
    assert out.nsp_logits is None and out.mlm_count.item() == 8
    their_grads, _ = state_from_hf({n: p.grad for n, p in hf.named_parameters()})
    compared = 0
    for name, p in ours.named_parameters():  # the MLM transform by its first name: the pooler
        torch.testing.assert_close(p.grad, their_grads[name], atol=1e-6, rtol=0)
        compared += 1
    assert compared == len(their_grads) - 2  # less the MLM transform's second name


def test_dropout_draws_transformers_random_numbers_under_stock_ops():
    """In training with every dropout on, torch's stock ops (`stock_ops()`) draw exactly the
    masks transformers' SDPA model draws from the same seed, in the same order."""
    config = tiny(embedding_dropout=0.1, attention_dropout=0.1, mlp_dropout=0.1)
    hf = hf_model(transformers.ModernBertModel, config).train()
    ours = ours_from(hf, config).train()
    ids, mask = padded_batch(seed=9)
    real = mask.bool()
    torch.manual_seed(5)
    theirs = hf(ids, attention_mask=mask).last_hidden_state
    with stock_ops():
        torch.manual_seed(5)
        mine = ours(ids, attention_mask=mask)
    torch.testing.assert_close(mine[real], theirs[real])
    torch.manual_seed(5)
    cheaper = ours(ids, attention_mask=mask)  # model/cpu_ops.py's masks: other draws
    assert not torch.allclose(cheaper[real], theirs[real])


# ---------------------------------------------------------------------------------------------
# Conversion


def test_state_round_trip_through_transformers_keys_is_identical(ours):
    state = ours.state_dict()
    hf = state_to_hf(state, encoder_prefix="")
    assert set(hf) == set(transformers.ModernBertForSequenceClassification(
        transformers.ModernBertConfig(**hf_config(ours.config), num_labels=2)).state_dict()) \
        - {"classifier.weight", "classifier.bias"}
    back, ignored = state_from_hf(hf, encoder_prefix="")
    assert ignored == [] and back.keys() == state.keys()
    assert all(torch.equal(back[k], state[k]) for k in state)
    bare = state_to_hf({k: v for k, v in state.items() if not k.startswith("pooler.")},
                       prefix="", encoder_prefix="")
    assert set(bare) == set(transformers.ModernBertModel(
        transformers.ModernBertConfig(**hf_config(ours.config))).state_dict())


def test_masked_lm_state_round_trip_keeps_the_transform_and_bias(config):
    hf = hf_model(transformers.ModernBertForMaskedLM, config)
    state, _ = state_from_hf(hf.state_dict())
    assert torch.equal(state["mlm.dense.weight"], hf.head.dense.weight)
    assert torch.equal(state["bert.pooler.dense.weight"], hf.head.dense.weight)
    assert torch.equal(state["mlm.bias"], hf.decoder.bias)
    back = state_to_hf(state)
    expected = {k: v for k, v in hf.state_dict().items() if k != "decoder.weight"}
    assert back.keys() == expected.keys()
    assert all(torch.equal(back[k], expected[k]) for k in expected)


def test_config_round_trip_through_transformers():
    theirs = transformers.ModernBertConfig(
        vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=5,
        num_attention_heads=4, global_attn_every_n_layers=2, local_attention=32,
        max_position_embeddings=256, norm_eps=1e-6, pad_token_id=3, classifier_dropout=0.1,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 50000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 500.0}})
    ours = config_from_hf(theirs.to_dict())
    assert (ours.global_attn_every_n_layers, ours.local_attention, ours.global_rope_theta,
            ours.local_rope_theta, ours.layer_norm_eps, ours.hidden_dropout_prob,
            ours.pad_token_id) == (2, 32, 50000.0, 500.0, 1e-6, 0.1, 3)
    again = transformers.ModernBertConfig(**hf_config(ours, cls_token_id=theirs.cls_token_id,
                                                      sep_token_id=theirs.sep_token_id,
                                                      bos_token_id=theirs.bos_token_id,
                                                      eos_token_id=theirs.eos_token_id))
    skip = {"architectures", "transformers_version"}
    mine = {k: v for k, v in again.to_dict().items() if k not in skip}
    assert mine == {k: v for k, v in theirs.to_dict().items() if k not in skip}
    assert config_from_hf(again.to_dict()) == ours


def test_config_from_a_transformers_4_config_json():
    """Hub configs of transformers 4.x name the pattern and bases directly."""
    old = {"model_type": "modernbert", "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 96, "num_hidden_layers": 4, "global_attn_every_n_layers": 2,
           "global_rope_theta": 80000.0, "local_rope_theta": 1000.0, "local_attention": 64,
           "hidden_activation": "gelu", "norm_eps": 1e-5, "classifier_dropout": 0.0,
           "reference_compile": True, "vocab_size": 50368}
    ours = config_from_hf(old)
    assert (ours.global_attn_every_n_layers, ours.global_rope_theta, ours.local_rope_theta) == \
        (2, 80000.0, 1000.0)
    theirs = transformers.ModernBertConfig(**old)
    assert config_from_hf(theirs.to_dict()) == ours
    assert config_from_hf({**old, "pad_token_id": None}).pad_token_id == 50283
    assert config_from_hf({**old, "initializer_cutoff_factor": None}) \
        .initializer_cutoff_factor == 3.0  # what transformers reads None as


@pytest.mark.parametrize("unsupported, message", [
    ({"norm_bias": True}, "norm_bias=True is not supported (only False)"),
    ({"classifier_pooling": "max"}, "classifier_pooling 'max' not in ['cls', 'mean']"),
    ({"classifier_activation": "silu"}, ("classifier_activation 'silu' differs from "
                                         "hidden_activation 'gelu': one hidden_act serves both here")),
    ({"layer_types": ["full_attention", "full_attention", "sliding_attention"]},
     ("layer_types ['full_attention', 'full_attention', 'sliding_attention'] is not every n-th "
      "layer global from layer 0")),
])
def test_transformers_settings_we_do_not_have_are_one_line(unsupported, message):
    base = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 3}
    with pytest.raises(ValueError) as error:
        config_from_hf({**base, **unsupported})
    assert str(error.value) == message


def test_a_folder_saved_by_transformers_loads_through_the_converter(config, tmp_path):
    hf = hf_model(transformers.ModernBertForMaskedLM, config)
    hf.save_pretrained(tmp_path)
    folder_config = config_from_hf(transformers.ModernBertConfig.from_pretrained(tmp_path)
                                   .to_dict())
    assert folder_config == config
    state, ignored = state_from_hf(load_file(tmp_path / "model.safetensors"), encoder_prefix="")
    assert ignored == []  # the tied decoder weight is not saved
    model = ModernBertModel(folder_config).eval()
    model.load_state_dict({k: v for k, v in state.items() if not k.startswith("mlm.")})
    ids, mask = padded_batch(seed=7)
    with torch.no_grad():
        real = mask.bool()
        torch.testing.assert_close(model(ids, attention_mask=mask)[real],
                                   hf.model(ids, attention_mask=mask).last_hidden_state[real])


# ---------------------------------------------------------------------------------------------
# Config, RoPE, presets


@pytest.mark.parametrize("changes, message", [
    ({"hidden_size": 96, "num_attention_heads": 32},
     "head dim hidden_size / num_attention_heads = 96 / 32 = 3 must be even for RoPE"),
    ({"local_attention": 9000, "max_position_embeddings": 8192},
     "local_attention 9000 is larger than max_position_embeddings 8192"),
    ({"local_attention": 63}, ("local_attention 63 must be even (the window is local_attention "
                               "// 2 tokens each side)")),
    ({"hidden_size": 100, "num_attention_heads": 3},
     "hidden_size 100 is not a multiple of num_attention_heads 3"),
    ({"mlp_dropout": 1.0}, "mlp_dropout must be in [0, 1), got 1.0"),
    ({"pad_token_id": 512, "vocab_size": 512},
     "pad_token_id 512 outside the vocabulary of vocab_size 512"),
    ({"pad_token_id": -1}, "pad_token_id -1 outside the vocabulary of vocab_size 50368"),
])
def test_bad_settings_are_one_line_naming_them(changes, message):
    with pytest.raises(ValueError) as error:
        ModernBertConfig(**changes)
    assert str(error.value) == message


def test_each_layer_kind_turns_by_its_own_rope_theta(config, ours):
    ids, _ = padded_batch(seed=8)
    state = ours.state_dict()

    def run(config: ModernBertConfig) -> Tensor:
        model = ModernBertModel(config).eval()
        model.load_state_dict({k: v for k, v in state.items()
                               if not k.startswith("layers.") or int(k.split(".")[1])
                               < config.num_hidden_layers})
        with torch.no_grad():
            return model(ids)

    one_global = config.replace(num_hidden_layers=1)  # layer 0 only: global
    torch.testing.assert_close(run(one_global.replace(local_rope_theta=77.0)), run(one_global),
                               rtol=0, atol=0)
    assert not torch.allclose(run(one_global.replace(global_rope_theta=77.0)), run(one_global))
    assert not torch.allclose(run(config.replace(local_rope_theta=77.0)), run(config))


def test_config_dict_round_trip_and_unknown_keys():
    config = tiny(hidden_dropout_prob=0.1)
    assert ModernBertConfig.from_dict({**config.to_dict(), "arch": "modernbert"}) == config
    assert "arch" not in config.to_dict() and "mlm_head_bias" not in config.to_dict()
    assert ModernBertConfig.arch == "modernbert" and ModernBertConfig.mlm_head_bias is False
    assert tiny(vocab_multiple=64).embedding_rows == 512
    assert modernbert_tiny(vocab_multiple=64).embedding_rows == 50368
    assert ModernBertConfig(vocab_size=50300, pad_token_id=0, vocab_multiple=64).embedding_rows \
        == 50304


@pytest.mark.parametrize("preset, params", [(modernbert_base, 149_014_272),
                                            (modernbert_large, 394_781_696)])
def test_published_presets_have_transformers_parameter_counts(preset, params):
    """Counted on the meta device; ours holds one prediction head (the pooler) beyond
    transformers' ModernBertModel."""
    config = preset()
    with torch.device("meta"):
        theirs = transformers.ModernBertModel(transformers.ModernBertConfig(**hf_config(config)))
        ours = ModernBertModel(config)
    head = config.hidden_size ** 2 + config.hidden_size
    assert sum(p.numel() for p in theirs.parameters()) == params
    assert ours.num_parameters() == params + head
    assert sorted(PRESETS) == ["modernbert_base", "modernbert_large", "modernbert_tiny"]


def test_flops_per_token_count_the_window_on_local_layers():
    config = tiny()  # H=128, I=192, layers: global, local, local; window 16 -> 17 keys
    with torch.device("meta"):
        model = ModernBertModel(config)
    matmuls = 3 * (4 * 128 * 128 + 3 * 128 * 192)
    assert model.flops_per_token(512) == 6 * matmuls + 12 * 128 * (512 + 17 + 17)
    assert model.flops_per_token(8) == 6 * matmuls + 12 * 128 * 8 * 3


def test_initialisation_is_modernberts_and_seeded():
    config = tiny()
    torch.manual_seed(0)
    a = ModernBertModel(config)
    torch.manual_seed(0)
    b = ModernBertModel(config)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(),
                                                 b.state_dict().values()))
    std, out_std = 0.02, 0.02 / math.sqrt(2 * config.num_hidden_layers)
    for weight, s in ((a.layers[1].attention.qkv.weight, std),
                      (a.layers[1].attention.out.weight, out_std),
                      (a.layers[2].mlp.wo.weight, out_std)):
        assert weight.abs().max() <= 2 * s
        assert abs(weight.std().item() - 0.880 * s) < 0.05 * s  # truncated at 2 std: 0.880 std
    assert isinstance(a.layers[0].attn_norm, nn.Identity)
    assert all(m.bias is None for m in a.modules() if isinstance(m, (nn.Linear, nn.LayerNorm)))
    assert dataclasses.asdict(config) == config.to_dict()
