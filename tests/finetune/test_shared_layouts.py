"""What the fine-tuning families share: `packing.pad` (the unpacked layout), `SlotBatch.of`
(a packed layout as tensors for GLUE's and multiple choice's batches), `ExampleSplit` (a
family's split of examples and set-aside records), `squad.features.require_positive`, and the
classifier heads' `LabelClassifier`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch

from common.errors import BadRecord
from finetune.family import ExampleSplit
from finetune.glue.data import GlueSplit
from finetune.glue.family import PackedBatch
from finetune.multiple_choice.data import ChoiceSplit
from finetune.multiple_choice.family import ChoiceBatch
from finetune.packing import SlotBatch, lay_out, pack_rows, pad
from finetune.squad.data import SquadSplit, split_by_article
from finetune.squad.features import require_positive
from model.bert import bert_tiny
from model.heads import BertForSequenceClassification, BertForTokenClassification, LabelClassifier

IDS = [np.array([101, 7, 102]), np.array([101, 102]), np.array([101, 8, 9, 102])]


def test_pad_writes_each_sequence_at_the_start_of_its_row():
    assert pad(IDS, fill=-1).tolist() == [[101, 7, 102, -1], [101, 102, -1, -1],
                                          [101, 8, 9, 102]]
    marks = pad([np.array([False, True]), np.array([True])])
    assert (marks.dtype, marks.tolist()) == (np.int64, [[0, 1], [1, 0]])


def test_slot_batch_holds_the_layout_as_tensors_with_its_labels():
    layout = lay_out(IDS, None, pack_rows([3, 2, 4], 5))
    batch = PackedBatch.of(layout, np.array([1, 0, 1]))
    assert isinstance(batch, SlotBatch)
    assert batch.input_ids.tolist() == [[101, 8, 9, 102, 0], [101, 7, 102, 101, 102]]
    assert batch.sequence_ids.tolist() == [[0, 0, 0, 0, -1], [0, 0, 0, 1, 1]]
    assert batch.cls_positions.tolist() == [[0, 0], [0, 3]]
    assert (batch.rows.tolist(), batch.slots.tolist()) == ([1, 1, 0], [0, 1, 0])
    assert batch.labels.tolist() == [1, 0, 1]
    assert layout.first_token().tolist() == [5, 8, 0]
    choices = ChoiceBatch.of(lay_out(IDS + IDS[:1], None, pack_rows([3, 2, 4, 3], 6)),
                             np.array([1, 0]), (2, 2))
    assert (choices.rows.shape, choices.slots.shape) == (torch.Size([2, 2]), torch.Size([2, 2]))
    assert choices.rows.dtype == torch.int64


def test_example_split_subset_keeps_the_split_and_its_set_aside_records():
    bad = [BadRecord("f", "line 3", "no label")]
    split = GlueSplit("rte", "train", "f", examples=list("abcde"), bad_records=bad)
    assert (len(split), split.bad_rows) == (5, bad)
    assert split.subset(None) is split and split.subset(5) is split
    assert split.subset(2, seed=0) == GlueSplit("rte", "train", "f", examples=["d", "e"],
                                                bad_records=bad)
    choices = ChoiceSplit("swag", "f", examples=list("abcde"))
    assert choices.subset(3, seed=1) == ChoiceSplit("swag", "f", examples=["b", "c", "d"])
    assert isinstance(choices, ExampleSplit)


@dataclass(frozen=True)
class Q:
    article: int


def test_split_by_article_keeps_the_file_and_version():
    split = SquadSplit("f.json", "v2.0", examples=[Q(0), Q(1), Q(0)],
                       bad_records=[BadRecord("f.json", "q9", "bad")])
    first, rest = split_by_article(split, 1)
    assert first == SquadSplit("f.json", "v2.0", examples=[Q(0), Q(0)],
                               bad_records=split.bad_records)
    assert rest == SquadSplit("f.json", "v2.0", examples=[Q(1)], bad_records=[])


def test_require_positive_names_the_first_field_below_one():
    class Config:
        a, b, c = 1, 0, -1

    require_positive(Config(), "a")
    with pytest.raises(ValueError) as e:
        require_positive(Config(), "a", "b", "c")
    assert str(e.value) == "b must be >= 1, got 0"


@pytest.mark.parametrize(("head", "labels", "message"), [
    (BertForSequenceClassification, 0, "num_labels must be >= 1, got 0"),
    (BertForTokenClassification, 1, "num_labels must be >= 2, got 1"),
])
def test_label_classifiers_refuse_too_few_labels(head, labels, message):
    with pytest.raises(ValueError) as e:
        head(bert_tiny(vocab_size=64), labels)
    assert str(e.value) == message


def test_label_classifier_head_is_dropout_and_one_linear_layer():
    torch.manual_seed(0)
    model = BertForTokenClassification(bert_tiny(vocab_size=64, hidden_dropout_prob=0.25), 5)
    assert isinstance(model, LabelClassifier) and model.num_labels == 5
    assert (model.dropout.p, tuple(model.classifier.weight.shape)) == (0.25, (5, 128))
    assert model.classifier.bias.abs().sum().item() == 0.0
    assert sorted(k for k in model.state_dict() if not k.startswith("bert.")) == [
        "classifier.bias", "classifier.weight"]
