"""The byte-level BPE vocabulary (`vocab.kind=bpe`): its layout and size, parity with
transformers' AutoTokenizer on the books and the Wikipedia sample (the vocab folder and our
export), whole-word masking over it in make_shards and the loader's re-masking, its merges
as part of its identity (shards and a checkpoint's vocabulary stage), and fine-tuning a BPE
checkpoint."""
from __future__ import annotations

import typing
from pathlib import Path

import numpy as np
import pytest

from common.masking import MaskingConfig, num_to_predict
from common.settings import SettingError
from common.tokenization import (
    BPE,
    VOCAB_KINDS,
    WORDPIECE,
    check_vocab_kind,
    continuation_flags,
    load_tokenizer,
    merges_sha256,
    read_merges,
    read_vocab,
    vocab_kind,
)
from pipelines import train_vocab
from pipelines.vocab import bpe
from pipelines.vocab.wordpiece import VocabConfig
from tests.support.shard_fixtures import book_corpus, read_rows

REPO = Path(__file__).resolve().parents[3]
WIKI_SAMPLE = REPO / "data" / "sample" / "wiki" / "enwiki-sample-pages-articles.xml.bz2"
TRAIN_BOOKS = ("austen-emma.txt", "melville-moby_dick.txt")


@pytest.fixture(scope="module")
def bpe_vocab(shared_data, tmp_path_factory) -> Path:
    """A 2,000-entry uncased BPE of two books, through the train_vocab job."""
    output = tmp_path_factory.mktemp("bpe_vocab")
    train_vocab.main(["--input", ",".join(str(shared_data / "books" / b) for b in TRAIN_BOOKS),
                      "--output", str(output), "--no_progress", "--kind", "bpe",
                      "--vocab_size", "2000"])
    return output


@pytest.fixture(scope="module")
def bpe_shards(bpe_vocab, shared_data, tmp_path_factory) -> Path:
    """Whole-word-masked 128-token shards of 120 book paragraphs with `bpe_vocab`."""
    from pipelines import make_shards

    folder = tmp_path_factory.mktemp("bpe_shards")
    corpus = book_corpus(shared_data / "books", folder / "corpus", paragraphs=120)
    make_shards.main(["--input", str(corpus), "--vocab", str(bpe_vocab),
                      "--output", str(folder / "shards"), "--num_shards", "1",
                      "--dupe_factor", "1", "--validation_fraction", "0",
                      "--max_seq_length", "128", "--do_whole_word_mask", "true"])
    return folder / "shards"


@pytest.fixture(scope="module")
def bpe_checkpoint(bpe_vocab, tmp_path_factory) -> Path:
    """bert_tiny on `bpe_vocab`, freshly initialised (seed 0), exported."""
    import torch

    from model.bert import bert_tiny
    from model.heads import BertForPreTraining
    from model.hf import export_hf_folder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("bpe_checkpoint")
    export_hf_folder(BertForPreTraining(bert_tiny(vocab_size=2048)), str(bpe_vocab), str(folder))
    return folder


