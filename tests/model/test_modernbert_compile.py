"""torch.compile of the modern encoder (model/compiling.py) traced with the aot_eager backend
(the same graphs and guards as inductor, without code generation): a compiled forward gives
the eager one's hidden states on a padded batch."""
from __future__ import annotations

import pytest
import torch

from model.attention import batch_layout, instance_ids
from model.compiling import compile_layers, compile_model
from model.modernbert import ModernBertModel, modernbert_tiny

CONFIG = modernbert_tiny(vocab_size=256, hidden_size=64, num_attention_heads=2,
                         intermediate_size=96, num_hidden_layers=2, local_attention=8,
                         max_position_embeddings=64)
"""Two layers (global, then local with a window of 4 tokens each side) of width 64."""


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three rows of 24 tokens with 24, 17 and 6 real ones (padding id 0)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, CONFIG.vocab_size, (3, 24), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 17:] = 0
    mask[2, 6:] = 0
    return ids.masked_fill(mask == 0, 0), mask


def model() -> ModernBertModel:
    torch.manual_seed(0)
    return ModernBertModel(CONFIG).eval()


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_compiled_layers_give_the_eager_states():
    """`compile_layers` (batches of changing shape): every layer one graph (fullgraph), the
    CPU's per-instance attention plan made outside it."""
    ids, mask = padded_batch()
    with torch.no_grad():
        eager = model()(ids, attention_mask=mask)
        compiled = compile_layers(model(), backend="aot_eager")(ids, attention_mask=mask)
    torch.testing.assert_close(compiled, eager, atol=1e-6, rtol=0)


def test_a_compiled_whole_model_gives_the_eager_states_of_the_real_tokens():
    """`compile_model` (batches of one shape): the whole forward one graph, given the loader's
    `BatchLayout` (whole rows under the instance mask, no host look at the ids inside the
    graph), equals the eager forward at every real token."""
    ids, mask = padded_batch()
    layout = batch_layout(instance_ids(mask, None, ids), plan=False)
    with torch.no_grad():
        eager = model()(ids, attention_mask=mask)
        compiled = compile_model(model(), backend="aot_eager")(ids, attention_mask=mask,
                                                               layout=layout)
    real = mask.bool()
    torch.testing.assert_close(compiled[real], eager[real], atol=1e-6, rtol=0)
