"""GLUE fine-tuning's recipe pieces: packing, the schedule, weight decay, validation, the device,
bf16, our checkpoint format, the CLI's flags."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from finetune import checkpoint, loop
from finetune.family import Prepared, to_device
from finetune.glue import data as glue_data
from finetune.glue import family as gf
from finetune.glue.cli import main as glue_main
from finetune.glue.family import FAMILY
from finetune.glue.tasks import TASKS
from finetune.options import FinetuneConfig, resolve_device
from tests.finetune.glue.glue_runs import _optimizer_and_schedule, _prepare
from training.optim import LinearWarmupDecay

NO_TEST = dataclasses.replace(FAMILY, predict_test=False)


def test_pack_rows_first_fit_decreasing():
    # Longest first: 9 opens row 0, 7 row 1, 5 row 2; 3 fits row 1 (room 3), 1 fits row 0.
    assert gf.pack_rows([3, 9, 5, 7, 1], row_length=10) == [[1, 4], [3, 0], [2]]
    assert gf.pack_rows([4, 4, 4], row_length=4) == [[0], [1], [2]]
    with pytest.raises(ValueError, match="exceeds the row length 8"):
        gf.pack_rows([9], row_length=8)


def test_packed_batch_gives_the_padded_logits(shared_data, encoder, tokenizer):
    """Packing changes the layout only: each example's logits equal the plain head's."""
    task = TASKS["MRPC"]
    split = glue_data.read_split(str(shared_data / "glue"), task, task.dev[0])
    encoded = glue_data.encode_split(tokenizer, split, task)
    model = loop.build_model(FAMILY, encoder, task.name, seed=1).eval()
    indices = list(range(100, 132))
    packed = gf.pack_batch(encoded, indices)
    assert packed.input_ids.shape[0] < len(indices)  # fewer rows than examples
    assert packed.input_ids.shape[1] == max(len(encoded.input_ids[i]) for i in indices)
    assert int((packed.sequence_ids >= 0).sum()) == sum(len(encoded.input_ids[i]) for i in indices)
    plain = glue_data.collate(encoded, indices)
    with torch.no_grad():
        expected = model(plain.input_ids, plain.token_type_ids, plain.attention_mask).logits
        got = gf.classifier_logits(model, packed)
        padded = gf.classifier_logits(model, gf.padded_batch(encoded, indices))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(padded, expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(packed.labels, plain.labels)


def test_schedule_matches_transformers():
    from transformers import get_linear_schedule_with_warmup

    total, warmup = 50, 5  # ceil(0.1 * 50)
    ours_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-5)
    peer_opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-5)
    ours = LinearWarmupDecay(ours_opt, 2e-5, warmup, total)
    peer = get_linear_schedule_with_warmup(peer_opt, warmup, total)
    for _ in range(total):
        assert ours.get_last_lr() == pytest.approx(peer.get_last_lr(), abs=1e-15)
        ours_opt.step(), peer_opt.step(), ours.step(), peer.step()
    assert ours.get_last_lr() == [0.0]
    cfg = FinetuneConfig()
    assert loop.num_training_steps(2490, cfg) == 234  # RTE: ceil(2490 / 32) * 3


def test_optimizer_skips_decay_on_biases_and_layernorm(encoder):
    model = loop.build_model(FAMILY, encoder, "RTE", seed=1)
    optimizer = loop.build_optimizer(model, 3e-5, FinetuneConfig())
    decay, no_decay = optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.01, 0.0)
    # MiniLM: 6 layers x (4 weight matrices) + 3 embeddings + pooler + classifier = 29 matrices;
    # the rest are 6 x (4 biases + 2 norms x 2) + embedding norm (2) + pooler/classifier biases.
    assert len(decay["params"]) == 29
    assert len(no_decay["params"]) == 6 * 8 + 2 + 2
    assert no_decay["eps"] == 1e-6 and decay["lr"] == 3e-5


def test_config_validation_names_the_flag():
    with pytest.raises(ValueError, match="--learning_rates"):
        FinetuneConfig(learning_rates=())
    with pytest.raises(ValueError, match="--seeds"):
        FinetuneConfig(seeds=(1, 1))
    with pytest.raises(ValueError, match="--max_train_examples"):
        FinetuneConfig(max_train_examples=0)
    with pytest.raises(ValueError, match="--device must be auto, cpu, cuda or cuda:N, got 'gpu0'"):
        FinetuneConfig(device="gpu0")
    assert gf.paper_recipe().learning_rates == (5e-5, 4e-5, 3e-5, 2e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none here)")
def test_a_fine_tuning_run_on_the_gpu_scores_as_on_the_cpu(shared_data, encoder, tokenizer):
    """The GPU path end to end on a real slice: train, predict, score; dropout off, so both
    devices compute the same function (up to float rounding)."""
    task = TASKS["RTE"]
    split = glue_data.read_split(str(shared_data / "glue"), task, task.dev[0])
    encoded = glue_data.encode_split(tokenizer, glue_data.GlueSplit(
        task.name, "dev", split.path, examples=split.examples[:64]), task)
    prepared = Prepared(task.name, encoded, {task.dev[0].name: encoded}, len(encoded),
                        {"dev": len(encoded)}, context=gf.GlueContext(task, {}))
    scores = {}
    for device in ("cpu", "cuda"):
        # float32 on both (bf16 is the GPU's default): the same function on either device
        cfg = FinetuneConfig(learning_rates=(1e-4,), seeds=(1,), epochs=1.0, progress=False,
                                  device=device, bf16=False)
        result, model = loop.run_one(FAMILY, _without_dropout_encoder(encoder), prepared, 1e-4, 1,
                                     cfg)
        assert {p.device.type for p in model.parameters()} == {device}
        scores[device] = result.score
    assert scores["cuda"] == pytest.approx(scores["cpu"], abs=0.02)


def _without_dropout_encoder(encoder):
    from model.bert import BertModel

    plain = BertModel(encoder.config.replace(hidden_dropout_prob=0.0,
                                             attention_probs_dropout_prob=0.0))
    plain.load_state_dict(encoder.state_dict())
    return plain


def test_device_is_the_gpu_when_torch_sees_one_and_a_missing_gpu_is_named():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert resolve_device("auto") == torch.device("cuda" if gpus else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match=f"--device cuda:{gpus}: torch sees {gpus} GPU\\(s\\)"):
        resolve_device(f"cuda:{gpus}")


def test_batches_and_model_go_to_the_device(shared_data, encoder, tokenizer):
    """The CPU half of the GPU path: a batch moves with `to_device` unchanged, the model is
    built on the device, and a training step runs there."""
    task = TASKS["RTE"]
    split = glue_data.read_split(str(shared_data / "glue"), task, task.dev[0])
    encoded = glue_data.encode_split(tokenizer, glue_data.GlueSplit(
        task.name, "dev", split.path, examples=split.examples[:8]), task)
    batch = gf.pack_batch(encoded, list(range(8)))
    assert to_device(batch, torch.device("cpu")) is batch  # already there: not copied
    cfg = FinetuneConfig(learning_rates=(1e-4,), seeds=(1,), progress=False)
    model = loop.build_model(FAMILY, encoder, task.name, seed=1,
                             device=resolve_device("cpu"))
    assert {p.device.type for p in model.parameters()} == {"cpu"}
    torch.manual_seed(0)
    loss = loop.train_step(FAMILY, model, batch, *_optimizer_and_schedule(model, cfg), cfg)
    assert 0.5 < loss < 1.0  # two classes from a fresh head: about ln 2


def test_bf16_run(shared_data, encoder, tokenizer):
    """The bf16 autocast option trains and scores (one step on real STS-B rows), the classifier
    computing in bf16 in the training step and in prediction."""
    cfg = gf.debug_recipe(max_train_examples=32, max_eval_examples=48, progress=False, bf16=True)
    prepared = _prepare("STS-B", str(shared_data / "glue"), tokenizer, cfg, NO_TEST)
    outputs = []  # (module, training?, output dtype) of every module's forward during the run

    def record(module, inputs, output):
        if isinstance(output, torch.Tensor):
            outputs.append((module, module.training, output.dtype))

    # A global hook: run_one builds its classifier inside; it is picked out after the run.
    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        result, model = loop.run_one(FAMILY, encoder, prepared, 5e-5, 1, cfg)
    finally:
        hook.remove()
    assert result.steps == 1 and np.isfinite(result.final_loss)
    assert set(result.metrics) == {"pearson", "spearman"}
    assert all(-1.0 <= v <= 1.0 for v in result.metrics.values())
    # One training batch, then the 48 dev rows in one prediction batch.
    assert [(training, dtype) for module, training, dtype in outputs
            if module is model.classifier] == [(True, torch.bfloat16), (False, torch.bfloat16)]


def test_starts_from_our_checkpoint_format(encoder, tmp_path):
    """A `model.hf.save_checkpoint` folder loads as the same encoder as the HF folder."""
    from model.hf import save_checkpoint

    save_checkpoint(encoder, str(tmp_path))
    reloaded = checkpoint.load_encoder(str(tmp_path))
    assert reloaded.state_dict().keys() == encoder.state_dict().keys()
    for key, value in encoder.state_dict().items():
        assert torch.equal(reloaded.state_dict()[key], value), key
    with pytest.raises(FileNotFoundError, match="no bert_config.json or config.json"):
        checkpoint.load_encoder(str(tmp_path / "missing"))


def test_cli_rejects_bad_flags(tmp_path, capsys):
    base = ["--model", str(tmp_path), "--data", str(tmp_path), "--output", str(tmp_path)]
    with pytest.raises(SystemExit):
        glue_main([*base, "--tasks", "rte,squad"])
    assert "unknown GLUE task 'squad'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        glue_main([*base, "--tasks", "rte", "--learning_rates", "0"])
    assert "--learning_rates: must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        glue_main([*base, "--tasks", "rte", "--adam_epsilon", "0"])
    assert "--adam_epsilon: must be > 0, got 0.0" in capsys.readouterr().err
    if not torch.cuda.is_available():  # a GPU that is not there: one line, before any work
        assert glue_main([*base, "--tasks", "rte", "--device", "cuda"]) == 2
        assert capsys.readouterr().err == \
            "bert-glue: error: --device cuda: torch sees 0 GPU(s) here\n"


def test_cli_optimizer_flags_reach_the_config():
    from finetune.glue.cli import build_parser, config_from_args

    base = ["--model", "m", "--data", "d", "--output", "o", "--tasks", "rte"]
    assert config_from_args(build_parser().parse_args(base)) == gf.paper_recipe()
    cfg = config_from_args(build_parser().parse_args(
        [*base, "--weight_decay", "0", "--adam_epsilon", "1e-8", "--max_grad_norm", "0"]))
    assert (cfg.weight_decay, cfg.adam_epsilon, cfg.max_grad_norm) == (0.0, 1e-8, 0.0)