def other_merges(bpe_vocab: Path, folder: Path) -> Path:
    """A copy of `bpe_vocab` with the same vocab.txt and its last two merges swapped."""
    import shutil

    shutil.copytree(bpe_vocab, folder)
    lines = (folder / "merges.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    lines[-2:] = lines[:-3:-1]
    (folder / "merges.txt").write_text("".join(lines), encoding="utf-8")
    return folder


def wiki_sample_passages() -> list[str]:
    """The bundled Wikipedia sample's passages, as extract_wikipedia makes them."""
    from pipelines.wikipedia.dump import Page, iter_pages, plan_splits
    from pipelines.wikipedia.wikitext import extract_passages

    return [passage for split in plan_splits(str(WIKI_SAMPLE), 1 << 30)
            for page in iter_pages(split) if isinstance(page, Page)
            for passage in extract_passages(page.text)]


def test_unknown_kind_is_one_line_naming_the_choices():
    assert typing.get_args(typing.get_type_hints(VocabConfig)["kind"]) == VOCAB_KINDS
    with pytest.raises(SettingError) as error:
        VocabConfig(kind="unigram")
    assert str(error.value) == "--kind must be one of wordpiece or bpe, got 'unigram'"
    with pytest.raises(SettingError) as error:
        VocabConfig(kind="bpe", vocab_size=260)
    assert str(error.value) == ("--vocab_size a byte-level BPE needs at least 261 entries "
                                "(5 special tokens and the 256 byte symbols), got 260")
    with pytest.raises(ValueError, match=r"^vocabulary kind must be one of wordpiece, bpe, "
                                         r"got 'sentencepiece'$"):
        check_vocab_kind("sentencepiece")


def test_size_is_padded_to_a_multiple_of_64():
    assert [bpe.padded_size(n) for n in (64, 65, 2000, 4000, 30522, 50280)] == [
        64, 128, 2048, 4032, 30528, 50304]


def test_same_counts_give_the_same_merges_in_any_order():
    split = bpe.word_splitter(do_lower_case=False)
    counts: dict[str, int] = {}
    for word in split("the cat sat on the mat, the cat's hat; a bat sat. " * 3):
        counts[word] = counts.get(word, 0) + 1
    config = VocabConfig(vocab_size=300, kind="bpe", min_frequency=1)
    one = bpe.train_vocab(counts, config)
    two = bpe.train_vocab(dict(reversed(list(counts.items()))), config)
    assert (one.tokens, one.merges) == (two.tokens, two.merges)
    assert len(one.tokens) == 320 and one.stats["num_learned_tokens"] == 256 + len(one.merges)
    # "at" (21 times: cat, sat, mat, hat, bat) before "he" (9), then "the" and "Ġthe"
    assert one.merges[:4] == [("a", "t"), ("h", "e"), ("t", "he"), ("Ġ", "the")]
    assert (len(one.merges), one.stats["num_unused_tokens"], one.stats["tokens_per_word"]) == (
        18, 41, 1.0)


def test_job_writes_a_bpe_folder_in_bert_names(bpe_vocab):
    manifest = train_vocab.storage.read_manifest(str(bpe_vocab))
    tokens = read_vocab(str(bpe_vocab))
    assert vocab_kind(str(bpe_vocab)) == vocab_kind(str(bpe_vocab / "vocab.txt")) == BPE
    assert (len(tokens), manifest["vocab_size"], manifest["num_learned_tokens"],
            manifest["num_merges"], manifest["num_unused_tokens"]) == (2048, 2048, 1995, 1739, 48)
    assert (manifest["num_words"], manifest["num_unique_words"]) == (459581, 21537)
    assert (manifest["tokens_per_word"], manifest["whole_word_fraction"]) == (1.369952, 0.78666)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert tokens[5:261] == sorted(tokens[5:261])  # the 256 byte symbols, then the merges
    assert tokens[261:264] == ["Ġt", "he", "Ġa"] and tokens[-1] == "[unused47]"
    assert len(read_merges(str(bpe_vocab))) == 1739
    assert manifest["merges_sha256"] == merges_sha256(str(bpe_vocab))
    flags = continuation_flags(tokens, BPE)
    assert (sum(flags), flags[tokens.index("Ġwhale")], flags[tokens.index("he")]) == (
        927, False, True)
    assert not any(flags[:5]) and not any(flags[-48:])  # specials and [unused*] never continue


def test_autotokenizer_encodes_books_and_wiki_as_we_do(bpe_vocab, shared_data, tmp_path):
    import transformers

    from model.bert import bert_tiny
    from model.heads import BertForPreTraining
    from model.hf import export_hf_folder

    export_hf_folder(BertForPreTraining(bert_tiny(vocab_size=2048)), str(bpe_vocab),
                     str(tmp_path / "hf"))
    assert (tmp_path / "hf" / "merges.txt").read_bytes() == (bpe_vocab / "merges.txt").read_bytes()
    ours = load_tokenizer(str(bpe_vocab))
    wiki = wiki_sample_passages()
    books = []
    for name in ("austen-persuasion.txt", "chesterton-brown.txt"):
        books += (shared_data / "books" / name).read_text(encoding="utf-8").splitlines()
    assert (len(wiki), len(books)) == (152, 16125)
    for folder in (bpe_vocab, tmp_path / "hf"):
        theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
        assert len(theirs) == 2048
        assert (theirs.pad_token_id, theirs.unk_token_id, theirs.cls_token_id,
                theirs.sep_token_id, theirs.mask_token_id) == (0, 1, 2, 3, 4)
        for lines in (wiki, books):
            got = [e.ids for e in ours.encode_batch(lines)]
            assert got == theirs(lines)["input_ids"]
        pair = ours.encode("The whale.", "Call me Ishmael.")
        assert pair.ids == theirs("The whale.", "Call me Ishmael.")["input_ids"]
    assert ours.encode("The whale.").tokens == ["[CLS]", "Ġthe", "Ġwhale", ".", "[SEP]"]
    assert sum(len(e.ids) for e in ours.encode_batch(wiki, add_special_tokens=False)) == 27619


def whole_word_groups(ids: list[int], starts_word: np.ndarray, special: set[int]):
    """Positions of each word: a new word at every piece transformers decodes to text that
    begins with a space (fairseq's RoBERTa rule), and at the first piece after [CLS]."""
    groups: list[list[int]] = []
    for position, token in enumerate(ids):
        if token in special:
            continue
        if not groups or starts_word[token]:
            groups.append([position])
        else:
            groups[-1].append(position)
    return groups


def test_whole_word_masks_cover_whole_words(bpe_vocab, bpe_shards):
    import transformers

    from training.remasking import KeyedRow, Remasker

    rows = read_rows(bpe_shards)
    theirs = transformers.AutoTokenizer.from_pretrained(str(bpe_vocab))
    starts_word = np.array([theirs.decode([i]).startswith(" ") for i in range(len(theirs))])
    special = {0, 2, 3}  # [PAD] [CLS] [SEP]
    remasker = Remasker.from_vocab(str(bpe_vocab), seed=7,
                                   masking=MaskingConfig(do_whole_word_mask=True))
    assert remasker.subword_ids == tuple(np.flatnonzero(
        continuation_flags(read_vocab(str(bpe_vocab)), BPE)))

    def masked_words(row) -> int:
        ids = np.array(row.input_ids, dtype=np.int64)
        ids[row.masked_lm_positions] = row.masked_lm_ids
        masked = set(np.asarray(row.masked_lm_positions).tolist())
        n = int(num_to_predict(len(ids), MaskingConfig()))
        multi = 0
        for group in whole_word_groups(ids.tolist(), starts_word, special):
            hit = masked.intersection(group)
            assert not hit or len(hit) == len(group), (group, sorted(masked))
            if not hit:
                assert len(group) > n - len(masked)  # left out only when it no longer fits
            multi += bool(hit) and len(group) > 1
        return multi

    static = [masked_words(row) for row in rows]
    dynamic = [masked_words(remasker(KeyedRow(row, "train-000000.tar", "k", i), epoch=1))
               for i, row in enumerate(rows)]
    # multi-piece words masked whole: in the shards' static masks and in the loader's re-draw
    assert (len(rows), sum(static), sum(dynamic)) == (283, 967, 942)


def test_shards_made_with_other_merges_are_refused(bpe_vocab, bpe_shards, tmp_path):
    """Two BPE vocabularies with one vocab.txt and other merges: the shards' manifest records
    the merges, and a run whose vocabulary has others is refused before its first step."""
    from common import storage
    from training.config import PhaseConfig, PretrainConfig, PretrainDataConfig
    from training.preflight import check_phase_inputs

    other = other_merges(bpe_vocab, tmp_path / "other")
    assert read_vocab(str(other)) == read_vocab(str(bpe_vocab))
    ours, theirs = merges_sha256(str(bpe_vocab)), merges_sha256(str(other))
    assert ours != theirs and merges_sha256(str(bpe_vocab / "vocab.txt")) == ours
    recorded = storage.read_manifest(str(bpe_shards))["vocab"]
    assert (recorded["merges_sha256"], recorded["sha256"]) == (
        ours, storage.sha256_file(str(other / "vocab.txt")))

    def config(vocab_dir: Path) -> PretrainConfig:
        return PretrainConfig(data=PretrainDataConfig(vocab_dir=str(vocab_dir)), phases=(
            PhaseConfig(train_shards=str(bpe_shards), micro_batch_size=4, global_batch_size=4,
                        steps=1, warmup_steps=0),))

    check_phase_inputs(config(bpe_vocab))
    with pytest.raises(ValueError) as refused:
        check_phase_inputs(config(other))
    assert str(refused.value) == (
        f"phase1.train_shards={bpe_shards}: shards made with the BPE merges of "
        f"{bpe_vocab / 'vocab.txt'} (merges sha256 {ours[:12]}), but data.vocab_dir={other} "
        f"holds others (merges sha256 {theirs[:12]}): the same text splits into other ids. "
        "Make the shards with the run's vocabulary")


def test_a_bpe_checkpoints_vocabulary_stage_is_keyed_on_its_merges(bpe_vocab, bpe_checkpoint,
                                                                    tmp_path):
    """Continued pre-training from two BPE checkpoints with one weights file and vocab.txt but
    other merges: their vocabulary stages (flows/checkpoint_vocab.py) differ in the merges."""
    from flows.checkpoint_vocab import checkpoint_vocab_settings

    other = other_merges(bpe_checkpoint, tmp_path / "other")
    first, second = (checkpoint_vocab_settings(str(f)) for f in (bpe_checkpoint, other))
    assert (first["merges_sha256"], second["merges_sha256"]) == (
        merges_sha256(str(bpe_vocab)), merges_sha256(str(other)))
    assert first["merges_sha256"] != second["merges_sha256"]
    same = ("checkpoint_sha256", "vocab_sha256", "do_lower_case")
    assert [first[k] for k in same] == [second[k] for k in same]


def test_a_bpe_checkpoint_fine_tunes_a_glue_task(bpe_checkpoint, tmp_path):
    """bert-finetune on a BPE checkpoint: RTE's pairs are encoded by its byte-level BPE, as
    transformers' AutoTokenizer encodes them (from its tokenizer.json, or without one from
    vocab.txt and merges.txt), and 16 examples train and score."""
    import json
    import shutil

    import transformers

    from finetune import cli as finetune_cli
    from finetune.glue.data import load_glue_tokenizer
    from finetune.tasks import get_task
    from flows.config import SAMPLE

    glue = SAMPLE / "glue"
    rows = {r[0]: r for r in (line.split("\t") for line in
                              (glue / "RTE" / "dev.tsv").read_text().splitlines()[1:])}
    theirs = transformers.AutoTokenizer.from_pretrained(str(bpe_checkpoint))
    bare = tmp_path / "bare"  # vocab.txt and merges.txt only
    shutil.copytree(bpe_checkpoint, bare)
    (bare / "tokenizer.json").unlink()
    for folder in (bpe_checkpoint, bare):
        tokenizer = load_glue_tokenizer(str(folder), 128)
        assert tokenizer.encode("The whale.").tokens == ["[CLS]", "Ġthe", "Ġwhale", ".", "[SEP]"]
        dev = get_task("rte").family.prepare("rte", str(glue), tokenizer, 128, 16, 8,
                                             False).dev["dev"]
        assert [ids.tolist() for ids in dev.input_ids] == [
            theirs(rows[g][1], rows[g][2], truncation=True, max_length=128)["input_ids"]
            for g in dev.guids]
    out = tmp_path / "run"
    assert finetune_cli.main([
        "--model", str(bpe_checkpoint), "--data", str(SAMPLE), "--tasks", "rte", "--output",
        str(out), "--max_train_examples", "16", "--max_eval_examples", "8", "--epochs", "1",
        "--batch_size", "8", "--learning_rates", "1e-4", "--seeds", "1", "--max_seq_length",
        "128", "--no_progress", "--num_threads", "1", "--no_test"]) == 0
    (task,) = json.loads((out / "results.json").read_text())["tasks"]
    # a seeded CPU run repeats: its score (8 dev examples) and, to float rounding, its loss
    assert (task["task"], task["num_train_examples"], task["score"]) == ("RTE", 16, 0.625)
    assert [run["final_loss"] for run in task["runs"]] == pytest.approx([0.6861413], abs=1e-6)


def test_wordpiece_folders_stay_wordpiece(minilm_dir):
    assert vocab_kind(str(minilm_dir)) == WORDPIECE and read_merges(str(minilm_dir)) is None
    tokens = read_vocab(str(minilm_dir))
    assert continuation_flags(tokens, WORDPIECE) == [t.startswith("##") for t in tokens]
