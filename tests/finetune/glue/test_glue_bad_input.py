"""GLUE bad input: found before any training, reported in one line naming the file; finished tasks
kept, skipped rows in the dead-letter file."""

from __future__ import annotations

import contextlib
import io
import json
import logging
from types import SimpleNamespace

import pytest

from finetune import checkpoint
from finetune.glue import data as glue_data
from finetune.glue.cli import main as glue_main
from finetune.glue.family import FAMILY
from finetune.glue.tasks import TASKS
from finetune.options import FinetuneConfig
from tests.support.glue_fixtures import glue_slice


def _check_fits(encoder, tokenizer, tasks, cfg: FinetuneConfig, model_dir: str,
                tokenizer_dir: str) -> None:
    """What bert-glue checks of the model before training: the checkpoint's fit, then GLUE's."""
    checkpoint.check_model_fits(encoder, tokenizer, cfg.max_seq_length, model_dir, tokenizer_dir)
    for task in tasks:
        FAMILY.check_model(encoder, task.name, model_dir)


# ---------------------------------------------------------------------------------------------
# Bad input: found before any training, reported in one line naming the file; finished tasks kept
# ---------------------------------------------------------------------------------------------


def _tiny_args(model, data, output, tasks: str, *extra: str) -> list[str]:
    return ["--model", str(model), "--data", str(data), "--tasks", tasks, "--output", str(output),
            "--learning_rates", "5e-5", "--seeds", "1", "--epochs", "1", "--batch_size", "16",
            "--no_test", "--no_progress", *extra]


def test_tokenizer_with_more_ids_than_the_model_is_an_error(minilm_dir, tmp_path, capsys):
    """MiniLM's vocabulary + 8 new tokens: ids 30522..30529 have no embedding row. Found before
    any training (it used to end in "IndexError: index out of range in self")."""
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "vocab.txt").write_text(
        "\n".join(vocab + [f"newtoken{i}" for i in range(8)]) + "\n", encoding="utf-8")
    data = tmp_path / "glue" / "RTE"
    data.mkdir(parents=True)
    for name in ("train.tsv", "dev.tsv"):  # every word is a new token: ids >= 30522
        (data / name).write_text("index\tsentence1\tsentence2\tlabel\n0\tnewtoken1 newtoken7\t"
                                 "newtoken3\tentailment\n", encoding="utf-8")
    code = glue_main(_tiny_args(minilm_dir, tmp_path / "glue", tmp_path / "out", "rte",
                                "--vocab", str(tmp_path / "vocab")))
    assert code == 2
    assert capsys.readouterr().err == (
        f"bert-glue: error: tokenizer of {tmp_path}/vocab gives token ids up to 30529 (30530 "
        f"ids) but the model {minilm_dir} has vocab_size 30522: use the model's own vocabulary "
        "(--vocab)\n")
    assert not (tmp_path / "out" / "results.json").exists()


def test_model_checks_before_training(minilm_dir, encoder, tokenizer, tmp_path, caplog):
    """A smaller vocabulary warns; lengths and token types the model cannot embed are errors."""
    from model.bert import BertModel, bert_tiny

    rte, sst2 = TASKS["RTE"], TASKS["SST-2"]
    cfg = FinetuneConfig()
    with caplog.at_level("WARNING", logger="finetune.checkpoint"):
        _check_fits(encoder, tokenizer, [rte], cfg, "ck", "tok")
    assert caplog.messages == []  # MiniLM's own tokenizer: 30522 ids, vocab_size 30522
    lines = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "vocab.txt").write_text("\n".join(lines[:500]) + "\n", encoding="utf-8")
    small = glue_data.load_glue_tokenizer(str(tmp_path))
    with caplog.at_level("WARNING", logger="finetune.checkpoint"):
        _check_fits(encoder, small, [rte], cfg, "ck", "tok")
    assert caplog.messages == [("tokenizer of tok has 500 token ids but the model ck has "
                                "vocab_size 30522: check that it is the vocabulary the model "
                                "was trained with")]
    short = BertModel(bert_tiny(max_position_embeddings=64))
    with pytest.raises(ValueError, match="--max_seq_length 128 exceeds the model's "
                                         r"max_position_embeddings 64 \(ck\)"):
        _check_fits(short, tokenizer, [rte], cfg, "ck", "tok")
    _check_fits(short, tokenizer, [rte], FinetuneConfig(max_seq_length=64), "ck", "t")
    one_type = BertModel(bert_tiny(type_vocab_size=1))
    with pytest.raises(ValueError, match="RTE: sentence pairs need 2 token types but the model "
                                         "ck has type_vocab_size 1"):
        _check_fits(one_type, tokenizer, [sst2, rte], cfg, "ck", "tok")
    _check_fits(one_type, tokenizer, [sst2], cfg, "ck", "tok")  # one sentence: type 0


