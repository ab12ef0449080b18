"""The MiniLM encoder and tokenizer the GLUE fine-tuning tests start from."""

from __future__ import annotations

import pytest

from finetune import checkpoint
from finetune.glue import data as glue_data


@pytest.fixture(scope="package")
def encoder(minilm_dir):
    return checkpoint.load_encoder(str(minilm_dir))


@pytest.fixture(scope="package")
def tokenizer(minilm_dir):
    return glue_data.load_glue_tokenizer(str(minilm_dir))
