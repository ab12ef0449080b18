"""benchmarks/gpu_check.py runs on CPU with --device cpu on the tiny shapes: the same
pre-training steps, sync count and fine-tuning step a GPU run makes (its speed is a GPU's)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import gpu_check


def test_gpu_check_passes_on_cpu_tiny_shapes(capsys):
    """128 tokens only, to stay fast (`--seq_lens 128,512` is the script's default)."""
    assert gpu_check.main(["--device", "cpu", "--steps", "1", "--seq_lens", "128"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("bert_tiny")]
    assert [re.match(r"bert_tiny +(T=\d+|fine-tuning)", line)[1] for line in lines] == [
        "T=128", "fine-tuning"]
    assert "no math SDPA, no sync" in lines[0]
    assert out.rstrip().endswith("gpu_check passed")


def test_synthetic_rows_are_packed_at_512_as_the_shards_are():
    rows = gpu_check.synthetic_rows(32, 512, seed=512)
    per_row = [len(r.next_sentence_labels) for r in rows]
    assert max(per_row) == 2 and all(len(r.input_ids) <= 512 for r in rows)
    assert all(len(r.next_sentence_labels) == 1 for r in gpu_check.synthetic_rows(32, 128, 1))
