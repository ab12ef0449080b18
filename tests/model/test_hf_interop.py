"""Hugging Face interop: the real MiniLM checkpoint in our model, export to a folder that
`transformers` loads offline with the same outputs, and exact round trips."""
from __future__ import annotations

import csv
import json
import re
import shutil

import pytest
import torch
import transformers

from common.tokenization import load_tokenizer
from model.bert import bert_tiny
from model.heads import BertForPreTraining, BertForSequenceClassification
from model.hf import export_hf_folder, load_checkpoint, load_hf_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def mrpc_pairs(shared_data) -> list[tuple[str, str]]:
    """Eight real sentence pairs (MRPC dev), of very different lengths once tokenized."""
    with open(shared_data / "glue" / "MRPC" / "dev.tsv", encoding="utf-8-sig") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))[1:9]
    return [(r[3], r[4]) for r in rows]


@pytest.fixture(scope="module")
def minilm(minilm_dir) -> BertForPreTraining:
    """MiniLM's encoder; its pre-training heads (absent from the checkpoint) randomised."""
    torch.manual_seed(0)
    model = load_hf_checkpoint(str(minilm_dir)).eval()
    with torch.no_grad():
        for p in [*model.mlm.parameters(), *model.nsp.parameters()]:
            if p is not model.mlm.decoder.weight:
                p.normal_(0, 0.05)
    return model


def encode(tokenizer, pairs):
    return tokenizer([a for a, _ in pairs], [b for _, b in pairs], padding=True,
                     return_tensors="pt")


def test_minilm_hidden_states_equal_transformers(minilm, minilm_dir, mrpc_pairs):
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm_dir)
    batch = encode(tokenizer, mrpc_pairs)
    lengths = batch["attention_mask"].sum(1)
    assert lengths.min() < lengths.max() == batch["input_ids"].shape[1]  # padding in the batch
    reference = transformers.BertModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        expected = reference(**batch)
        ours = minilm.bert(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    torch.testing.assert_close(ours[real], expected.last_hidden_state[real])
    torch.testing.assert_close(minilm.bert.pool(ours), expected.pooler_output)


def test_export_loads_in_transformers_with_equal_logits(minilm, minilm_dir, mrpc_pairs,
                                                        tmp_path):
    export_hf_folder(minilm, str(minilm_dir), str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json", "model.safetensors", "special_tokens_map.json", "tokenizer.json",
        "tokenizer_config.json", "vocab.txt"]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForPreTraining"]
    hf_model = transformers.BertForPreTraining.from_pretrained(tmp_path).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    batch = encode(tokenizer, mrpc_pairs)
    # the exported tokenizer is MiniLM's: the same ids as its own tokenizer and ours
    original = encode(transformers.AutoTokenizer.from_pretrained(minilm_dir), mrpc_pairs)
    assert torch.equal(batch["input_ids"], original["input_ids"])
    ours_tok = load_tokenizer(str(minilm_dir)).encode(*mrpc_pairs[0]).ids
    assert ours_tok == batch["input_ids"][0, :batch["attention_mask"][0].sum()].tolist()

    positions = torch.tensor([[1, 3, 5, 8]] * len(mrpc_pairs))
    with torch.no_grad():
        expected = hf_model(**batch)
        ours = minilm(batch["input_ids"], positions, batch["token_type_ids"],
                      batch["attention_mask"])
    rows = torch.arange(len(mrpc_pairs))[:, None]
    torch.testing.assert_close(ours.mlm_logits, expected.prediction_logits[rows, positions])
    torch.testing.assert_close(ours.nsp_logits, expected.seq_relationship_logits)

    # and back: the exported folder loads into our model with exactly the same parameters
    again = load_hf_checkpoint(str(tmp_path))
    assert_same_parameters(again, minilm)


def test_classifier_export_matches_transformers(minilm, minilm_dir, mrpc_pairs, tmp_path):
    torch.manual_seed(1)
    classifier = BertForSequenceClassification.from_encoder(minilm.bert, num_labels=3).eval()
    export_hf_folder(classifier, str(minilm_dir), str(tmp_path))
    hf_model = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
    batch = encode(transformers.AutoTokenizer.from_pretrained(tmp_path), mrpc_pairs)
    with torch.no_grad():
        expected = hf_model(**batch).logits
        ours = classifier(batch["input_ids"], batch["token_type_ids"],
                          batch["attention_mask"]).logits
    torch.testing.assert_close(ours, expected)


def test_pytorch_bin_with_pretraining_keys_loads(minilm, minilm_dir, tmp_path):
    """A `pytorch_model.bin` with `bert.`/`cls.` keys (incl. the tied decoder) loads the same."""
    export_hf_folder(minilm, str(minilm_dir), str(tmp_path / "st"))
    hf_model = transformers.BertForPreTraining.from_pretrained(tmp_path / "st")
    state = hf_model.state_dict()
    assert "cls.predictions.decoder.weight" in state and "bert.embeddings.word_embeddings.weight" \
        in state
    (tmp_path / "bin").mkdir()
    shutil.copy(tmp_path / "st" / "config.json", tmp_path / "bin" / "config.json")
    torch.save({k: v.clone() for k, v in state.items()}, tmp_path / "bin" / "pytorch_model.bin")
    assert_same_parameters(load_hf_checkpoint(str(tmp_path / "bin")), minilm)


def test_missing_encoder_weight_is_a_clear_error(minilm, minilm_dir, tmp_path):
    export_hf_folder(minilm, str(minilm_dir), str(tmp_path))
    from safetensors.torch import load_file, save_file
    state = load_file(tmp_path / "model.safetensors")
    del state["bert.encoder.layer.3.output.dense.weight"]
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.safetensors: encoder weights missing.*"
                                         r"bert\.layers\.3\.output\.weight"):
        load_hf_checkpoint(str(tmp_path))


