"""The masking ablations of the paper's Table 8 (MASK/SAME/RND split), the mask rate and
whole-word masking: `common.masking` itself, make_shards (scalable mode, end to end) and the
loader's dynamic re-masking, on real text with the bert-base-uncased vocabulary (MiniLM's) or
the books' small vocabulary. Statistical checks use a 4-sigma binomial tolerance.
"""
from __future__ import annotations

import collections
import math
import random

import numpy as np
import pytest

from common import masking
from common.masking import MaskingConfig, reference_replacement, replace_tokens
from common.tokenization import load_tokenizer, read_vocab
from pipelines import make_shards
from pipelines.shards import shard_files
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_scalable,
    read_reference_text,
)
from tests.support.shard_fixtures import book_shards
from training.remasking import KeyedRow, Remasker

SIGMAS = 4.0
MASK_ID = 103  # [MASK] in bert-base-uncased


def within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= SIGMAS * math.sqrt(n * p * (1 - p)) + 1e-9


def at_most_by_chance(count: int, n: int, p: float) -> bool:
    """`count` of n is no more than random draws at rate p give (4 sigma)."""
    return count <= n * p + SIGMAS * math.sqrt(n * p * (1 - p))


def split(mask: float, same: float, rnd: float, **changes) -> MaskingConfig:
    return MaskingConfig(mask_fraction=mask, same_fraction=same, random_fraction=rnd, **changes)


@pytest.fixture(scope="module")
def vocab(minilm_dir) -> Vocab:
    return Vocab.from_tokens(read_vocab(str(minilm_dir / "vocab.txt")))


@pytest.fixture(scope="module")
def sample_docs(shared_data, minilm_dir):
    tokenizer = load_tokenizer(str(minilm_dir / "vocab.txt"))
    with open(shared_data / "reference" / "sample_text.txt", encoding="utf-8", newline="\n") as f:
        return read_reference_text(f, tokenizer)


# ---------------------------------------------------------------- the pure function

def _kinds(cfg: MaskingConfig, vocab: Vocab, n: int = 200_000, seed: int = 5):
    """Replace n real tokens (ids 2000..2000+n, never [MASK]) with one seeded draw each."""
    rng = np.random.default_rng(seed)
    original = rng.integers(2000, 29000, size=n).astype(np.int32)
    tokens = original.copy()
    replace_tokens(tokens, np.arange(n), rng.random(n), cfg, MASK_ID, vocab.replacement_ids)
    return original, tokens


@pytest.mark.parametrize("fractions", [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.8, 0.0, 0.2),
                                       (0.8, 0.2, 0.0), (0.0, 0.2, 0.8), (0.0, 0.0, 1.0)])
