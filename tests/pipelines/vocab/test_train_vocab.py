"""The WordPiece vocabulary job: BERT's layout, exact Beam word counts, parity with transformers."""
from __future__ import annotations

import collections
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from common import errors
from common.tokenization import load_tokenizer, read_vocab
from pipelines import train_vocab
from pipelines.corpus.documents import CORPUS_SCHEMA, DOCUMENT_SCHEMA
from pipelines.vocab import wordpiece

WIKI_DUMP = "wiki/enwiki-dbpedia-minidump-pages-articles.xml.bz2"
# The shared books hold 4 lines that are not UTF-8 (Latin-1 bytes): the job sets them aside.
BAD_BOOK_LINES = [("chesterton-ball.txt", "line 4631"), ("chesterton-ball.txt", "line 5220"),
                  ("shakespeare-caesar.txt", "line 119"), ("shakespeare-caesar.txt", "line 663")]


def reference_word_counts(paths, do_lower_case=True) -> collections.Counter:
    """Plain Python, straight on `tokenizers`: the counts the Beam job must reproduce."""
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                            strip_accents=do_lower_case, lowercase=do_lower_case)
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    counts: collections.Counter = collections.Counter()
    for path in paths:
        for raw in Path(path).read_bytes().split(b"\n"):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                continue
            counts.update(w for w, _ in pre_tokenizer.pre_tokenize_str(
                normalizer.normalize_str(line)))
    return counts


def read_word_counts(folder: Path) -> dict[str, int]:
    pairs = [line.split("\t") for line in (folder / "word_counts.tsv").read_text().splitlines()]
    return {word: int(count) for word, count in pairs}


def run_job(input_path, output, *extra) -> dict:
    return train_vocab.main(["--input", str(input_path), "--output", str(output), "--no_progress",
                            *map(str, extra)])


@pytest.fixture(scope="module")
def books_vocab(shared_data, tmp_path_factory) -> Path:
    output = tmp_path_factory.mktemp("books_vocab")
    run_job(shared_data / "books", output, "--vocab_size", 4000)
    return output


# --- pure functions --------------------------------------------------------------------------

def test_reserved_tokens_are_bert_base_uncased_layout(minilm_dir):
    bert = read_vocab(str(minilm_dir))  # all-MiniLM-L6-v2 ships bert-base-uncased's vocab
    assert wordpiece.reserved_tokens(994) == bert[:999]
    assert wordpiece.default_num_unused(30522) == 994
    ours = wordpiece.reserved_tokens(wordpiece.default_num_unused(2000))
    for token in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused98]"]:
        assert ours.index(token) == bert.index(token)


def test_num_unused_rule_and_validation():
    assert [wordpiece.default_num_unused(n) for n in (2000, 3000, 8000, 30522, 50000)] == \
        [99, 99, 260, 994, 1628]
    assert wordpiece.VocabConfig(vocab_size=8000).num_reserved == 265
    with pytest.raises(ValueError, match="--num_unused_tokens"):
        wordpiece.VocabConfig(num_unused_tokens=98)
    with pytest.raises(ValueError, match="--vocab_size"):
        wordpiece.VocabConfig(vocab_size=104)
    with pytest.raises(ValueError, match="--min_frequency"):
        wordpiece.VocabConfig(min_frequency=0)


def test_word_splitter_counts_exactly():
    texts = ["Hello, World!", "hello  again.", "Café NAÏVE 東京"]
    assert wordpiece.count_words(texts, wordpiece.word_splitter(True)) == {
        "hello": 2, ",": 1, "world": 1, "!": 1, "again": 1, ".": 1, "cafe": 1, "naive": 1,
        "東": 1, "京": 1}
    assert wordpiece.count_words(texts[2:], wordpiece.word_splitter(False)) == {
        "Café": 1, "NAÏVE": 1, "東": 1, "京": 1}


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_word_splitter_equals_bert_pre_tokenizer_on_every_character(do_lower_case):
    """The fast path (str.split + isalnum) gives the pre-tokenizer's words for any character:
    whitespace, controls, punctuation, symbols, combining marks, CJK, final sigma, surrogates."""
    from tokenizers import pre_tokenizers

    from common.tokenization import bert_normalizer

    normalizer, pre_tokenizer = bert_normalizer(do_lower_case), pre_tokenizers.BertPreTokenizer()
    split = wordpiece.word_splitter(do_lower_case)
    chars = [chr(c) for c in [*range(0x3100), *range(0xFE00, 0x10000), 0x1F600, 0x20000]
             if not 0xD800 <= c < 0xE000]
    texts = [f"Ab{c}cΣ {c}x{c}{c}Y1 {c}" for c in chars]
    texts += ["ΟΔΟΣ ΣΑΣ.", "e\u0301te\u0301 \u0301x", "a\x1cb\x85c\u2028d\u3000e\u00a0f"]
    for text in texts:
        want = [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text))]
        assert split(text) == want, repr(text)


