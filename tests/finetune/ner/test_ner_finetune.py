"""NER fine-tuning: word pieces and first sub-tokens as transformers aligns them, the token
classifier against transformers' BertForTokenClassification on MiniLM, packed batches against
one sentence at a time, windows and document context, and scoring."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from finetune.ner import FAMILY, TASKS, data
from finetune.ner.encode import encode_sentences, make_batch, windows
from finetune.ner.family import split_paths, word_predictions
from finetune.ner.tasks import NER_TASKS
from model.heads import BertForTokenClassification


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_dir))


@pytest.fixture(scope="module")
def conll_dev(shared_data):
    return data.read_conll(split_paths("conll2003", str(shared_data / "conll2003"))["dev"],
                           NER_TASKS["conll2003"].format)


@pytest.fixture(scope="module")
def token_model(minilm_dir):
    from finetune.checkpoint import load_encoder

    torch.manual_seed(0)
    model = BertForTokenClassification.from_encoder(load_encoder(str(minilm_dir)), 9)
    return model.eval()


def test_tasks_and_recipe():
    assert TASKS == ("conll2003", "wnut17")
    recipe = FAMILY.recipe("conll2003")
    assert (recipe.max_seq_length, recipe.batch_size, recipe.epochs) == (128, 32, 3.0)
    assert recipe.learning_rates == (5e-5, 4e-5, 3e-5, 2e-5)
    with pytest.raises(ValueError, match="unknown NER task 'conll2002'"):
        FAMILY.recipe("conll2002")


def test_check_files_names_the_missing_file(tmp_path):
    (tmp_path / "wnut17train.conll").write_text("a\tO\n")
    with pytest.raises(FileNotFoundError, match=r"wnut17: no dev file .*emerging\.dev\.conll"):
        FAMILY.check_files("wnut17", str(tmp_path))


def test_first_sub_tokens_as_transformers_aligns_them(tokenizer, conll_dev):
    sentences = conll_dev.sentences[:300]
    labels = NER_TASKS["conll2003"].labels
    enc = encode_sentences(tokenizer, sentences, labels, 128)
    assert len(enc) == 300 and enc.split_sentences == 0
    for u, sentence in enumerate(sentences):
        hf = tokenizer(list(sentence.words), is_split_into_words=True)
        assert enc.input_ids[u].tolist() == hf["input_ids"]
        word_ids = hf.word_ids()
        # run_ner.py's alignment: the label on a word's first token, -100 on the rest
        first = [i for i, w in enumerate(word_ids) if w is not None and w != word_ids[i - 1]]
        assert enc.word_positions[u].tolist() == first
        assert [labels[i] for i in enc.word_labels[u]] == list(sentence.tags)


def test_windows_predict_every_word(tokenizer, conll_dev):
    assert windows([3, 2, 4, 9, 1], 6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    sentences = conll_dev.sentences[:200]
    labels = NER_TASKS["conll2003"].labels
    enc = encode_sentences(tokenizer, sentences, labels, 16)  # many sentences need windows
    assert enc.num_sentences == 200 and len(enc) > 200
    assert enc.split_sentences == sum(
        len(tokenizer(list(s.words), is_split_into_words=True,
                      add_special_tokens=False)["input_ids"]) > 14
        for s in sentences)
    assert int(enc.lengths.max()) <= 16
    covered = {(int(s), int(f) + k) for s, f, w in zip(enc.sentence, enc.first_word,
                                                        enc.word_labels) for k in range(len(w))}
    assert len(covered) == sum(len(w) for w in enc.word_labels) == sum(len(s.words)
                                                                       for s in sentences)
    # gold logits give back the gold tags, every word predicted once
    logits = np.zeros((len(enc), 16, len(labels)), np.float32)
    for u, w in enumerate(enc.word_labels):
        logits[u, np.arange(len(w)), w] = 1.0
    assert word_predictions(enc, sentences, logits, labels) == [list(s.tags) for s in sentences]


def test_document_context_is_unlabelled(tokenizer, conll_dev):
    sentences = conll_dev.sentences[:60]
    labels = NER_TASKS["conll2003"].labels
    plain = encode_sentences(tokenizer, sentences, labels, 128)
    wide = encode_sentences(tokenizer, sentences, labels, 128, document_context=True)
    assert len(wide) == len(plain)
    assert int(wide.lengths.sum()) > 3 * int(plain.lengths.sum())
    assert int(wide.lengths.max()) <= 128
    for u in range(len(plain)):
        a, b = plain.input_ids[u], wide.input_ids[u]
        shift = wide.word_positions[u][0] - plain.word_positions[u][0]
        assert (wide.word_positions[u] - plain.word_positions[u] == shift).all()
        span = slice(plain.word_positions[u][0], len(a) - 1)  # the sentence's own pieces
        assert b[span.start + shift:span.stop + shift].tolist() == a[span].tolist()
        assert (wide.word_labels[u] == plain.word_labels[u]).all()


def test_token_classifier_equals_transformers(token_model, tokenizer, conll_dev, tmp_path):
    from transformers import AutoModelForTokenClassification

    from model.hf import export_hf_folder, load_checkpoint, save_checkpoint

    vocab = tmp_path / "vocab"
    vocab.mkdir()
    (vocab / "vocab.txt").write_text("\n".join(tokenizer.convert_ids_to_tokens(
        list(range(tokenizer.vocab_size)))) + "\n")
    export_hf_folder(token_model, str(vocab), str(tmp_path / "hf"))
    peer = AutoModelForTokenClassification.from_pretrained(str(tmp_path / "hf")).eval()
    words = [list(s.words) for s in conll_dev.sentences[:6]]
    inputs = tokenizer(words, is_split_into_words=True, padding=True, return_tensors="pt")
    with torch.no_grad():
        theirs = peer(**inputs).logits
        ours = token_model(inputs["input_ids"], inputs["token_type_ids"],
                           inputs["attention_mask"]).logits
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(ours[real], theirs[real], rtol=1e-4, atol=1e-4)
    save_checkpoint(token_model, str(tmp_path / "ours"))
    again = load_checkpoint(str(tmp_path / "ours"))
    assert isinstance(again, BertForTokenClassification) and again.num_labels == 9
    for (name, p), q in zip(token_model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("row_length, rows", [(None, 4), (512, 1)])
def test_packed_outputs_equal_one_sentence_at_a_time(token_model, tokenizer, conll_dev,
                                                     row_length, rows):
    labels = NER_TASKS["conll2003"].labels
    sentences = conll_dev.sentences[:12]
    enc = encode_sentences(tokenizer, sentences, labels, 128)
    indices = list(range(12))[::-1]
    batch = make_batch(enc, indices, 128, row_length=row_length)
    # packed: fewer rows than sentences; per-word outputs W = max_seq_length whatever the rows
    assert batch.input_ids.shape[0] == rows and batch.input_ids.shape[1] <= (row_length or 128)
    assert batch.word_index.shape == (12, 128)
    with torch.no_grad():
        logits = FAMILY.outputs(token_model, batch)["logits"]  # (B, W, C)
        loss = FAMILY.loss(token_model, batch)
        alone_losses = []
        for b, i in enumerate(indices):
            ids = torch.from_numpy(enc.input_ids[i])[None]
            full = token_model(ids).logits[0]  # (T, C)
            n = len(enc.word_labels[i])
            torch.testing.assert_close(logits[b, :n], full[enc.word_positions[i]],
                                       rtol=1e-4, atol=1e-4)
            assert (logits[b, n:] == 0).all()
            target = torch.full((len(enc.input_ids[i]),), -100)
            target[enc.word_positions[i]] = torch.from_numpy(enc.word_labels[i])
            alone_losses.append(torch.nn.functional.cross_entropy(full, target,
                                                                  reduction="sum"))
    words = sum(len(w) for w in enc.word_labels)
    torch.testing.assert_close(loss, torch.stack(alone_losses).sum() / words,
                               rtol=1e-4, atol=1e-4)


def test_prepare_and_score_real_wnut(shared_data, tokenizer, token_model):
    prepared = FAMILY.prepare("wnut17", str(shared_data / "wnut17"), tokenizer, 128, 200, 100,
                              False)
    assert (prepared.num_train_examples, prepared.num_dev_examples["dev"]) == (200, 100)
    assert len(prepared.train) == 200 and list(prepared.dev) == ["dev", "test"]
    assert prepared.num_dev_examples["test"] == 100  # emerging.test.annotated, sliced as dev
    encoded = prepared.dev["dev"]
    sentences = prepared.context.sentences["dev"]
    labels = NER_TASKS["wnut17"].labels
    gold = np.zeros((len(encoded), 128, len(labels)), np.float32)
    for u, w in enumerate(encoded.word_labels):
        gold[u, np.arange(len(w)), w] = 1.0
    scored = FAMILY.score(prepared, "dev", {"logits": gold})
    assert scored.score == scored.metrics["f1"] == 1.0
    text = scored.files["predictions_dev.txt"]
    assert text.count("\n\n") == 100
    assert text.splitlines()[0] == f"{sentences[0].words[0]} {sentences[0].tags[0]} " \
        f"{sentences[0].tags[0]}"
    everything_o = np.zeros_like(gold)
    everything_o[..., 0] = 1.0
    scored = FAMILY.score(prepared, "dev", {"logits": everything_o})
    assert scored.metrics["f1"] == 0.0 and scored.metrics["recall"] == 0.0


def test_bert_finetune_end_to_end_on_wnut17(shared_data, minilm_dir, tmp_path):
    """Two optimizer steps of the one loop on MiniLM; the reported F1 is seqeval's on the
    predictions file the run wrote (conlleval's input: word gold predicted)."""
    import json

    from seqeval.metrics import f1_score

    from finetune import cli as finetune_cli

    out = tmp_path / "run"
    code = finetune_cli.main(["--model", str(minilm_dir), "--data", str(shared_data),
                              "--tasks", "wnut17", "--output", str(out),
                              "--max_train_examples", "64", "--max_eval_examples", "32",
                              "--epochs", "1", "--learning_rates", "5e-5", "--seeds", "1",
                              "--no_progress"])
    assert code == 0
    task = json.loads((out / "results.json").read_text())["tasks"][0]
    assert (task["family"], task["task"], task["num_train_examples"]) == ("ner", "wnut17", 64)
    assert task["num_dev_examples"] == {"dev": 32, "test": 32}
    assert set(task["metrics"]) >= {"f1", "test_f1", "test_precision", "test_recall"}
    lines = (out / "wnut17" / "predictions_dev.txt").read_text().split("\n\n")[:-1]
    rows = [[line.split(" ") for line in block.splitlines()] for block in lines]
    assert len(rows) == 32
    gold = [[r[1] for r in sentence] for sentence in rows]
    pred = [[r[2] for r in sentence] for sentence in rows]
    assert task["score"] == task["metrics"]["f1"] == pytest.approx(f1_score(gold, pred))
    # every word of the 32 dev sentences drawn (seed 0) is predicted, in file order
    dev = data.subset(data.read_conll(split_paths("wnut17", str(shared_data / "wnut17"))["dev"],
                                      NER_TASKS["wnut17"].format), 32)
    assert [[r[0] for r in sentence] for sentence in rows] == [list(s.words)
                                                               for s in dev.sentences]
    assert gold == [list(s.tags) for s in dev.sentences]
