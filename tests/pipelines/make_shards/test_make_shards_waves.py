"""make_shards in waves: the input cut into consecutive waves, each a pipeline of its own, so a
local run's memory follows the wave; random nexts are drawn within a wave."""

from __future__ import annotations

import json

import pytest

from common.tokenization import load_tokenizer, read_vocab
from pipelines import jobs, make_shards
from pipelines.shards import reading
from pipelines.shards import shard_files as shards
from pipelines.shards.config import LOCAL_WAVE_MB, ShardsConfig
from pipelines.shards.instances import (
    InstanceConfig,
    Vocab,
    create_instances_scalable,
    read_reference_text,
)
from tests.pipelines.make_shards.shard_runs import _run, _shard_files

ONE_PART_PER_FILE = ("--read_part_kb", "100000")


def _part(index: int, num_bytes: int) -> reading.ReadPart:
    return reading.ReadPart(index, f"f{index}", 0, 1, num_bytes, f"f{index}")


def test_waves_cut_the_parts_in_input_order():
    parts = [_part(i, n) for i, n in enumerate([5, 5, 5, 12, 1, 1])]
    cut = reading.input_waves(parts, 10)
    assert [[p.file_index for p in w] for w in cut] == [[0, 1], [2], [3], [4, 5]]
    assert reading.input_waves(parts, 0) == [parts]
    assert reading.input_waves([], 10) == []


def _key(ids, segments, positions, masked_ids, label) -> tuple:
    return (tuple(ids), tuple(segments), tuple(positions), tuple(masked_ids), int(label))


def test_each_wave_draws_random_nexts_from_its_own_files(corpus, minilm_dir, tmp_path):
    """A file a wave: the shards hold exactly each file's own instances (as if the generator
    ran on that file alone), the shard indices run on across waves, and 1 and 2 workers give
    the same bytes."""
    files = sorted(corpus["text"].iterdir())
    manifest = _run(corpus["text"], tmp_path / "one", minilm_dir, *ONE_PART_PER_FILE,
                    "--wave_mb", "0.001", "--num_shards", str(len(files)))
    assert manifest["counters"]["waves"] == len(files) == 4
    assert manifest["options"]["job"]["wave_mb"] == 0.001
    assert [e["file"] for e in manifest["shards"]] == [f"train-{i:06d}.tar" for i in range(4)]

    tokenizer = load_tokenizer(str(minilm_dir))
    vocab = Vocab.from_tokens(read_vocab(str(minilm_dir)))
    want = []
    for path in files:
        with open(path, encoding="utf-8", newline="\n") as f:
            docs = read_reference_text(f, tokenizer)
        want += [_key(i.input_ids.tolist(), i.segment_ids.tolist(), i.masked_lm_positions.tolist(),
                      i.masked_lm_ids.tolist(), i.next_sentence_label)
                 for i in create_instances_scalable(docs, vocab, InstanceConfig(dupe_factor=2))]
    got = [_key(r.input_ids.tolist(), r.segment_ids.tolist(), r.masked_lm_positions.tolist(),
                r.masked_lm_ids.tolist(), r.next_sentence_labels[0])
           for e in manifest["shards"] for r in shards.read_rows(str(tmp_path / "one" / e["file"]))]
    assert sorted(got) == sorted(want)

    two = _run(corpus["text"], tmp_path / "two", minilm_dir, *ONE_PART_PER_FILE,
               "--wave_mb", "0.001", "--num_shards", str(len(files)),
               "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert _shard_files(tmp_path / "two") == _shard_files(tmp_path / "one")
    assert two["shards"] == manifest["shards"]


def test_one_wave_is_the_whole_input(one_worker, corpus, minilm_dir, tmp_path):
    """Input within one wave: the same bytes as a run with waves off."""
    out, manifest = one_worker
    assert manifest["options"]["job"]["wave_mb"] == LOCAL_WAVE_MB  # unset on the local runner
    assert manifest["counters"]["waves"] == 1
    off = _run(corpus["text"], tmp_path / "off", minilm_dir, "--wave_mb", "0")
    assert _shard_files(tmp_path / "off") == _shard_files(out)
    assert off["counters"]["waves"] == 1


def test_waves_join_their_dead_letters(corpus, minilm_dir, tmp_path):
    text = tmp_path / "text"
    text.mkdir()
    for path in sorted(corpus["text"].iterdir())[:2]:
        (text / path.name).write_bytes(path.read_bytes())
    (text / "c-binary.txt").write_bytes(bytes(range(256)) * 64)
    stale = tmp_path / "out" / "dead_letter" / "make_shards-wave00007.jsonl"
    stale.parent.mkdir(parents=True)
    stale.write_text("left by a killed run\n")
    manifest = _run(text, tmp_path / "out", minilm_dir, *ONE_PART_PER_FILE, "--wave_mb", "0.001")
    assert manifest["counters"]["waves"] == 3 and manifest["counters"]["bad_records"] == 1
    letters = sorted(p.name for p in (tmp_path / "out" / "dead_letter").iterdir())
    assert letters == ["make_shards.jsonl"]
    (line,) = (tmp_path / "out" / "dead_letter" / "make_shards.jsonl").read_text().splitlines()
    assert json.loads(line)["file"].endswith("c-binary.txt")


def test_fixed_shard_count_is_shared_by_the_waves(corpus, minilm_dir, tmp_path):
    wave = make_shards.Wave
    assert [make_shards.wave_num_shards(10, wave(w, 4)) for w in range(4)] == [2, 3, 2, 3]
    assert make_shards.wave_num_shards(0, wave(1, 4)) == 0
    with pytest.raises(ValueError, match=r"--num_shards 3 is fewer than the 4 waves of "
                                         r"--wave_mb 0.001"):
        _run(corpus["text"], tmp_path / "out", minilm_dir, *ONE_PART_PER_FILE,
             "--wave_mb", "0.001")


def test_unset_wave_size_follows_the_runner():
    config = ShardsConfig()
    local = make_shards.resolve_wave_mb(config, jobs.beam_pipeline_options([]))
    dataflow = make_shards.resolve_wave_mb(config, jobs.beam_pipeline_options(
        ["--runner=DataflowRunner"]))
    assert (local.wave_mb, dataflow.wave_mb) == (LOCAL_WAVE_MB, 0.0)
    assert make_shards.resolve_wave_mb(ShardsConfig(wave_mb=3), jobs.beam_pipeline_options(
        ["--runner=DataflowRunner"])).wave_mb == 3