def test_alphabet_ties_go_to_lower_code_point():
    assert wordpiece.choose_alphabet({"ab": 2, "ba": 1, "c": 3}, 2) == ["a", "b"]
    words = wordpiece.select_training_words({"ab": 2, "ca": 1, "x" * 201: 5, "bb": 1}, 2)
    assert words.alphabet == ["a", "b"]
    assert words.counts == {"ab": 2, "bb": 1}
    assert words.outside_alphabet == {"ca": 1}
    assert words.too_long == {"x" * 201: 5}


def test_repeat_words_hands_the_trainer_exact_counts():
    counts = {"the": 5, "a": 1, "##": 3}
    strings = list(wordpiece.repeat_words(counts, chunk=2))
    assert len(strings) == wordpiece.num_repeat_strings(counts, chunk=2) == 6
    assert collections.Counter(" ".join(strings).split()) == counts


def test_small_corpus_is_padded_with_unused_to_exact_size():
    counts = {"hello": 3, "world": 2, "held": 2}
    result = wordpiece.train_vocab(counts, wordpiece.VocabConfig(vocab_size=300, min_frequency=1))
    tokens = result.tokens
    learned = result.stats["num_learned_tokens"]
    assert len(tokens) == 300 and len(set(tokens)) == 300
    assert result.stats["num_unused_tokens"] == 300 - 5 - learned
    assert tokens[:300 - learned] == wordpiece.reserved_tokens(300 - 5 - learned)
    # characters (sorted), then "##" characters (sorted), then merges
    assert tokens[300 - learned:][:11] == ["d", "e", "h", "l", "o", "r", "w",
                                           "##d", "##e", "##l", "##o"]
    assert {"hello", "world", "held"} <= set(tokens)


@pytest.mark.parametrize("min_frequency, merges", [(4, ["ab"]), (5, [])])
def test_min_frequency_stops_merges_below_it(min_frequency, merges):
    # pair counts: (a, ##b) 3 + 1 = 4; (c, ##d), (##b, ##c), (##c, ##d) 1 each
    counts = {"ab": 3, "cd": 1, "abcd": 1}
    result = wordpiece.train_vocab(counts, wordpiece.VocabConfig(vocab_size=200,
                                                         min_frequency=min_frequency))
    learned = result.tokens[200 - result.stats["num_learned_tokens"]:]
    assert learned == ["a", "b", "c", "d", "##b", "##c", "##d", *merges]
    assert len(result.tokens) == 200 and result.tokens[100:104] == ["[UNK]", "[CLS]", "[SEP]",
                                                                    "[MASK]"]


def test_tokenization_stats_are_weighted_by_word_counts():
    tokens = wordpiece.reserved_tokens(99) + ["a", "b", "##b", "ab"]
    stats = wordpiece.tokenization_stats(tokens, {"ab": 2, "abb": 1, "c": 1}, do_lower_case=True)
    # ab -> [ab] x2, abb -> [ab, ##b], c -> [UNK]: 5 pieces for 4 words
    assert stats == {"tokens_per_word": 1.25, "unk_word_fraction": 0.25,
                     "whole_word_fraction": 0.5}


# --- Beam ------------------------------------------------------------------------------------

def test_beam_word_counts_equal_python_counter(shared_data):
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    path = shared_data / "books" / "shakespeare-macbeth.txt"
    lines = path.read_text(encoding="utf-8").split("\n")
    expected = reference_word_counts([path])
    # cross-checked with grep: `grep -oiw macbeth` and `grep -oE "[A-Za-z0-9]+|[^A-Za-z0-9[:space:]]"`
    assert expected["macbeth"] == 62 and sum(expected.values()) == 23140
    with TestPipeline() as p:
        counts = p | beam.Create(lines) | train_vocab.CountWords(do_lower_case=True)
        assert_that(counts, equal_to(list(expected.items())))


