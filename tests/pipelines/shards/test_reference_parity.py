"""Reference mode against BERT's own generator, run in this process: exactly the same instances.

The peer is BERT's `create_pretraining_data.py` as `peers/bert_generator.py` loads it (the
PyPI package `bert-tensorflow` 1.0.4 behind a stand-in for its TensorFlow file I/O, logging and
flags). Nothing of ours is replaced: the peer reads the file and tokenizes with its own tokenizer.

That package's masking predates `--do_whole_word_mask`; for whole words the step-by-step test in
test_reference_instances.py is the check. Without whole words its random stream is the 2020
revision's (the same shuffle of candidates, one group per position).
"""
from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from common.tokenization import load_tokenizer, read_vocab
from peers import bert_generator
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_reference,
    read_reference_text,
)
from tests.conftest import skip_or_fail


@pytest.fixture(scope="module")
def peer():
    """The peer's `create_pretraining_data` module, imported behind the I/O stand-in."""
    reason = bert_generator.available()
    if reason:
        skip_or_fail(reason)
    return bert_generator.load()


@pytest.fixture(scope="module")
def vocab_path(minilm_dir) -> str:
    return str(minilm_dir / "vocab.txt")


def run_both(peer, path: Path, vocab_path: str, cfg: InstanceConfig, do_lower_case: bool = True):
    from bert import tokenization as peer_tokenization

    peer_tokenizer = peer_tokenization.FullTokenizer(vocab_path, do_lower_case=do_lower_case)
    theirs = peer.create_training_instances(
        [str(path)], peer_tokenizer, cfg.max_seq_length, cfg.dupe_factor, cfg.short_seq_prob,
        cfg.masked_lm_prob, cfg.max_predictions_per_seq, random.Random(cfg.random_seed))
    tokens = read_vocab(vocab_path)
    with open(path, encoding="utf-8", newline="\n") as f:
        docs = read_reference_text(f, load_tokenizer(vocab_path, do_lower_case))
    ours = create_instances_reference(docs, Vocab.from_tokens(tokens), cfg)
    return theirs, ours, tokens


def assert_same_instances(theirs, ours, tokens: list[str]) -> None:
    assert len(ours) == len(theirs)
    for k, (p, o) in enumerate(zip(theirs, ours)):
        assert [tokens[i] for i in o.input_ids] == p.tokens, k
        assert o.segment_ids.tolist() == p.segment_ids, k
        assert o.next_sentence_label == int(p.is_random_next), k
        assert o.masked_lm_positions.tolist() == p.masked_lm_positions, k
        assert [tokens[i] for i in o.masked_lm_ids] == p.masked_lm_labels, k


@pytest.mark.parametrize("cfg, num_instances", [
    (InstanceConfig(), 118),  # the reference's defaults: 128 / 20, dupe_factor 10, seed 12345
    (InstanceConfig(max_seq_length=512, max_predictions_per_seq=76, dupe_factor=5,
                    random_seed=7), 35),
    (InstanceConfig(max_seq_length=24, max_predictions_per_seq=3, short_seq_prob=0.5,
                    masked_lm_prob=0.3, dupe_factor=3, random_seed=2020), 82),
], ids=["defaults", "phase2", "short"])
def test_sample_text_equals_reference(peer, shared_data, vocab_path, cfg, num_instances):
    theirs, ours, tokens = run_both(peer, shared_data / "reference" / "sample_text.txt",
                                    vocab_path, cfg)
    assert len(ours) == num_instances
    assert_same_instances(theirs, ours, tokens)


def test_books_equal_reference(peer, shared_data, vocab_path, tmp_path):
    """Books in the reference format (a line is a segment, a blank line ends a document): one
    and the start of Moby Dick, whose CRLF line ends both sides strip."""
    path = tmp_path / "books.txt"
    moby_dick = (shared_data / "books" / "melville-moby_dick.txt").read_bytes()
    path.write_bytes((shared_data / "books" / "austen-persuasion.txt").read_bytes()
                     + b"".join(moby_dick.splitlines(keepends=True)[:8000]))
    cfg = InstanceConfig(dupe_factor=2)
    theirs, ours, tokens = run_both(peer, path, vocab_path, cfg)
    assert len(ours) == 8581
    assert_same_instances(theirs, ours, tokens)
    # Above one half: a one-segment chunk always takes a random next (short dialogue lines).
    assert sum(o.next_sentence_label for o in ours) == 5343


EDGE_CASES = [
    "Literal [MASK], [SEP], [CLS], [UNK] and [PAD] in text are words, not special tokens.",
    "Accents: Ünïcödé àccents, Ça va? Crème brûlée; naïve façade.",
    "CJK and wide forms: 北京大学 is in 東京? ｆｕｌｌ－ｗｉｄｔｈ．",
    "",
    "A long word: " + "a" * 250 + " and a 150-character one: " + "b" * 150 + ".",
    "Control characters:\x07bell, zero\u200bwidth, soft\u00adhyphen, tab\there, nbsp\u00a0here.",
    "Emoji 😀 and symbols ©®™ ±×÷ — dashes – and “quotes” ‘too’.",
    "Numbers 3.14159, 1,000,000 and e-mail someone@example.com at 10:30pm.",
    "",
    "\u00a0\u2003 ",
    "\x00\x01\x02",
    "Greek Ελληνικά, Cyrillic Кириллица, Arabic العربية, Hebrew עברית, Hindi हिन्दी.",
    "Thai ภาษาไทย and Korean 한국어 and Japanese ひらがな カタカナ.",
    "İstanbul ǅemal ﬁnance Straße ΣΊΣΥΦΟΣ.",
    "",
    "One more document.",
    "With a second sentence of its own.",
]


