"""A toy task family for the loop's and the flow's tests: the `finetune.family.Family` contract
alone, on a tiny encoder. The registry imports it as a family package: FAMILY and TASKS."""
from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor, nn

from finetune.family import Prepared, Recipe, Scored
from model.bert import BertModel, bert_tiny


@dataclass(frozen=True)
class ToyUnits:
    """Token sequences of different lengths; the target is the sequence's first token id."""

    input_ids: list[np.ndarray]

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(x) for x in self.input_ids])


@dataclass(frozen=True)
class ToyBatch:
    input_ids: Tensor
    """(B, T) padded with 0."""
    units: Tensor
    """(B,) the units' indices: the outputs carry them, to check the order comes back."""


class ToyHead(nn.Module):
    def __init__(self, encoder: BertModel):
        super().__init__()
        self.bert = copy.deepcopy(encoder)
        self.out = nn.Linear(encoder.config.hidden_size, 1)

    def forward(self, batch: ToyBatch) -> Tensor:
        mask = (batch.input_ids > 0).long()
        return self.out(self.bert.pool(self.bert(batch.input_ids, attention_mask=mask)))[:, 0]


@dataclass(frozen=True)
class ToyFamily:
    name: ClassVar[str] = "toy"
    small: tuple[str, ...] = ("small",)

    def recipe(self, task: str) -> Recipe:
        return Recipe(max_seq_length=16, batch_size=4, epochs=1.0, learning_rates=(1e-3,))

    def is_small(self, task: str) -> bool:
        return task in self.small

    def check_files(self, task: str, data_dir: str) -> None:
        pass

    def prepare(self, task, data_dir, tokenizer, max_seq_length, max_train_examples,
                max_eval_examples, skip_bad_records) -> Prepared:
        rng = np.random.default_rng(0)
        units = ToyUnits([rng.integers(1, 50, size=n) for n in rng.integers(2, 16, size=10)])
        return Prepared(task, units, {"dev": units}, 10, {"dev": 10})

    def build_head(self, encoder: BertModel, task: str) -> nn.Module:
        return ToyHead(encoder)

    def make_batch(self, encoded: ToyUnits, indices: Sequence[int], max_seq_length: int,
                   train: bool, row_length: int | None = None) -> ToyBatch:
        width = max(len(encoded.input_ids[i]) for i in indices)
        ids = np.zeros((len(indices), width), np.int64)  # (B, T)
        for row, i in enumerate(indices):
            ids[row, :len(encoded.input_ids[i])] = encoded.input_ids[i]
        return ToyBatch(torch.from_numpy(ids), torch.tensor(list(indices)))

    def loss(self, model: nn.Module, batch: ToyBatch) -> Tensor:
        return ((model(batch).float() - batch.input_ids[:, 0].float() / 50) ** 2).mean()

    def outputs(self, model: nn.Module, batch: ToyBatch) -> dict[str, Tensor]:
        return {"value": model(batch), "unit": batch.units,
                "first_token": batch.input_ids[:, 0]}

    def score(self, prepared: Prepared, split: str, outputs: dict[str, np.ndarray]) -> Scored:
        error = float(np.abs(outputs["value"] - outputs["first_token"] / 50).mean())
        files = {"predictions.json": json.dumps(outputs["unit"].tolist())}
        return Scored({"accuracy": 1 - error}, 1 - error, files)


FAMILY = ToyFamily()
TASKS = ("small", "large")
"""A task that runs every seed and one that runs the first."""


def toy_encoder() -> BertModel:
    torch.manual_seed(0)
    return BertModel(bert_tiny(vocab_size=64, max_position_embeddings=32))


def save_toy_checkpoint(folder: Path) -> Path:
    """A checkpoint folder the loop loads: the toy encoder and a 64-token vocabulary."""
    from model.hf import save_checkpoint

    save_checkpoint(toy_encoder(), str(folder))
    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"t{i}" for i in range(59)]
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return folder