def test_job_on_books_counts_exactly_and_keeps_bert_ids(books_vocab, shared_data, minilm_dir):
    manifest = json.loads((books_vocab / "manifest.json").read_text())
    tokens = read_vocab(str(books_vocab))
    assert len(tokens) == manifest["vocab_size"] == 4000
    bert = read_vocab(str(minilm_dir))
    for token in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]"]:
        assert tokens.index(token) == bert.index(token)
    assert manifest["vocab_sha256"] == hashlib.sha256(
        (books_vocab / "vocab.txt").read_bytes()).hexdigest()
    books = sorted((shared_data / "books").iterdir())
    expected = reference_word_counts(books)
    assert read_word_counts(books_vocab) == expected
    assert manifest["num_words"] == sum(expected.values()) == 1220736
    assert manifest["num_unique_words"] == len(expected) == 32973
    num_lines = sum(len(p.read_bytes().splitlines()) for p in books)
    assert manifest["num_texts"] == num_lines - len(BAD_BOOK_LINES) == 117830
    dead = [json.loads(line) for line in
            (books_vocab / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text().splitlines()]
    assert [(Path(r["file"]).name, r["record"]) for r in dead] == BAD_BOOK_LINES
    assert all("invalid UTF-8" in r["reason"] for r in dead)
    assert manifest["num_bad_records"] == 4
    assert manifest["config"]["num_unused_tokens"] == 130  # 4000 * 994 // 30522
    assert manifest["num_learned_tokens"] == 4000 - 135


def test_transformers_tokenizes_books_and_wiki_as_we_do(books_vocab, shared_data):
    import transformers

    theirs = transformers.BertTokenizerFast.from_pretrained(str(books_vocab))
    ours = load_tokenizer(str(books_vocab))
    assert theirs.vocab_size == 4000
    assert (theirs.pad_token_id, theirs.unk_token_id, theirs.cls_token_id, theirs.sep_token_id,
            theirs.mask_token_id) == (0, 100, 101, 102, 103)
    wiki = [t for t in train_vocab.text_file_texts(str(shared_data / WIKI_DUMP))
            if isinstance(t, str)]
    books = []
    for name in ("austen-emma.txt", "melville-moby_dick.txt"):
        books += (shared_data / "books" / name).read_text(encoding="utf-8").splitlines()
    assert (len(wiki), len(books)) == (8874, 39747)  # dump XML lines; two books' lines
    for lines in (wiki, books):
        got = [e.ids for e in ours.encode_batch(lines, add_special_tokens=False)]
        assert got == theirs(lines, add_special_tokens=False)["input_ids"]
    pair = ours.encode("The whale.", "Call me Ishmael.")
    assert pair.ids == theirs("The whale.", "Call me Ishmael.")["input_ids"]


def test_cased_option_keeps_case_and_accents(shared_data, tmp_path):
    corpus = tmp_path / "in.txt"
    text = (shared_data / "books" / "shakespeare-hamlet.txt").read_text(encoding="utf-8")
    corpus.write_text(text + "\nCafé Café Café Café\n" * 3)
    manifest = run_job(corpus, tmp_path / "out", "--vocab_size", 1500, "--cased")
    assert manifest["config"]["do_lower_case"] is False
    tokens = read_vocab(str(tmp_path / "out"))
    assert {"Hamlet", "Horatio", "Ham", "é", "##é"} <= set(tokens)
    counts = read_word_counts(tmp_path / "out")
    assert counts["Café"] == 12 and "cafe" not in counts
    assert counts == reference_word_counts([corpus], do_lower_case=False)
    import transformers

    theirs = transformers.BertTokenizerFast.from_pretrained(str(tmp_path / "out"))
    ours = load_tokenizer(str(tmp_path / "out"), do_lower_case=False)
    line = "HAMLET. To be, or not to be: Horatio drinks Café au lait."
    assert ours.encode(line, add_special_tokens=False).tokens == theirs.tokenize(line)
    assert "Hamlet" in theirs.tokenize("Hamlet speaks")


def test_parquet_corpus_and_documents_count_like_text(shared_data, tmp_path):
    lines = (shared_data / "books" / "blake-poems.txt").read_text(encoding="utf-8").splitlines()
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "blake.txt").write_text("\n".join(lines) + "\n")
    half = len(lines) // 2
    rows = {"doc_id": ["books/a", "books/b"], "source": ["books"] * 2,
            "source_file": ["blake"] * 2, "title": ["a", "b"]}
    (tmp_path / "corpus").mkdir()
    pq.write_table(pa.table({**rows, "passages": [["unused"], ["unused"]],
                             "sentences": [lines[:half], lines[half:]]}, schema=CORPUS_SCHEMA),
                   tmp_path / "corpus" / "corpus-00000-of-00001.parquet")
    # build_corpus --text_output writes the same shard as text beside it: not counted twice
    (tmp_path / "corpus" / "corpus-00000-of-00001.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "documents").mkdir()
    pq.write_table(pa.table({**rows, "passages": [lines[:half], lines[half:] + [None]]},
                            schema=DOCUMENT_SCHEMA),
                   tmp_path / "documents" / "documents-00000-of-00001.parquet")
    outputs = {}
    for kind in ("text", "corpus", "documents"):
        outputs[kind] = run_job(tmp_path / kind, tmp_path / f"out_{kind}", "--vocab_size", 600)
    assert read_word_counts(tmp_path / "out_corpus") == read_word_counts(tmp_path / "out_text")
    assert read_word_counts(tmp_path / "out_documents") == read_word_counts(tmp_path / "out_text")
    assert outputs["corpus"]["vocab_sha256"] == outputs["text"]["vocab_sha256"]
    assert outputs["documents"]["num_bad_records"] == 1
    dead = json.loads((tmp_path / "out_documents" / "dead_letter" / "dead_letter-00000-of-00001.jsonl").read_text())
    assert dead["record"] == f"row 1 passages[{len(lines) - half}]"
    assert dead["file"].endswith("documents-00000-of-00001.parquet")


def test_bad_files_are_set_aside_and_good_ones_counted(shared_data, tmp_path):
    dump = (shared_data / WIKI_DUMP).read_bytes()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "truncated.xml.bz2").write_bytes(dump[:len(dump) // 2])
    (tmp_path / "in" / "broken.parquet").write_bytes(b"PAR1 not a parquet file")
    good = (shared_data / "books" / "shakespeare-macbeth.txt").read_bytes()
    (tmp_path / "in" / "mixed.txt").write_bytes(good + b"caf\xe9 latin-1\n" + good)
    bad_line = good.count(b"\n") + 1
    manifest = run_job(tmp_path / "in", tmp_path / "out", "--vocab_size", 1000)
    dead = [json.loads(line) for line in (tmp_path / "out" / "dead_letter" /
                                           "dead_letter-00000-of-00001.jsonl").read_text().splitlines()]
    assert sorted((Path(r["file"]).name, r["record"], r["reason"].split(":")[0]) for r in dead) == [
        ("broken.parquet", "rest of file after 0 records", "unreadable"),
        ("mixed.txt", f"line {bad_line}", "invalid UTF-8"),
        ("truncated.xml.bz2", "rest of file after 0 records", "unreadable"),
    ]
    assert "EOFError" in next(r["reason"] for r in dead if r["file"].endswith(".bz2"))
    assert manifest["num_bad_records"] == 3
    expected = reference_word_counts([shared_data / "books" / "shakespeare-macbeth.txt"])
    assert read_word_counts(tmp_path / "out") == {w: 2 * c for w, c in expected.items()}


def test_same_vocab_in_one_process_and_two_worker_processes(shared_data, tmp_path):
    books = shared_data / "books"
    inputs = ",".join(str(books / n) for n in ("shakespeare-hamlet.txt", "shakespeare-macbeth.txt",
                                               "shakespeare-caesar.txt", "blake-poems.txt"))
    one = run_job(inputs, tmp_path / "one", "--vocab_size", 2500)
    two = run_job(inputs, tmp_path / "two", "--vocab_size", 2500, "--direct_num_workers=2",
                  "--direct_running_mode=multi_processing")
    again = run_job(inputs, tmp_path / "one", "--vocab_size", 2500)  # re-run over the same output
    for name in ("vocab.txt", "tokenizer.json", "word_counts.tsv"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    drop = {"train_seconds"}
    assert {k: v for k, v in one.items() if k not in drop} == \
        {k: v for k, v in two.items() if k not in drop} == \
        {k: v for k, v in again.items() if k not in drop}
    assert one["num_bad_records"] == 2 and one["vocab_size"] == 2500


def test_script_runs_as_beam_run_would(shared_data, tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "pipelines/train_vocab.py",
                          "--input", str(shared_data / "books" / "blake-poems.txt"),
                          "--output", str(tmp_path / "out"), "--vocab_size", "600",
                          "--no_progress", "--runner=DirectRunner"],
                         cwd=Path(__file__).resolve().parents[3], capture_output=True, text=True,
                         timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["vocab_size"] == 600
    assert manifest["num_words"] == sum(reference_word_counts(
        [shared_data / "books" / "blake-poems.txt"]).values())


def test_empty_input_is_a_clear_error_naming_it(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "blank.txt").write_text("\n  \n")
    out = tmp_path / "out"
    with pytest.raises(errors.NoOutputError, match=(
            rf"^0 words \(1 file\(s\): .*empty/blank\.txt\) from --input .*empty: 0 bad "
            rf"record\(s\) set aside in {out}/dead_letter/dead_letter-00000-of-00001.jsonl; "
            "no manifest written$")):
        run_job(tmp_path / "empty", out, "--vocab_size", 500)
    assert not (out / "manifest.json").exists()
    with pytest.raises(FileNotFoundError, match="nothing-here"):
        run_job(tmp_path / "nothing-here", tmp_path / "out", "--vocab_size", 500)