@pytest.mark.parametrize("do_lower_case, num_instances", [(True, 167), (False, 168)])
def test_tokenization_edge_cases_equal_reference(peer, vocab_path, tmp_path, do_lower_case,
                                                 num_instances):
    """Unicode, long words, control characters and literal special-token text, end to end."""
    path = tmp_path / "edge.txt"
    path.write_text("\n".join(EDGE_CASES) + "\n", encoding="utf-8")
    cfg = InstanceConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=20)
    theirs, ours, tokens = run_both(peer, path, vocab_path, cfg, do_lower_case)
    assert len(ours) == num_instances
    assert_same_instances(theirs, ours, tokens)
    seen = {tokens[i] for o in ours for i in o.input_ids}
    assert {"[UNK]", "北"} <= seen
    assert "[" in seen  # "[MASK]" in text is "[", "mask", "]" (cased: "[", "[UNK]", "]")


def test_wikipedia_articles_equal_reference(peer, shared_data, vocab_path, tmp_path):
    """Wikipedia text (SQuAD dev contexts: one document per article, one sentence per line)."""
    import json

    from pipelines.corpus.sentences import split_sentences

    articles = json.loads((shared_data / "squad" / "dev-v1.1.json").read_text(encoding="utf-8"))
    lines = []
    for article in articles["data"][:16]:
        lines += [s for p in article["paragraphs"] for s in split_sentences(p["context"])] + [""]
    path = tmp_path / "wiki.txt"
    path.write_text("\n".join(lines), encoding="utf-8")
    theirs, ours, tokens = run_both(peer, path, vocab_path, InstanceConfig(dupe_factor=2))
    assert len(ours) == 2557
    assert_same_instances(theirs, ours, tokens)


@pytest.mark.parametrize(
    "corpus_seed, num_docs, max_seq_length, short_seq_prob, masked_lm_prob, num_instances", [
        (0, 1, 16, 0.1, 0.15, 27),  # one document: every random next is the document itself
        (1, 2, 5, 0.5, 0.15, 48),  # the smallest length: heavy truncation, one masked token
        (2, 7, 7, 1.0, 0.9, 158),  # always a short target; more masks wanted than candidates
        (3, 30, 12, 0.0, 0.5, 533),
        (4, 60, 40, 0.3, 0.15, 668),
    ])
def test_synthetic_corpora_equal_reference(peer, vocab_path, corpus_seed, num_docs,
                                           max_seq_length, short_seq_prob, masked_lm_prob,
                                           num_instances):
    """The instance algorithm alone on random documents of random lengths (1-30 tokens per
    segment, 1-12 segments), in corners real text rarely reaches."""
    tokens = read_vocab(vocab_path)
    gen = np.random.default_rng(corpus_seed)
    docs = [[gen.integers(999, len(tokens), size=gen.integers(1, 31)).astype(np.int32)
             for _ in range(gen.integers(1, 13))] for _ in range(num_docs)]
    cfg = InstanceConfig(max_seq_length=max_seq_length, max_predictions_per_seq=6,
                         short_seq_prob=short_seq_prob, masked_lm_prob=masked_lm_prob,
                         dupe_factor=3, random_seed=corpus_seed)
    token_docs = [[[tokens[i] for i in s] for s in d] for d in docs]
    theirs = bert_generator.instances_from_documents(peer, token_docs, tokens, cfg)
    ours = create_instances_reference(docs, Vocab.from_tokens(tokens), cfg)
    assert len(ours) == num_instances
    assert_same_instances(theirs, ours, tokens)


def test_make_shards_reference_mode_reads_several_files_as_the_reference(
        peer, shared_data, vocab_path, tmp_path):
    """The reference reads its input files as one stream of lines: a document cut by a file
    boundary (no blank line there) is still one document. The job, end to end, on three files."""
    import json

    from bert import tokenization as peer_tokenization

    from pipelines import make_shards

    lines = (shared_data / "reference" / "sample_text.txt").read_bytes().split(b"\n")
    cut = next(i for i in range(5, len(lines)) if lines[i].strip() and lines[i + 1].strip())
    blank = next(i for i in range(cut, len(lines)) if not lines[i].strip())
    folder = tmp_path / "input"
    folder.mkdir()
    parts = [lines[:cut + 1], lines[cut + 1:blank], lines[blank:]]  # mid-document, then a blank
    for k, part in enumerate(parts):
        (folder / f"part-{k}.txt").write_bytes(b"\n".join(part) + b"\n")
    files = sorted(str(p) for p in folder.iterdir())
    cfg = InstanceConfig(dupe_factor=2)
    theirs = peer.create_training_instances(
        files, peer_tokenization.FullTokenizer(vocab_path, do_lower_case=True),
        cfg.max_seq_length, cfg.dupe_factor, cfg.short_seq_prob, cfg.masked_lm_prob,
        cfg.max_predictions_per_seq, random.Random(cfg.random_seed))
    out = tmp_path / "out"
    manifest = make_shards.main([
        "--input", str(folder), "--vocab", vocab_path, "--output", str(out), "--mode",
        "reference", "--format", "jsonl", "--dupe_factor", "2", "--num_shards", "1"])
    ours = [json.loads(line) for line in (out / "train-000000.jsonl").read_text().splitlines()]
    assert manifest["counters"]["documents"] == 3  # the sample's 3 (4 if a file ended one)
    assert len(ours) == len(theirs) == 23
    for k, (p, o) in enumerate(zip(theirs, ours)):
        assert o["tokens"] == p.tokens, k
        assert o["segment_ids"] == p.segment_ids, k
        assert o["next_sentence_label"] == int(p.is_random_next), k
        assert o["masked_lm_positions"] == p.masked_lm_positions, k
        assert o["masked_lm_labels"] == p.masked_lm_labels, k
