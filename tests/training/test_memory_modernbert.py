"""training/memory.py on the modern encoder: parameters counted on the model (equal to
transformers' ModernBERT-base, byte for byte), the GeGLU's activations measured, and the MLM
head at ModernBERT's 30% masking."""
from __future__ import annotations

import torch
import transformers

from model.bert import bert_base
from model.encoders import activation_bytes
from model.modernbert import ModernBertMLP, modernbert_base, modernbert_tiny
from model.modernbert_hf import hf_config
from training import memory


def test_modernbert_base_parameters_are_transformers_masked_lms_byte_for_byte():
    """ModernBERT-base's masked LM as transformers builds it (meta device: no memory): 149.7M
    parameters, the published count; ours the same (the MLM transform is the encoder's
    prediction head, one `head` as theirs), and fp32 model states at ZeRO 0 are 16 bytes each."""
    config = modernbert_base()
    with torch.device("meta"):
        theirs = transformers.ModernBertForMaskedLM(
            transformers.ModernBertConfig(**hf_config(config)))
    their_bytes = sum(p.numel() * p.element_size() for p in theirs.parameters())
    estimate = memory.estimate(config, 1024, 1, precision="fp32", zero_stage=0)
    assert estimate.parameters == memory.parameter_count(config) == 149_655_232
    assert 4 * estimate.parameters == their_bytes
    assert estimate.model_states == 16 * estimate.parameters
    assert memory.parameter_count(config, next_sentence=True) == 149_655_232 + 2 * 768 + 2


def test_the_geglu_keeps_four_intermediate_values_a_token():
    """What autograd saves for the backward of one GeGLU (fp32, unique storages): the input
    (H), Wi's output (2 I: input and gate), act(input) (I) and the product Wo reads (I), the
    H + 4 I that `activation_bytes` counts per token (BERT's feed-forward: 2 I)."""
    config = modernbert_tiny()
    mlp = ModernBertMLP(config)
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    x = torch.randn(2, 16, config.hidden_size, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        mlp(x)
    weights = {p.untyped_storage().data_ptr() for p in mlp.parameters()}
    tokens, H, I = 32, config.hidden_size, config.intermediate_size
    assert sum(n for ptr, n in saved.items() if ptr not in weights) == tokens * 4 * (H + 4 * I)


def test_modernbert_activations_are_the_geglus_and_the_mlm_head_masks_30_percent():
    config = modernbert_base()
    H, I, L, T = 768, 1152, 22, 1024
    encoder = L * T * (8 * H + 4 * I) * 2 + T * 2 * 2 * H  # bf16, no dropout, no positions
    assert activation_bytes(config, T, 2) == encoder == 487_587_840
    assert memory.max_predictions(T, config.masked_share) == 307  # 30% of 1,024
    estimate = memory.estimate(config, T, 8)
    assert estimate.activations_per_sequence == encoder + 307 * 50368 * (2 + 4)
    bert = memory.estimate(bert_base(), 512, 8)  # BERT's terms as they were: 34 H a token
    assert bert.activations_per_sequence == 12 * 512 * 34 * 768 + 512 * 5 * 768 \
        + 80 * 30522 * 6 == 177_048_768
