"""Feature extraction: every layer's states against transformers' `hidden_states` on MiniLM;
`bert-features` against BERT's own `extract_features.py` (the layout, the tokens of each line,
truncation); the feature-based NER tagger's inputs (the paper's Table 7 choices)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from finetune.features import cli, extract


@pytest.fixture(scope="module")
def encoder(minilm_dir):
    from finetune.checkpoint import load_encoder

    return load_encoder(str(minilm_dir)).eval()


@pytest.fixture(scope="module")
def sample_file(shared_data, tmp_path_factory):
    """Real text: BERT's sample_text.txt lines, some joined as pairs, one long line, one empty."""
    lines = [line.strip() for line in
             (shared_data / "reference" / "sample_text.txt").read_text("utf-8").splitlines()]
    text = [line for line in lines if line][:10]
    inputs = [*text[:4], f"{text[4]} ||| {text[5]}", f"{text[6]} ||| {text[7]}", "",
              " ".join(text[:8]), text[8]]
    path = tmp_path_factory.mktemp("features") / "input.txt"
    path.write_text("\n".join(inputs) + "\n", encoding="utf-8")
    return path


def test_hidden_states_equal_transformers(encoder, minilm_dir):
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(minilm_dir))
    peer = AutoModel.from_pretrained(str(minilm_dir)).eval()
    inputs = tokenizer(["The rain had only ceased.", ("Blazing Star, and the settlement awoke "
                        "to a moral sense of cleanliness")], padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = peer(**inputs, output_hidden_states=True).hidden_states
        ours = encoder(inputs["input_ids"], inputs["token_type_ids"], inputs["attention_mask"],
                       output_hidden_states=True)
        default = encoder(inputs["input_ids"], inputs["token_type_ids"],
                          inputs["attention_mask"])
    assert len(ours.layers) == len(theirs) == 7
    real = inputs["attention_mask"].bool()
    for a, b in zip(ours.layers, theirs):
        torch.testing.assert_close(a[real], b[real], rtol=1e-4, atol=1e-4)
    assert torch.equal(default, ours.last)
    with pytest.raises(ValueError, match="no output_positions"):
        encoder(inputs["input_ids"], output_positions=torch.zeros(2, 1, dtype=torch.long),
                output_hidden_states=True)


def test_bert_features_layout_and_tokens_equal_extract_features(encoder, minilm_dir,
                                                               sample_file, tmp_path):
    from peers import bert_features

    peer = bert_features.load()
    from bert import tokenization

    out = tmp_path / "features.jsonl"
    assert cli.main(["--model", str(minilm_dir), "--input_file", str(sample_file),
                     "--output_file", str(out), "--layers=-1,-2,0",
                     "--max_seq_length", "64"]) == 0
    records = [json.loads(line) for line in out.read_text("utf-8").splitlines()]
    full = tokenization.FullTokenizer(str(minilm_dir / "vocab.txt"), do_lower_case=True)
    examples = peer.read_examples(str(sample_file))
    reference = peer.convert_examples_to_features(examples, 64, full)
    assert len(records) == len(reference) == 9
    for record, ref in zip(records, reference):
        assert list(record) == ["linex_index", "features"]
        assert record["linex_index"] == ref.unique_id
        assert [f["token"] for f in record["features"]] == ref.tokens
        for feature in record["features"]:
            assert list(feature) == ["token", "layers"]
            assert [list(layer) for layer in feature["layers"]] == [["index", "values"]] * 3
            assert [layer["index"] for layer in feature["layers"]] == [-1, -2, 0]
            assert all(len(layer["values"]) == 384 for layer in feature["layers"])
    assert len(reference[7].tokens) == 64  # the long line, truncated as the reference does
    assert reference[6].tokens == ["[CLS]", "[SEP]"]  # an empty line is still an example
    assert reference[4].tokens.count("[SEP]") == 2  # a pair
    # the values: the block outputs of a pair, rounded to 6 decimals as the reference writes
    ex = extract.encode_examples(extract_tokenizer(minilm_dir), [extract.read_examples(
        str(sample_file))[4]], 64)[0]
    with torch.no_grad():
        states = encoder(torch.from_numpy(ex.input_ids)[None],
                         torch.from_numpy(ex.token_type_ids)[None],
                         output_hidden_states=True).layers
    got = np.array([[layer["values"] for layer in f["layers"]] for f in records[4]["features"]])
    want = torch.stack([states[-1][0], states[-2][0], states[1][0]], dim=1).numpy()  # (T, 3, H)
    np.testing.assert_allclose(got, want, atol=2e-5)
    assert got.tolist() == np.round(got, 6).tolist()


def extract_tokenizer(minilm_dir):
    from finetune.checkpoint import load_tokenizer

    return load_tokenizer(str(minilm_dir))


def test_bert_features_bad_layers_named(minilm_dir, sample_file, tmp_path, capsys):
    code = cli.main(["--model", str(minilm_dir), "--input_file", str(sample_file),
                     "--output_file", str(tmp_path / "x.jsonl"), "--layers=-1,6"])
    assert code == 2
    assert "--layers: 6 is outside the model's 6 layers (-6..5)" in capsys.readouterr().err
    assert not (tmp_path / "x.jsonl").exists()
    code = cli.main(["--model", str(minilm_dir), "--input_file", str(tmp_path / "none.txt"),
                     "--output_file", str(tmp_path / "x.jsonl")])
    assert code == 2 and "--input_file" in capsys.readouterr().err


def test_table7_inputs_choose_the_papers_layers():
    from finetune.features.ner import CHOICES, FeatureInput

    states = torch.randn(2, 5, 7, 384)  # (B, W, L + 1, H): MiniLM's 6 blocks + embeddings
    expect = {"embeddings": states[..., 0, :], "second_to_last": states[..., 5, :],
              "last": states[..., 6, :], "concat_last_four": states[..., 3:7, :].flatten(-2),
              # fresh scalar mixes weigh every layer alike, scale 1: the mean
              "sum_last_four": states[..., 3:7, :].mean(-2),
              "sum_all": states[..., 1:7, :].mean(-2)}
    assert set(expect) == set(CHOICES)
    for choice, want in expect.items():
        features = FeatureInput(choice, 6, 384)
        got = features(states)
        assert got.shape[-1] == features.width
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="unknown feature choice 'first'"):
        FeatureInput("first", 6, 384)


def test_word_states_are_first_sub_token_states(encoder, minilm_dir):
    from finetune.features.ner import word_states
    from finetune.ner.data import Sentence

    tokenizer = extract_tokenizer(minilm_dir)
    sentences = [Sentence(("Blazing", "Star", "awoke"), ("B-LOC", "I-LOC", "O"), 0, 1),
                 Sentence(("Unicode", "cleanliness", "."), ("O", "O", "O"), 0, 5)]
    states = word_states(encoder, tokenizer, sentences, ("O", "B-LOC", "I-LOC"))
    assert [tuple(s.shape) for s in states] == [(3, 7, 384), (3, 7, 384)]
    for sentence, got in zip(sentences, states):
        enc = tokenizer.encode(list(sentence.words), is_pretokenized=True)
        first = [i for i, w in enumerate(enc.word_ids)
                 if w is not None and w != enc.word_ids[i - 1]]
        with torch.no_grad():
            layers = encoder(torch.tensor([enc.ids]), output_hidden_states=True).layers
        want = torch.stack(layers, dim=2)[0, first]  # (words, L + 1, H)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