def test_weights_not_matching_the_config_name_the_folder(minilm_dir, tmp_path):
    """A config.json of another vocabulary size next to MiniLM's weights."""
    folder = tmp_path / "ck"
    folder.mkdir()
    (folder / "model.safetensors").symlink_to(minilm_dir / "model.safetensors")
    config = json.loads((minilm_dir / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"vocab_size": 30000}))
    with pytest.raises(ValueError) as error:
        checkpoint.load_encoder(str(folder))
    assert str(error.value) == (
        f"--model {folder}: the weights do not match config.json: bert.embeddings.word.weight "
        "is [30522, 384] in the weights but [30000, 384] by config.json")
    (folder / "config.json").write_text("{")
    with pytest.raises(ValueError, match=rf"--model {folder}: config.json is not JSON"):
        checkpoint.load_encoder(str(folder))
    (folder / "config.json").write_text(json.dumps(config | {"num_attention_heads": 5}))
    with pytest.raises(ValueError) as error:
        checkpoint.load_encoder(str(folder))
    assert str(error.value) == (f"{folder}/config.json: hidden_size 384 is not a multiple of "
                                "num_attention_heads 5")


def test_missing_task_data_fails_before_any_training(shared_data, minilm_dir, tmp_path,
                                                     capsys, caplog):
    """--tasks rte,mrpc without MRPC: one error listing MRPC's files, and RTE never trains
    (it used to fine-tune RTE first, then fail with a traceback and no results)."""
    data = glue_slice(shared_data, tmp_path / "glue", {"RTE/train.tsv": 4, "RTE/dev.tsv": 4})
    with caplog.at_level("INFO", logger="finetune.loop"):
        code = glue_main(_tiny_args(minilm_dir, data, tmp_path / "out", "rte,mrpc"))
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"bert-glue: error: --data {data}: 2 problem(s) found before any fine-tuning:",
        (f"  MRPC train: neither {data}/MRPC/train.tsv nor a Hugging Face mrpc/train.* file "
         f"under {data}"),
        (f"  MRPC dev: neither {data}/MRPC/dev.tsv nor a Hugging Face mrpc/validation.* file "
         f"under {data}")]
    assert not [m for m in caplog.messages if m.startswith("RTE lr=")]  # nothing trained


@pytest.fixture(scope="module")
def failed_run(shared_data, minilm_dir, tmp_path_factory):
    """One `bert-glue --tasks rte,mrpc --skip_bad_rows` on real slices: RTE's train file has
    two malformed rows (set aside), MRPC's train file a Latin-1 byte on line 150 (~33 kB in,
    past what the header check reads; bad text cannot be set aside). Shared by two tests: one
    fine-tuning run (a MiniLM step) is the slow part."""
    root = tmp_path_factory.mktemp("failed_run")
    data = glue_slice(shared_data, root / "glue", {
        "RTE/train.tsv": 6, "RTE/dev.tsv": 4, "MRPC/train.tsv": 200, "MRPC/dev.tsv": 4})
    train = (data / "RTE" / "train.tsv").read_text(encoding="utf-8").split("\n")
    train[3] = train[3].rsplit("\t", 1)[0]  # line 4: no label field
    train[5] = train[5].rsplit("\t", 1)[0] + "\tentailed"  # line 6: unknown label
    (data / "RTE" / "train.tsv").write_text("\n".join(train), encoding="utf-8")
    mrpc = (data / "MRPC" / "train.tsv").read_bytes().split(b"\n")
    assert len(b"\n".join(mrpc[:149])) > 30_000
    mrpc[149] = mrpc[149].replace(b"e", b"\xe9", 1)
    (data / "MRPC" / "train.tsv").write_bytes(b"\n".join(mrpc))
    out = root / "out"
    stderr, warnings = io.StringIO(), []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger().addHandler(handler)
    try:
        with contextlib.redirect_stderr(stderr):
            code = glue_main(_tiny_args(minilm_dir, data, out, "rte,mrpc", "--skip_bad_rows"))
    finally:
        logging.getLogger().removeHandler(handler)
    return SimpleNamespace(code=code, stderr=stderr.getvalue(), warnings=warnings, data=data,
                           out=out, rte_train=train)


