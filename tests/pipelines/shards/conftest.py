"""Real text and the real vocabulary for the instance tests: the sample, the shared books, their
scalable plans and instances."""

from __future__ import annotations

import re

import numpy as np
import pytest

from common.tokenization import load_tokenizer, read_vocab
from pipelines.corpus.sentences import split_passages
from pipelines.shards.instances import (
    Vocab,
    finalize_instances,
    read_reference_text,
)
from tests.pipelines.shards.instance_checks import (
    books_cfg,
    scalable_plans,
)

BOOKS = ("austen-persuasion.txt", "chesterton-brown.txt")


PARAGRAPHS_PER_DOCUMENT = 8


# ---------------------------------------------------------------------------------------------
# fixtures: real text, real vocabulary
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="package")
def vocab_tokens(minilm_dir) -> list[str]:
    return read_vocab(str(minilm_dir / "vocab.txt"))


@pytest.fixture(scope="package")
def vocab(vocab_tokens) -> Vocab:
    return Vocab.from_tokens(vocab_tokens)


@pytest.fixture(scope="package")
def tokenizer(minilm_dir):
    return load_tokenizer(str(minilm_dir / "vocab.txt"))


@pytest.fixture(scope="package")
def sample_docs(shared_data, tokenizer) -> list[list[np.ndarray]]:
    with open(shared_data / "reference" / "sample_text.txt", encoding="utf-8", newline="\n") as f:
        return read_reference_text(f, tokenizer)


@pytest.fixture(scope="package")
def book_docs(shared_data, tokenizer) -> list[list[np.ndarray]]:
    """Two books as documents of 8 paragraphs each, split into sentences (pipelines.corpus.sentences)."""
    docs = []
    for name in BOOKS:
        text = (shared_data / "books" / name).read_text(encoding="utf-8").replace("\r\n", "\n")
        paragraphs = [p for p in re.split(r"\n\s*\n", text) if p.strip()]
        for k in range(0, len(paragraphs), PARAGRAPHS_PER_DOCUMENT):
            sentences = split_passages(paragraphs[k:k + PARAGRAPHS_PER_DOCUMENT])
            encodings = tokenizer.encode_batch(sentences, add_special_tokens=False)
            doc = [np.asarray(e.ids, dtype=np.int32) for e in encodings if e.ids]
            if doc:
                docs.append(doc)
    return docs


@pytest.fixture(scope="package")
def book_plans(book_docs):
    return scalable_plans(book_docs, books_cfg())


@pytest.fixture(scope="package")
def book_instances(book_plans, vocab):
    return finalize_instances(book_plans, vocab, books_cfg())
