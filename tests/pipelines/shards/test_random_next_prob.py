"""`random_next_prob`, the probability of a random B: one field of `InstanceConfig` (and the code
that reads it) gives the pure function's option, make_shards' flag, `--set`, and the flow's
`shards.random_next_prob` / `shards.phase2.random_next_prob`, with checks that name each."""
from __future__ import annotations

import pytest

from flows.config import parse_set_flags, resolve
from pipelines import jobs, make_shards
from pipelines.shards.config import ShardsConfig
from pipelines.shards.instances import ACTUAL_NEXT, InstanceConfig
from tests.pipelines.shards.instance_checks import (
    assert_random_next_share,
    books_cfg,
    scalable_plans,
)


@pytest.mark.parametrize("p", [0.2, 0.8])
def test_the_coin_of_multi_segment_chunks_is_random_next_prob(book_docs, p):
    plans = scalable_plans(book_docs, books_cfg(random_next_prob=p))
    f1 = assert_random_next_share(plans, book_docs, p)
    assert 0.05 < f1 < 0.6


def test_at_zero_only_one_segment_chunks_take_a_random_b(book_docs):
    plans = scalable_plans(book_docs, books_cfg(random_next_prob=0.0))
    assert all(plan.next_sentence_label == ACTUAL_NEXT
               for plan in plans if plan.chunk_segments > 1)


def test_the_reference_coin_is_the_default():
    assert InstanceConfig().random_next_prob == 0.5 == ShardsConfig().random_next_prob


def test_the_flag_the_set_flag_and_the_flow_setting_come_from_the_field():
    args, _ = make_shards.build_parser().parse_known_args(
        ["--input", "in", "--output", "out", "--vocab", "v", "--random_next_prob", "0.3"])
    assert jobs.config_from_args(args, ShardsConfig()).random_next_prob == 0.3
    args, _ = make_shards.build_parser().parse_known_args(
        ["--input", "in", "--output", "out", "--vocab", "v", "--set", "random_next_prob=0.25"])
    assert jobs.config_from_args(args, ShardsConfig()).random_next_prob == 0.25
    help_text = " ".join(make_shards.build_parser().format_help().split())
    assert "Probability that B is drawn from another document" in help_text

    both = resolve("tiny", parse_set_flags(["shards.random_next_prob=0.3"]))
    assert (both.shards.phase1.random_next_prob, both.shards.phase2.random_next_prob) == (0.3, 0.3)
    one = resolve("tiny", parse_set_flags(["shards.phase2.random_next_prob=0.1"]))
    assert (one.shards.phase1.random_next_prob, one.shards.phase2.random_next_prob) == (0.5, 0.1)

    with pytest.raises(ValueError) as flow:
        resolve("tiny", parse_set_flags(["shards.phase1.random_next_prob=1.5"]))
    assert str(flow.value) == "setting shards.phase1.random_next_prob: must be in [0, 1], got 1.5"
    args, _ = make_shards.build_parser().parse_known_args(
        ["--input", "in", "--output", "out", "--vocab", "v", "--random_next_prob", "-1"])
    with pytest.raises(ValueError) as job:
        jobs.config_from_args(args, ShardsConfig())
    assert str(job.value) == "--random_next_prob: must be in [0, 1], got -1.0"