def test_finished_tasks_are_kept_when_a_later_task_fails(failed_run):
    """MRPC fails after RTE finished: exit 2 naming MRPC's file and line, and RTE's results are
    on disk with MRPC listed as pending (they used to be lost with a traceback)."""
    data, out = failed_run.data, failed_run.out
    assert failed_run.code == 2
    assert failed_run.stderr.splitlines() == [
        (f"bert-glue: error: {data}/MRPC/train.tsv:150: not UTF-8 text (invalid continuation "
         "byte, byte 0xe9)"),
        f"bert-glue: the results of RTE (finished before the error) are in {out}"]
    summary = json.loads((out / "results.json").read_text())
    assert [t["task"] for t in summary["tasks"]] == ["RTE"]
    assert summary["pending_tasks"] == ["MRPC"]
    assert [r["steps"] for r in summary["tasks"][0]["runs"]] == [1]
    assert summary["glue_score"] == summary["tasks"][0]["score"]
    assert "| RTE | accuracy" in (out / "results.md").read_text()
    assert not list(out.rglob("*.tmp"))


def test_skipped_rows_go_to_the_dead_letter_file(failed_run):
    """--skip_bad_rows: each row set aside is written with its file, line, reason and text, and
    the file is named in the log and in results.json."""
    train, out = failed_run.rte_train, failed_run.out
    dead_letter = out / "dead_letter" / "glue_bad_rows.jsonl"
    records = [json.loads(line) for line in dead_letter.read_text(encoding="utf-8").splitlines()]
    path = str(failed_run.data / "RTE" / "train.tsv")
    assert records == [
        {"task": "RTE", "file": path, "record": "line 4", "text": train[3],
         "reason": "expected 4 tab-separated fields, found 3"},
        {"task": "RTE", "file": path, "record": "line 6", "text": train[5],
         "reason": "label 'entailed' is not one of ['entailment', 'not_entailment']"}]
    summary = json.loads((out / "results.json").read_text())
    assert (summary["bad_rows"], summary["dead_letter"]) == (2, str(dead_letter))
    (task,) = summary["tasks"]
    assert (task["bad_rows"], task["num_train_examples"]) == (2, 4)
    assert "bad_records" not in task  # in the dead-letter file, not repeated here
    assert (f"2 malformed row(s) set aside (--skip_bad_rows) in {dead_letter}"
            in failed_run.warnings)


def test_other_bad_inputs_end_in_one_line(shared_data, minilm_dir, tmp_path, capsys):
    """No traceback for an --output that is a file, a train file without rows, a missing
    --model folder; --debug keeps the traceback."""
    data = glue_slice(shared_data, tmp_path / "glue", {"RTE/train.tsv": 0, "RTE/dev.tsv": 4})
    (tmp_path / "file").write_text("x")
    cases = {
        (str(minilm_dir), str(tmp_path / "file")):
            f"--output {tmp_path}/file: exists and is not a folder",
        (str(minilm_dir), str(tmp_path / "out")): f"{data}/RTE/train.tsv: no RTE train examples",
        (str(tmp_path / "nothing"), str(tmp_path / "out")):
            f"--model {tmp_path}/nothing: no bert_config.json or config.json",
    }
    for (model, output), message in cases.items():
        assert glue_main(_tiny_args(model, data, output, "rte")) == 2
        assert capsys.readouterr().err == f"bert-glue: error: {message}\n"
    with pytest.raises(glue_data.GlueFormatError, match="no RTE train examples"):
        glue_main(_tiny_args(minilm_dir, data, tmp_path / "out", "rte", "--debug"))