def test_every_split_of_table_8_gives_its_fractions(fractions, vocab):
    """Each split of Table 8 on 200k seeded draws: [MASK] and unchanged shares within 4 sigma
    of the setting, none at all where the setting is 0; random tokens uniform over the vocab."""
    mask, same, rnd = fractions
    original, tokens = _kinds(split(*fractions), vocab)
    n = len(tokens)
    masked = int((tokens == MASK_ID).sum())
    unchanged = int((tokens == original).sum())
    # random ids come from the whole vocabulary, as in BERT's reference (`vocab_words`): one
    # equal to the original reads as unchanged, one equal to [MASK] as masked (p = rnd / V each)
    v = len(vocab.replacement_ids)
    assert within(masked, n, mask + rnd / v) and within(unchanged, n, same + rnd / v)
    if mask == 0.0:
        assert at_most_by_chance(masked, n, rnd / v)  # 6 of 200k at 0/20/80
    if same == 0.0 and rnd == 0.0:
        assert unchanged == 0
    if rnd == 0.0:
        assert masked + unchanged == n
    else:  # the random ids cover the vocabulary evenly: 30522 ids, [0, V/2) vs [V/2, V)
        replaced = tokens[(tokens != MASK_ID) & (tokens != original)]
        low = int((replaced < len(vocab.replacement_ids) // 2).sum())
        assert within(low, len(replaced), 0.5)


def test_80_10_10_is_the_scalable_rule_of_before(vocab):
    """At 80/10/10 the shared function is the scalable mode's rule: one draw, [MASK] below 0.8,
    from 0.9 a random id at floor((draw - 0.9) * 10 * K), else unchanged (written out here)."""
    original, tokens = _kinds(MaskingConfig(), vocab, n=50_000, seed=11)
    draws = np.random.default_rng(11)
    draws.integers(2000, 29000, size=50_000)
    u = draws.random(50_000)
    k = len(vocab.replacement_ids)
    expected = original.copy()
    expected[u < 0.8] = MASK_ID
    high = u >= 0.9
    expected[high] = vocab.replacement_ids[np.minimum(((u[high] - 0.9) * 10.0 * k).astype(int),
                                                      k - 1)]
    assert np.array_equal(tokens, expected)


def test_reference_draw_order_at_other_splits(vocab):
    """Reference mode: [MASK] on the first draw below mask_fraction; else a second draw picks
    unchanged below same / (same + random). At 0/20/80: no [MASK], 20% unchanged."""
    rng, n = random.Random(3), 50_000
    out = [reference_replacement(7, rng, split(0.0, 0.2, 0.8), MASK_ID, vocab.replacement_ids)
           for _ in range(n)]
    assert MASK_ID not in out
    assert within(out.count(7), n, 0.2 + 0.8 / len(vocab.replacement_ids))
    # the stream: first draw, second draw, then randint only for a random token
    rng, check = random.Random(3), random.Random(3)
    got = reference_replacement(7, rng, split(0.0, 0.2, 0.8), MASK_ID, vocab.replacement_ids)
    check.random()
    want = 7 if check.random() < 0.25 else int(vocab.replacement_ids[check.randint(0, 30521)])
    assert got == want and rng.getstate() == check.getstate()


def test_a_split_not_summing_to_one_names_the_flags():
    with pytest.raises(ValueError, match="--mask_fraction with same_fraction and random_fraction "
                                         ".the MASK/SAME/RND split.: each"):
        InstanceConfig(mask_fraction=0.8, same_fraction=0.1, random_fraction=0.2)
    with pytest.raises(ValueError, match=r"sum to 1, got \(0.5, 0.1, 0.1\)"):
        MaskingConfig(mask_fraction=0.5)
    args = make_shards.build_parser().parse_args(["--input", "i", "--output", "o", "--vocab",
                                                  "v", "--mask_fraction", "most"])
    from pipelines import jobs
    from pipelines.shards.config import ShardsConfig
    with pytest.raises(ValueError, match="^--mask_fraction='most': 'most' is not a number"):
        jobs.config_from_args(args, ShardsConfig())


def test_scalable_instances_with_0_20_80_have_no_mask_token(sample_docs, vocab):
    """finalize_instances at 0/20/80 on the reference sample: the same positions as 80/10/10
    (the split draws after the choice), [MASK] only where a random id happens to be it,
    ~20% of positions unchanged."""
    common = {"max_seq_length": 32, "max_predictions_per_seq": 5, "dupe_factor": 20}
    default = create_instances_scalable(sample_docs, vocab, InstanceConfig(**common))
    ablated = create_instances_scalable(sample_docs, vocab, InstanceConfig(
        **common, mask_fraction=0.0, same_fraction=0.2, random_fraction=0.8))
    assert len(ablated) == len(default) > 400
    kept = masks = total = 0
    v = len(vocab.replacement_ids)
    for a, d in zip(ablated, default):
        assert np.array_equal(a.masked_lm_positions, d.masked_lm_positions)
        at = a.input_ids[a.masked_lm_positions]
        masks += int((at == vocab.mask_id).sum())
        assert (a.input_ids == vocab.mask_id).sum() == (at == vocab.mask_id).sum()
        kept += int((at == a.masked_lm_ids).sum())
        total += len(a.masked_lm_positions)
    assert within(kept, total, 0.2 + 0.8 / v) and at_most_by_chance(masks, total, 0.8 / v)
    assert sum(int((d.input_ids == vocab.mask_id).sum()) for d in default) > 0.75 * total


# ---------------------------------------------------------------- make_shards end to end

def test_make_shards_with_a_table_8_split(shared_data, minilm_dir, tmp_path):
    """The Beam job with --mask_fraction 0 --same_fraction 0.2 --random_fraction 0.8: the
    manifest records the split (and hashes it: another config_hash than 80/10/10's), the same
    number of predictions, and [MASK] only where a random id happens to be it."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "sample.txt").write_bytes((shared_data / "reference" / "sample_text.txt").read_bytes())
    common = ["--input", str(corpus), "--vocab", str(minilm_dir), "--dupe_factor", "2",
              "--num_shards", "2", "--max_seq_length", "64", "--max_predictions_per_seq", "10"]
    ablated = make_shards.main([*common, "--output", str(tmp_path / "a"), "--mask_fraction", "0",
                               "--same_fraction", "0.2", "--random_fraction", "0.8"])
    default = make_shards.main([*common, "--output", str(tmp_path / "d")])
    options = ablated["options"]["instance"]
    assert (options["mask_fraction"], options["same_fraction"], options["random_fraction"]) == \
        (0.0, 0.2, 0.8)
    assert ablated["config_hash"] != default["config_hash"]
    assert ablated["totals"]["num_masked"] == default["totals"]["num_masked"] > 100
    rows = [row for e in ablated["shards"] for row in shard_files.read_rows(str(tmp_path / "a" / e["file"]))]
    assert sum(len(r.masked_lm_positions) for r in rows) == ablated["totals"]["num_masked"]
    masks = sum(int((r.input_ids == MASK_ID).sum()) for r in rows)
    assert at_most_by_chance(masks, ablated["totals"]["num_masked"], 0.8 / 30522)
    default_rows = [row for e in default["shards"]
                    for row in shard_files.read_rows(str(tmp_path / "d" / e["file"]))]
    assert sum(int((r.input_ids == MASK_ID).sum()) for r in default_rows) > \
        0.7 * default["totals"]["num_masked"]


# ---------------------------------------------------------------- dynamic re-masking

@pytest.fixture(scope="module")
def books(shared_data, tmp_path_factory):
    made = book_shards(shared_data / "books", tmp_path_factory.getbasetemp() / "book_shards")
    return made.vocab_dir, made.rows_128


def _remask(remasker: Remasker, rows, epoch: int = 0):
    for i, row in enumerate(rows):
        original = row.input_ids.astype(np.int64).copy()
        original[row.masked_lm_positions] = row.masked_lm_ids
        yield row, original, remasker(KeyedRow(row, "train-000000.tar", "k", i), epoch)


def test_dynamic_masking_honours_the_split(books):
    """0/0/100 in the loader: every predicted position a random id ([MASK] or unchanged only
    by chance), the text restored by the labels, the row's count kept."""
    vocab_dir, rows = books
    v = len(read_vocab(str(vocab_dir)))
    remasker = Remasker.from_vocab(str(vocab_dir), seed=2, masking=split(0.0, 0.0, 1.0))
    same = masks = total = 0
    for row, original, new in _remask(remasker, rows[:400]):
        assert len(new.masked_lm_positions) == len(row.masked_lm_positions)
        assert np.array_equal(new.masked_lm_ids, original[new.masked_lm_positions])
        at = new.input_ids[new.masked_lm_positions]
        assert (new.input_ids == remasker.mask_id).sum() == (at == remasker.mask_id).sum()
        same += int((at == new.masked_lm_ids).sum())
        masks += int((at == remasker.mask_id).sum())
        total += len(new.masked_lm_positions)
    assert total > 5000 and within(same, total, 1 / v) and at_most_by_chance(masks, total, 1 / v)


def _words(tokens: list[str], ids: np.ndarray, special: set[int]) -> list[list[int]]:
    """Positions of each word: a piece not starting with ## starts one."""
    words: list[list[int]] = []
    for i, t in enumerate(ids.tolist()):
        if t in special:
            continue
        if tokens[t].startswith("##") and words:
            words[-1].append(i)
        else:
            words.append([i])
    return words


def test_dynamic_whole_word_masking_masks_all_pieces_of_a_word(books):
    """Whole-word dynamic masking at the rate 0.15: every word is predicted with all its
    WordPiece pieces or not at all, and multi-piece words are among the predicted ones; each
    row predicts at most round(0.15 x tokens) (cap 20) positions, the rows together ~that."""
    vocab_dir, rows = books
    tokens = read_vocab(str(vocab_dir))
    cfg = MaskingConfig(masked_lm_prob=0.15, max_predictions_per_seq=20, do_whole_word_mask=True)
    remasker = Remasker.from_vocab(str(vocab_dir), seed=3, masking=cfg, recount=True)
    multi = predicted = wanted = 0
    for _row, original, new in _remask(remasker, rows[:300]):
        chosen = set(new.masked_lm_positions.tolist())
        for word in _words(tokens, original, set(remasker.special_ids)):
            inside = [p in chosen for p in word]
            assert all(inside) or not any(inside), (word, inside)
            multi += len(word) > 1 and all(inside)
        n = masking.num_to_predict(int((original != 0).sum()), cfg)
        assert len(chosen) <= n
        predicted, wanted = predicted + len(chosen), wanted + n
    assert multi > 50
    assert predicted > 0.97 * wanted  # a word that would overshoot is skipped, rarely


def test_dynamic_masking_counter_matches_kinds(books):
    """80/20/0 in the loader: [MASK] ~80%, unchanged ~20%, never a random token."""
    vocab_dir, rows = books
    remasker = Remasker.from_vocab(str(vocab_dir), seed=4, masking=split(0.8, 0.2, 0.0))
    kinds = collections.Counter()
    for _row, _original, new in _remask(remasker, rows[:300]):
        at = new.input_ids[new.masked_lm_positions]
        kinds.update(np.where(at == remasker.mask_id, "mask",
                              np.where(at == new.masked_lm_ids, "same", "random")).tolist())
    total = sum(kinds.values())
    assert kinds["random"] == 0 and within(kinds["mask"], total, 0.8)


def test_flow_shard_settings_reach_make_shards_and_the_stage_hash():
    """The flow's shards.* ablation settings are the make_shards job's own fields: set on both
    phases' shard configs (so in their stage keys), the job's flags give the same config, and a
    bad split is an error in the flow's setting name."""
    import dataclasses

    from flows import config

    ablated = config.resolve("tiny", config.parse_set_flags([
        "shards.mask_fraction=0", "shards.same_fraction=0.2", "shards.random_fraction=0.8",
        "shards.next_sentence=false"]))
    default = config.resolve("tiny", {})
    for phase in ("phase1", "phase2"):
        mine, base = getattr(ablated.shards, phase), getattr(default.shards, phase)
        changed = {k: v for k, v in dataclasses.asdict(mine).items()
                   if v != dataclasses.asdict(base)[k]}
        assert changed == {"mask_fraction": 0.0, "same_fraction": 0.2, "random_fraction": 0.8,
                           "next_sentence": False}
    args = make_shards.build_parser().parse_args(
        ["--input", "i", "--output", "o", "--vocab", "v", "--mask_fraction=0",
         "--same_fraction=0.2", "--random_fraction=0.8", "--no_next_sentence",
         "--max_seq_length=128", "--max_predictions_per_seq=20"])
    from pipelines import jobs
    from pipelines.shards.config import ShardsConfig
    job = jobs.config_from_args(args, ShardsConfig())
    assert (job.mask_fraction, job.same_fraction, job.random_fraction, job.next_sentence) == \
        (0.0, 0.2, 0.8, False)
    with pytest.raises(ValueError, match=r"^setting shards.phase1.mask_fraction: with "
                                         "same_fraction"):
        config.resolve("tiny", {"shards": {"mask_fraction": 0.5}})