"""Small real SQuAD inputs for the SQuAD tests: slices of the shared files, and logits that
make realistic (imperfect) answers."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from finetune.squad.features import Windows


def squad_slice(source: Path, out: Path, articles: dict[int, list[int] | None]) -> Path:
    """A SQuAD file of some articles of `source`: {article index: paragraph indices or None
    for all}, in the official layout."""
    dataset = json.loads(source.read_text(encoding="utf-8"))
    data = []
    for a, paragraphs in articles.items():
        article = dataset["data"][a]
        if paragraphs is not None:
            article = {**article, "paragraphs": [article["paragraphs"][p] for p in paragraphs]}
        data.append(article)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"version": dataset["version"], "data": data}), encoding="utf-8")
    return out


def noisy_logits(windows: Windows, seed: int, noise: float = 1.5, bump: float = 4.0
                 ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Start/end logits per window: gaussian noise plus `bump` at the window's gold start and
    end (the [CLS] where the window has no answer), so most answers are right and some are
    near misses or wrong spans, as a half-trained model's."""
    rng = np.random.default_rng(seed)
    starts, ends = [], []
    for n, ids in enumerate(windows.input_ids):
        start = rng.normal(0, noise, len(ids)).astype(np.float32)
        end = rng.normal(0, noise, len(ids)).astype(np.float32)
        start[windows.start_positions[n]] += bump
        end[windows.end_positions[n]] += bump
        starts.append(start)
        ends.append(end)
    return starts, ends