@pytest.mark.parametrize("make", [
    lambda: BertForPreTraining(bert_tiny()),
    lambda: BertForPreTraining(bert_tiny(), next_sentence=False),
    lambda: BertForSequenceClassification(bert_tiny(), num_labels=1),
], ids=["pretraining", "mlm_only", "regression"])
def test_own_checkpoint_round_trip_is_exact(make, tmp_path):
    torch.manual_seed(2)
    model = make()
    save_checkpoint(model, str(tmp_path))
    loaded = load_checkpoint(str(tmp_path))
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    assert_same_parameters(loaded, model)
    if isinstance(loaded, BertForPreTraining):  # the tie survives loading
        assert loaded.mlm.decoder.weight is loaded.bert.embeddings.word.weight


def test_a_bad_config_file_is_an_error_naming_it(minilm_dir, tmp_path):
    """A checkpoint's config with a value BertConfig refuses names the file, ours or HF's."""
    save_checkpoint(BertForPreTraining(bert_tiny()), str(tmp_path / "ours"))
    export_hf_folder(BertForPreTraining(bert_tiny()), str(minilm_dir), str(tmp_path / "hf"))
    for path, key, load in [(tmp_path / "ours" / "bert_config.json", "config", load_checkpoint),
                            (tmp_path / "hf" / "config.json", None, load_hf_checkpoint)]:
        values = json.loads(path.read_text())
        (values[key] if key else values)["hidden_act"] = "relu6"
        path.write_text(json.dumps(values))
        with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: hidden_act 'relu6' not in "):
            load(str(path.parent))
        (values[key] if key else values)["hidden_act"] = "gelu"
        (values[key] if key else values)["hidden_size"] = "128"  # a string: a TypeError inside
        path.write_text(json.dumps(values))
        with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: "):
            load(str(path.parent))


def test_parameter_count_equals_transformers():
    config = bert_tiny()
    ours = BertForPreTraining(config)
    theirs = transformers.BertForPreTraining(transformers.BertConfig(**config.to_dict()))
    assert sum(p.numel() for p in ours.parameters()) == theirs.num_parameters() == 4_433_468


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def test_mlm_only_export_loads_as_masked_lm(minilm_dir, mrpc_pairs, tmp_path):
    torch.manual_seed(3)
    model = BertForPreTraining(bert_tiny(), next_sentence=False).eval()
    export_hf_folder(model, str(minilm_dir), str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [
        "BertForMaskedLM"]
    hf_model = transformers.BertForMaskedLM.from_pretrained(tmp_path).eval()
    batch = encode(transformers.AutoTokenizer.from_pretrained(tmp_path), mrpc_pairs)
    positions = torch.tensor([[2, 4, 6]] * len(mrpc_pairs))
    with torch.no_grad():
        expected = hf_model(**batch).logits
        ours = model(batch["input_ids"], positions, batch["token_type_ids"],
                     batch["attention_mask"]).mlm_logits
    rows = torch.arange(len(mrpc_pairs))[:, None]
    torch.testing.assert_close(ours, expected[rows, positions])


def test_checkpoints_this_model_cannot_hold_are_refused(minilm_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    export_hf_folder(BertForPreTraining(bert_tiny()), str(minilm_dir), str(tmp_path))
    state = load_file(tmp_path / "model.safetensors")
    state["cls.predictions.decoder.weight"] = state["bert.embeddings.word_embeddings.weight"] + 1
    save_file(state, tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="decoder.weight differs from the word embeddings"):
        load_hf_checkpoint(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    config["position_embedding_type"] = "relative_key"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="config.json: position_embedding_type 'relative_key'"):
        load_hf_checkpoint(str(tmp_path))


def test_export_keeps_the_casing_of_the_vocabulary_folder(minilm_dir, tmp_path):
    """A cased vocabulary folder (train_vocab --cased: `do_lower_case: false`) exports a tokenizer
    that keeps case; an uncased one, or a bare vocab.txt, lower-cases."""
    from common.tokenization import read_vocab, save_tokenizer_folder
    from model.hf import vocab_do_lower_case

    vocab = read_vocab(str(minilm_dir))
    cased, bare = tmp_path / "cased_vocab", tmp_path / "bare_vocab"
    save_tokenizer_folder(vocab, str(cased), do_lower_case=False)
    bare.mkdir()
    shutil.copy(minilm_dir / "vocab.txt", bare / "vocab.txt")
    assert (vocab_do_lower_case(str(cased)), vocab_do_lower_case(str(bare)),
            vocab_do_lower_case(str(minilm_dir))) == (False, True, True)
    model = BertForPreTraining(bert_tiny())
    tokens = {}
    for name, folder in (("cased", cased), ("bare", bare), ("minilm", minilm_dir)):
        export_hf_folder(model, str(folder), str(tmp_path / name))
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(tmp_path / name))
        tokens[name] = tokenizer.tokenize("Hello World, Émile")
    # MiniLM's vocabulary is uncased: capitals and accents are unknown unless lower-cased.
    assert tokens["cased"] == ["[UNK]", "[UNK]", ",", "[UNK]"]
    assert tokens["bare"] == tokens["minilm"] == ["hello", "world", ",", "emile"]
    assert json.loads((tmp_path / "cased" / "tokenizer_config.json").read_text())[
        "do_lower_case"] is False
