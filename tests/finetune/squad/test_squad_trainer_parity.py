"""SQuAD fine-tuning against transformers' Trainer + BertForQuestionAnswering on the same
weights: without dropout, in one data order and from one head, the two runs take the same
optimizer steps once the Trainer's loss leaves out the padding of its batches, as ours does
(each window's softmax over its own tokens). With the stock loss, whose softmax also runs over
the positions padded to the batch's longest window (BERT's run_squad.py likewise softmaxes over
all max_seq_length positions, padding included), the steps differ: that, besides the random
draws, is what separates the two sides in benchmarks/bench_squad.py (RESULTS section 9)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune import checkpoint, loop
from finetune.options import FinetuneConfig
from finetune.squad import FAMILY
from finetune.squad import data as squad_data
from tests.support.dropout import without_dropout


@pytest.fixture(scope="module")
def normans_windows(shared_data, minilm_dir):
    """Training windows of the first 40 questions of dev-v1.1's "Normans" article, 192
    tokens (windows of 66 to 192 tokens: every batch pads)."""
    split = squad_data.read_squad(str(shared_data / "squad" / "dev-v1.1.json"), training=True,
                                  version_2=False)
    train = squad_data.SquadSplit(split.path, split.version,
                                  examples=[e for e in split.examples if e.article == 2][:40])
    tokenizer = checkpoint.load_tokenizer(str(minilm_dir))
    return FAMILY.prepare_splits("squad1", train, train, tokenizer, 192).train


def _trainer_losses(minilm_dir, ours, windows, order, cfg, tmp_path, masked: bool):
    """Per-step losses and the trained model of the Trainer's run over `order`."""
    import transformers

    from peers import trainer_runs

    peer = transformers.BertForQuestionAnswering.from_pretrained(
        str(minilm_dir), attn_implementation="sdpa", hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0)
    with torch.no_grad():
        peer.qa_outputs.weight.copy_(ours.qa_outputs.weight)
        peer.qa_outputs.bias.copy_(ours.qa_outputs.bias)

    trainer_class = trainer_runs.MaskedSpanLoss if masked else transformers.Trainer
    trainer = trainer_runs.in_order(trainer_class)(
        model=peer, args=trainer_runs.step_arguments(cfg, 1e-4, 1, str(tmp_path)),
        train_dataset=trainer_runs.SquadWindows(windows, True, order), data_collator=transformers.DataCollatorWithPadding(
            transformers.AutoTokenizer.from_pretrained(str(minilm_dir))))
    trainer.train()
    return trainer_runs.step_losses(trainer), peer


def test_training_run_matches_the_trainer_once_its_loss_leaves_out_padding(
        minilm_dir, normans_windows, tmp_path):
    """Packed windows, the span loss, AdamW groups, warmup and decay and clipping: loss for loss
    the Trainer's padded run when its loss masks padding; its stock loss takes other steps."""
    windows = normans_windows
    cfg = FinetuneConfig(max_seq_length=192, batch_size=8, epochs=1.0,
                              learning_rates=(1e-4,), seeds=(1,), progress=False, bf16=False,
                              device="cpu")
    encoder = checkpoint.load_encoder(str(minilm_dir))
    ours = without_dropout(loop.build_model(FAMILY, encoder, "squad1", seed=1))
    start = {k: v.clone() for k, v in ours.state_dict().items()}
    order = [i for batch in loop.batch_indices(len(windows), cfg.batch_size,
                                               torch.Generator().manual_seed(1)) for i in batch]
    lengths = np.array([len(windows.input_ids[i]) for i in order])
    batches = [lengths[i:i + cfg.batch_size] for i in range(0, len(order), cfg.batch_size)]
    assert all(b.min() < b.max() for b in batches)  # every batch pads in the Trainer's layout

    masked, peer = _trainer_losses(minilm_dir, ours, windows, order, cfg, tmp_path / "m", True)
    stock, _ = _trainer_losses(minilm_dir, ours, windows, order, cfg, tmp_path / "s", False)
    our_losses = loop.train(FAMILY, ours, windows, 1e-4, 1, cfg)
    assert len(our_losses) == len(masked) == len(stock) == len(batches)
    np.testing.assert_allclose(our_losses, masked, atol=1e-4)  # measured: 4.8e-7 over 8 steps
    assert our_losses[-1] < our_losses[0] - 0.2  # the curve moves (4.820 -> 4.571 measured)
    torch.testing.assert_close(ours.qa_outputs.weight.detach(), peer.qa_outputs.weight.detach(),
                               atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours.state_dict()["bert.layers.5.output.weight"],
                               peer.state_dict()["bert.encoder.layer.5.output.dense.weight"],
                               atol=1e-5, rtol=1e-4)
    # The stock loss adds the padded positions to each softmax (as BERT's run_squad.py does,
    # its windows padded to max_seq_length): a higher loss from step 1 (5.256 vs 4.820).
    assert stock[0] > masked[0] + 0.2
    assert not torch.equal(start["qa_outputs.weight"], ours.qa_outputs.weight)
