"""`model.hf.read_hf_config`: the one check of a `transformers` config.json that both
loading paths (`load_hf_checkpoint`, a fine-tuning starting point) make; its `model_type` picks
the encoder's adapter (model/encoders.py)."""
from __future__ import annotations

import json

import pytest

from model import bert_hf, hf
from model.bert import BertConfig


def _config(tmp_path, **values) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return str(path)


def test_a_bert_config_is_read_as_written(tmp_path):
    values = {"model_type": "bert", "hidden_size": 128, "num_attention_heads": 2,
              "position_embedding_type": "absolute"}
    config, adapter = hf.read_hf_config(_config(tmp_path, **values))
    assert adapter is bert_hf
    assert config == BertConfig(hidden_size=128, num_attention_heads=2)
    config, adapter = hf.read_hf_config(_config(tmp_path, hidden_size=64, num_attention_heads=1))
    assert (adapter, config) == (bert_hf, BertConfig(hidden_size=64, num_attention_heads=1))


@pytest.mark.parametrize(("values", "message"), [
    ({"model_type": "roberta"}, "model_type 'roberta', not one of bert, modernbert"),
    ({"position_embedding_type": "relative_key"},
     "position_embedding_type 'relative_key'; this BERT has absolute positions"),
    ({"hidden_size": 100}, "hidden_size 100 is not a multiple of num_attention_heads 12"),
])
def test_other_models_are_refused_naming_the_file(tmp_path, values, message):
    path = _config(tmp_path, **values)
    with pytest.raises(ValueError) as e:
        hf.read_hf_config(path)
    assert str(e.value) == f"{path}: {message}"
    with pytest.raises(ValueError) as e:
        hf.load_hf_checkpoint(str(tmp_path))
    assert str(e.value) == f"{path}: {message}"
