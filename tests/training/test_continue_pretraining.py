"""Continued pre-training (`model.init_from`) on the real MiniLM checkpoint and the shared books.

Shards: `pipelines.make_shards` (64 tokens) on two books' first paragraphs with MiniLM's
vocabulary. The model's shape, weights and vocabulary come from the checkpoint; contradicting
settings, shards of another vocabulary and missing heads are named; the flow takes the
checkpoint's vocabulary instead of training one.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from common import settings
from model.heads import BertForPreTraining
from model.hf import (
    export_hf_folder,
    find_starting_point,
    load_hf_encoder,
    read_starting_weights,
    save_checkpoint,
)
from tests.support.shard_fixtures import book_corpus
from training import checkpoint, pretrain
from training import config as cfg
from training.config import PhaseConfig

FRESH_HEADS = ["mlm.bias", "mlm.dense.weight", "mlm.dense.bias", "mlm.norm.weight",
               "mlm.norm.bias", "nsp.weight", "nsp.bias"]
"""What a BertModel checkpoint (MiniLM) lacks of BertForPreTraining: the MLM transform and bias
(the decoder is the tied word embedding) and the NSP classifier."""


def shards_with(vocab: Path, corpus: Path, out: Path) -> Path:
    from pipelines import make_shards
    make_shards.main(["--input", str(corpus), "--vocab", str(vocab), "--dupe_factor", "1",
                     "--validation_fraction", "0", "--output", str(out), "--num_shards", "1",
                     "--max_seq_length", "64", "--max_predictions_per_seq", "10"])
    return out


@pytest.fixture(scope="module")
def corpus(shared_data, tmp_path_factory) -> Path:
    return book_corpus(shared_data / "books", tmp_path_factory.mktemp("corpus"), 60)


@pytest.fixture(scope="module")
def minilm_shards(minilm_dir, corpus, tmp_path_factory) -> Path:
    return shards_with(minilm_dir, corpus, tmp_path_factory.mktemp("minilm_shards"))


def run_config(init_from, shards: Path, output: Path, steps: int = 3, learning_rate: float = 1e-3,
               **sections):
    """A one-phase run from `init_from`; `sections`: mappings of their settings, as `--set`
    gives them (`engine={"zero_stage": 3}`)."""
    phase = PhaseConfig(name="phase1", train_shards=str(shards), max_seq_length=64,
                        micro_batch_size=4, global_batch_size=4, steps=steps, warmup_steps=0,
                        learning_rate=learning_rate)
    config = cfg.PretrainConfig(
        model=cfg.ModelConfig(preset="", init_from=str(init_from), dropout=0.0),
        data=cfg.PretrainDataConfig(num_workers=0, shuffle_buffer=64),
        cadence=cfg.CadenceConfig(log_every=1, eval_every=0, eval_batches=0, checkpoint_every=0,
                                  export_hf=False),
        output_dir=str(output), phases=(phase,), seed=7)
    return settings.apply(config, sections)


def manifest_of(shards: Path) -> dict:
    return json.loads((shards / "manifest.json").read_text())


def test_the_checkpoint_decides_the_shape_and_missing_heads_are_listed(minilm_dir, minilm_shards,
                                                                       caplog):
    config = cfg.resolve("tiny", assignments=[f"model.init_from={minilm_dir}"])
    assert config.model.preset == ""  # the tiny preset's bert_tiny gives way to the checkpoint
    assert pretrain.with_checkpoint_vocab(config).data.vocab_dir == str(minilm_dir)
    with caplog.at_level(logging.INFO, logger="training.init_from"):
        model = pretrain.build_model(config, manifest_of(minilm_shards), initial=True)
    shape = model.config
    assert (shape.num_hidden_layers, shape.hidden_size, shape.num_attention_heads,
            shape.intermediate_size, shape.vocab_size, shape.max_position_embeddings,
            shape.type_vocab_size, shape.embedding_rows) == (6, 384, 12, 1536, 30522, 512, 2,
                                                             30528)
    assert f"no weights for {', '.join(FRESH_HEADS)}; initialised as BERT does" in caplog.text
    # The encoder holds exactly the checkpoint's weights (read by the Hugging Face importer).
    reference = load_hf_encoder(str(minilm_dir)).state_dict()
    ours = model.bert.state_dict()
    assert torch.equal(ours["embeddings.word.weight"][:30522],
                       reference["embeddings.word.weight"])
    for key, value in reference.items():
        if key != "embeddings.word.weight":
            assert torch.equal(ours[key], value), key
    assert torch.equal(model.mlm.bias, torch.zeros(30522))  # fresh: BERT starts it at 0


def test_settings_that_contradict_the_checkpoint_name_both_values(minilm_dir, minilm_shards,
                                                                  tmp_path):
    manifest = manifest_of(minilm_shards)
    config = cfg.resolve("tiny", assignments=[f"model.init_from={minilm_dir}",
                                              "model.preset=bert_tiny"])
    with pytest.raises(ValueError, match=r"--set model.preset=bert_tiny has num_hidden_layers=2, "
                       rf"but model.init_from={minilm_dir} \(.*config.json\) has "
                       "num_hidden_layers=6"):
        pretrain.model_config(config, manifest)
    shallow = cfg.resolve("tiny", assignments=[f"model.init_from={minilm_dir}",
                                               "model.num_hidden_layers=4"])
    with pytest.raises(ValueError, match=r"--set model.num_hidden_layers=4, but "
                       rf"model.init_from={minilm_dir} \(.*config.json\) has "
                       "num_hidden_layers=6"):
        pretrain.model_config(shallow, manifest)
    long = cfg.resolve("tiny", assignments=[f"model.init_from={minilm_dir}",
                                            "phase2.max_seq_length=1024"])
    with pytest.raises(ValueError, match=r"--set phase2.max_seq_length=1024, but .* has "
                       "max_position_embeddings 512"):
        pretrain.model_config(long, manifest)
    other = tmp_path / "other"
    other.mkdir()
    tokens = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (other / "vocab.txt").write_text("\n".join(tokens[:-1]) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"--set data.vocab_dir={other} holds 30521 tokens, "
                       "but .* has vocab_size 30522"):
        pretrain.model_config(settings.apply(config, {"model": {"preset": ""},
                                                      "data": {"vocab_dir": str(other)}}),
                              manifest)
    with pytest.raises(ValueError, match=rf"--set data.vocab_dir={other} holds other tokens than "
                       rf"model.init_from={minilm_dir}'s vocabulary"):
        pretrain.with_checkpoint_vocab(settings.apply(config, {"data": {"vocab_dir": str(other)}}))
    with pytest.raises(ValueError, match=r"--set model.preset: must be one of .* \(or empty "
                       "with init_from\\)"):
        cfg.resolve("tiny", assignments=["model.preset="])


def test_bert_pretrain_names_a_contradiction_or_a_missing_checkpoint_in_one_line(
        minilm_dir, minilm_shards, tmp_path, capsys):
    run_file = tmp_path / "run.yaml"
    run_file.write_text(json.dumps({"output_dir": str(tmp_path / "run"),
                                    "cadence": {"export_hf": False},
                                    "phases": [{"name": "phase1", "max_seq_length": 64,
                                                "train_shards": str(minilm_shards)}]}))
    for setting, message in (
            ("model.preset=bert_tiny", (
                f"--set model.preset=bert_tiny has num_hidden_layers=2, but "
                f"model.init_from={minilm_dir} ({minilm_dir}/config.json) has "
                "num_hidden_layers=6")),
            ("model.init_from=" + str(tmp_path / "nothing"),
             f"{tmp_path}/nothing: not a BERT checkpoint")):
        with pytest.raises(SystemExit) as stopped:
            pretrain.main(["--config", str(run_file), "--set", f"model.init_from={minilm_dir}",
                           "--set", setting])
        assert stopped.value.code == 2
        assert f"bert-pretrain: error: {message}" in capsys.readouterr().err


def test_our_checkpoint_and_run_folders_are_starting_points_too(tmp_path):
    """`save_checkpoint`'s format, a run folder's `hf/` export, and a folder that is neither."""
    from common.tokenization import SPECIAL_TOKENS, save_tokenizer_folder
    from model.bert import bert_tiny
    letters = [*SPECIAL_TOKENS, *"abcdefghijklmnopqrstuvwxyz"]
    save_tokenizer_folder(letters, str(tmp_path / "letters"))
    torch.manual_seed(0)
    model = BertForPreTraining(bert_tiny(vocab_size=len(letters)), next_sentence=False)
    save_checkpoint(model, str(tmp_path / "ours"))
    start = find_starting_point(str(tmp_path / "ours"))
    assert start.config == model.config and start.weights_file.endswith("bert.safetensors")
    state, ignored = read_starting_weights(start)
    assert ignored == [] and all(torch.equal(state[k], v) for k, v in model.state_dict().items()
                                 if k != "mlm.decoder.weight")
    export_hf_folder(model, str(tmp_path / "letters"), str(tmp_path / "run" / "hf"))
    run = find_starting_point(str(tmp_path / "run"))
    assert run.folder == str(tmp_path / "run" / "hf") and run.config.num_hidden_layers == 2
    state, _ = read_starting_weights(run)
    assert torch.equal(state["mlm.dense.weight"], model.mlm.dense.weight)
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path}/ours/missing: not a BERT checkpoint"):
        find_starting_point(str(tmp_path / "ours" / "missing"))


def test_shards_of_another_vocabulary_are_refused_naming_both(minilm_dir, corpus, tmp_path):
    """Same size, two tokens swapped: only the vocabulary's hash tells the shards apart."""
    other = tmp_path / "swapped"
    other.mkdir()
    tokens = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[2000], tokens[2001] = tokens[2001], tokens[2000]
    (other / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    shards = shards_with(other, corpus, tmp_path / "shards")
    config = pretrain.with_checkpoint_vocab(run_config(minilm_dir, shards, tmp_path / "out"))
    with pytest.raises(ValueError, match=rf"phase1.train_shards={shards}: shards made with the "
                       rf"vocabulary {other}/vocab.txt \(sha256 \w{{12}}\), but "
                       rf"model.init_from={minilm_dir} has another \({minilm_dir}/vocab.txt"):
        pretrain.check_phase_inputs(config)


def test_continued_pretraining_starts_far_below_a_model_from_scratch(minilm_dir, minilm_shards,
                                                                     tmp_path):
    """MiniLM's encoder and tied embeddings need only the fresh MLM transform to learn: after a
    few steps its MLM loss is far below that of the same shape from BERT's initialisation, on
    the same shards, batches and seed."""
    torch.manual_seed(0)
    scratch_init = tmp_path / "scratch_init"
    save_checkpoint(BertForPreTraining(find_starting_point(str(minilm_dir)).config),
                    str(scratch_init))
    losses = {}
    for name, init in (("minilm", minilm_dir), ("scratch", scratch_init)):
        config = run_config(init, minilm_shards, tmp_path / name,
                            data={"vocab_dir": str(minilm_dir)})
        pretrain.run(config)
        losses[name] = [r["mlm_loss"] for r in pretrain.read_metrics(str(tmp_path / name))]
    print({k: [round(v, 3) for v in vs] for k, vs in losses.items()})
    # Measured (steps 1-3, warmup 0, lr 1e-3): MiniLM 11.03 7.78 7.94, scratch 10.32 10.05 9.76.
    # Step 1 is scored before any update: both near ln(30522) = 10.3, the fresh MLM transform
    # hiding what the encoder knows; one step of the head and MiniLM's loss is 2 nats lower.
    assert losses["minilm"][0] > 9.5 and losses["scratch"][0] > 9.5
    late = {name: sum(v[1:]) / 2 for name, v in losses.items()}
    assert late["scratch"] - late["minilm"] > 1.5
    assert late["minilm"] < 8.4


def checkpoint_copy(minilm_dir: Path, out: Path, do_lower_case: bool | None = None) -> Path:
    """MiniLM's config, weights and tokenizer files at another path (casing optionally changed)."""
    out.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"):
        shutil.copy(minilm_dir / name, out / name)
    if do_lower_case is not None:
        tokenizer = json.loads((out / "tokenizer_config.json").read_text())
        tokenizer["do_lower_case"] = do_lower_case
        (out / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return out


def test_the_flow_takes_the_checkpoints_vocabulary_and_casing(minilm_dir, corpus, tmp_path):
    """`pretrain.model.init_from`: the vocabulary stage holds the checkpoint's tokens (none trained),
    named by the checkpoint's content, not its path; the shards follow its casing; training gets
    init_from and the checkpoint's shape."""
    from safetensors.torch import load_file, save_file

    from common.tokenization import read_vocab
    from flows import steps
    from flows.checkpoint_vocab import checkpoint_vocab
    from flows.config import resolve
    from flows.stages import StageResult

    root = str(tmp_path / "root")
    vocab = checkpoint_vocab(root, str(minilm_dir))
    assert not vocab.cached and Path(vocab.path).name.startswith("vocab-")
    assert read_vocab(vocab.path) == read_vocab(str(minilm_dir))
    assert json.loads((Path(vocab.path) / "tokenizer_config.json").read_text())[
        "do_lower_case"] is True
    same = checkpoint_vocab(root, str(checkpoint_copy(minilm_dir, tmp_path / "copy")))
    assert same.path == vocab.path and same.cached  # the same checkpoint elsewhere
    retrained = checkpoint_copy(minilm_dir, tmp_path / "retrained")
    weights = load_file(str(retrained / "model.safetensors"))
    weights["pooler.dense.bias"] = weights["pooler.dense.bias"] + 1.0
    save_file(weights, str(retrained / "model.safetensors"))
    assert checkpoint_vocab(root, str(retrained)).path != vocab.path  # other weights, new stage
    cased_dir = checkpoint_copy(minilm_dir, tmp_path / "cased", do_lower_case=False)
    cased = checkpoint_vocab(root, str(cased_dir))
    assert cased.path != vocab.path and cased.manifest["do_lower_case"] is False

    flow = resolve("tiny", {"output": root, "pretrain": {"model": {"init_from": str(cased_dir)}}})
    assert flow.vocab.do_lower_case is True  # the flow's own casing setting, overruled below
    shards = steps.make_shards(flow, StageResult("corpus", str(corpus), "c", False, 0.0), cased, 1)
    assert shards.manifest["options"]["job"]["do_lower_case"] is False
    assert shards.manifest["vocab"]["sha256"] == vocab.manifest["vocab_sha256"]
    config = steps.pretrain_config(flow, cased, [shards, shards], str(tmp_path / "run"))
    assert (config.model.preset, config.model.init_from) == ("", str(cased_dir))
    cfg.save(config, str(tmp_path / "launch_config.json"))  # as the flow hands it to training
    config = cfg.load_saved(str(tmp_path / "launch_config.json"))
    assert pretrain.model_config(config, shards.manifest).num_hidden_layers == 6


def final_weights(output: Path) -> dict[str, torch.Tensor]:
    ckpt = output / "checkpoints"
    return checkpoint.consolidated_state_dict(str(ckpt), (ckpt / "latest").read_text().strip())


def test_zero3_starts_from_the_checkpoint_and_a_restart_resumes_its_own(minilm_dir,
                                                                         minilm_shards, tmp_path):
    """The weights go into the model before deepspeed.initialize partitions it (ZeRO-3); a
    restarted run resumes from its own checkpoint, whatever init_from holds by then."""
    from model.bert import bert_tiny
    start = tmp_path / "tiny"
    torch.manual_seed(123)
    tiny = BertForPreTraining(bert_tiny(vocab_size=30522))
    save_checkpoint(tiny, str(start))
    # One AdamW step of lr 1e-9 moves no weight by more than ~1e-9: the run's weights are the
    # checkpoint's, gathered back from ZeRO-3's partitions.
    pretrain.run(run_config(start, minilm_shards, tmp_path / "zero3", steps=1, learning_rate=1e-9,
                            data={"vocab_dir": str(minilm_dir)}, engine={"zero_stage": 3}))
    trained = final_weights(tmp_path / "zero3")
    for key, value in tiny.state_dict().items():
        if key != "mlm.decoder.weight":
            torch.testing.assert_close(trained[key][:len(value)], value, rtol=0, atol=1e-6)

    def config(output: str):
        return run_config(start, minilm_shards, tmp_path / output, steps=4,
                          data={"vocab_dir": str(minilm_dir)})

    pretrain.run(config("whole"))
    pretrain.run(config("restarted"), stop_after_steps=2)
    torch.manual_seed(321)  # init_from now holds other weights: a restart must not read them
    save_checkpoint(BertForPreTraining(bert_tiny(vocab_size=30522)), str(start))
    pretrain.run(config("restarted"))
    whole, restarted = final_weights(tmp_path / "whole"), final_weights(tmp_path / "restarted")
    assert whole.keys() == restarted.keys()
    assert all(torch.equal(whole[k], restarted[k]) for k in whole)


@pytest.mark.slow
def test_glue_after_continued_pretraining_stays_far_above_from_scratch(shared_data, minilm_dir,
                                                                        minilm_shards, tmp_path):
    """SST-2 dev accuracy (first 512 train rows, 2 epochs; first 200 dev rows) of the exports of
    10 steps of continued pre-training from MiniLM and of 10 steps of the same shape from
    scratch: the continued model keeps what MiniLM knows (benchmarks/RESULTS.md 15 has the
    longer run)."""
    from finetune.glue.cli import main as glue_main

    torch.manual_seed(0)
    scratch_init = tmp_path / "scratch_init"
    save_checkpoint(BertForPreTraining(find_starting_point(str(minilm_dir)).config),
                    str(scratch_init))
    scores = {}
    for name, init in (("minilm", minilm_dir), ("scratch", scratch_init)):
        config = run_config(init, minilm_shards, tmp_path / name, steps=10, learning_rate=5e-4,
                            data={"vocab_dir": str(minilm_dir)}, cadence={"export_hf": True})
        config = dataclasses.replace(config, phases=(dataclasses.replace(
            config.phases[0], micro_batch_size=8, global_batch_size=8, warmup_steps=1),))
        pretrain.run(config)
        out = tmp_path / f"{name}-glue"
        assert glue_main(["--model", str(tmp_path / name / "hf"), "--data",
                          str(shared_data / "glue"), "--tasks", "sst-2", "--output", str(out),
                          "--learning_rates", "1e-4", "--seeds", "1", "--epochs", "2",
                          "--max_train_examples", "512", "--max_eval_examples", "200",
                          "--no_progress", "--device", "cpu"]) == 0
        scores[name] = json.loads((out / "results.json").read_text())["tasks"][0]["score"]
    print(scores)
    # Measured: MiniLM 0.710, scratch 0.530 (chance on this slice; 617 s on the loaded 2-core CPU).
    assert scores["minilm"] - scores["scratch"] > 0.10
    assert scores["minilm"] > 0.65


@pytest.mark.slow
def test_the_flow_continues_pretraining_from_minilm_end_to_end(minilm_dir, tmp_path):
    """`bert-dag --preset tiny --set pretrain.model.init_from=MiniLM` on the bundled sample: no
    vocabulary trained, shards of MiniLM's vocab.txt, a model of MiniLM's shape exported."""
    import hashlib
    import os
    import subprocess
    import sys

    steps = ["pretrain.phase1.steps=2", "pretrain.phase2.steps=1",
             "pretrain.phase1.warmup_steps=0", "pretrain.phase2.warmup_steps=0",
             "pretrain.phase1.micro_batch_size=4", "pretrain.phase1.global_batch_size=4",
             "pretrain.phase2.micro_batch_size=2", "pretrain.phase2.global_batch_size=2",
             "pretrain.engine.precision=fp32", "pretrain.engine.zero_stage=0", "finetune.data="]
    command = [sys.executable, "-m", "flows.cli", "--preset", "tiny", "--output", str(tmp_path),
               "--set", f"pretrain.model.init_from={minilm_dir}"]
    for setting in steps:
        command += ["--set", setting]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    subprocess.run(command, check=True, timeout=1200, env=env, cwd=Path(__file__).parents[2])
    stages = {p.name.rpartition("-")[0]: p for p in tmp_path.iterdir() if p.is_dir()}
    assert json.loads((stages["vocab"] / "manifest.json").read_text())["stage"] == \
        "checkpoint_vocab"
    minilm_vocab = hashlib.sha256((minilm_dir / "vocab.txt").read_bytes()).hexdigest()
    for shards in ("shards128", "shards256"):
        assert json.loads((stages[shards] / "manifest.json").read_text())["vocab"][
            "sha256"] == minilm_vocab
    exported = json.loads((stages["pretrain"] / "hf" / "config.json").read_text())
    assert (exported["num_hidden_layers"], exported["hidden_size"],
            exported["vocab_size"]) == (6, 384, 30522)


def test_the_flow_names_a_missing_checkpoint_before_any_stage_and_takes_its_shape(minilm_dir,
                                                                                 tmp_path):
    """A shape setting beside model.init_from is checked against the checkpoint, not the
    model.preset's (tiny's 128 hidden units would refuse 12 heads); a wrong path fails up front."""
    import os

    from flows.config import check_inputs_exist, resolve

    flow = resolve("tiny", {"pretrain": {"model": {"init_from": str(minilm_dir),
                                                   "num_attention_heads": "12"}}})
    assert (flow.pretrain.model.preset, flow.pretrain.model.num_attention_heads) == ("", 12)
    check_inputs_exist(flow)
    relative = os.path.relpath(minilm_dir)  # one checkpoint, one pretrain stage key
    from_relative = resolve("tiny", {"pretrain": {"model": {"init_from": relative}}})
    assert from_relative.pretrain.model.init_from == str(minilm_dir.resolve())
    missing = str(tmp_path / "no-such-checkpoint")
    with pytest.raises(FileNotFoundError,
                       match=f"^setting pretrain.model.init_from={missing!r}: "):
        check_inputs_exist(resolve("tiny", {"pretrain": {"model": {"init_from": missing}}}))


@pytest.mark.parametrize("saved, setting, named", [
    ("bert_tiny", "model.preset=modernbert_tiny", "modernbert"),
    ("bert_tiny", "model.arch=modernbert", "modernbert"),
    ("modernbert_tiny", "model.preset=bert_tiny", "bert"),
    ("modernbert_tiny", "model.arch=bert", "bert"),
])
def test_a_checkpoint_of_another_arch_is_refused_naming_both(saved, setting, named, tmp_path):
    """`model.init_from` holds one encoder, the run names the other (by preset or arch): one
    line naming both, before any weight is read."""
    from model.encoders import PRESETS, arch_of_preset
    torch.manual_seed(0)
    save_checkpoint(BertForPreTraining(PRESETS[saved](vocab_size=100), next_sentence=False),
                    str(tmp_path / "ckpt"))
    config = cfg.resolve("tiny", assignments=[f"model.init_from={tmp_path / 'ckpt'}", setting])
    with pytest.raises(ValueError) as refused:
        pretrain.model_config(config, {})
    assert str(refused.value) == (
        f"model.init_from={tmp_path / 'ckpt'} ({tmp_path / 'ckpt' / 'bert_config.json'}) holds "
        f"a {arch_of_preset(saved)} encoder, but the run's model is {named} (model.arch / "
        "model.preset): leave them out to take the checkpoint's")


def test_continued_pretraining_from_a_transformers_modernbert_folder(minilm_dir, minilm_shards,
                                                                     tmp_path):
    """A folder transformers' `ModernBertForMaskedLM.save_pretrained` wrote (random weights from
    a seed, MiniLM's vocabulary) starts a run: its shape and every weight, the MLM head's
    included, come from the folder, and DeepSpeed trains on from it."""
    import transformers

    torch.manual_seed(0)
    peer = transformers.ModernBertForMaskedLM(transformers.ModernBertConfig(
        vocab_size=30522, hidden_size=64, num_hidden_layers=3, num_attention_heads=2,
        intermediate_size=96, local_attention=16, pad_token_id=0, max_position_embeddings=256))
    folder = tmp_path / "modernbert"
    peer.save_pretrained(folder)
    shutil.copy(minilm_dir / "vocab.txt", folder / "vocab.txt")
    config = run_config(folder, minilm_shards, tmp_path / "run", steps=2)
    model = pretrain.build_model(config, manifest_of(minilm_shards), initial=True)
    shape = model.config
    assert (type(shape).arch, shape.num_hidden_layers, shape.hidden_size, shape.local_attention,
            shape.max_position_embeddings, shape.embedding_rows) == (
        "modernbert", 3, 64, 16, 256, 30528)
    theirs = peer.state_dict()
    ours = model.state_dict()
    assert torch.equal(ours["bert.embeddings.word.weight"][:30522],
                       theirs["model.embeddings.tok_embeddings.weight"])
    assert torch.equal(ours["mlm.dense.weight"], theirs["head.dense.weight"])
    assert torch.equal(ours["mlm.bias"], theirs["decoder.bias"])
    assert torch.equal(ours["bert.final_norm.weight"], theirs["model.final_norm.weight"])
    result = pretrain.run(config)
    assert result["complete"] and len(
        [r for r in pretrain.read_metrics(str(tmp_path / "run")) if r["split"] == "train"]) == 2
