"""`model.hf.read_bert_config`: the one check of a `transformers` config.json that both
loading paths (`load_hf_checkpoint`, a fine-tuning starting point) make."""
from __future__ import annotations

import json

import pytest

from model import hf


def _config(tmp_path, **values) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(values))
    return str(path)


def test_a_bert_config_is_read_as_written(tmp_path):
    values = {"model_type": "bert", "hidden_size": 128, "position_embedding_type": "absolute"}
    assert hf.read_bert_config(_config(tmp_path, **values)) == values
    assert hf.read_bert_config(_config(tmp_path, hidden_size=64)) == {"hidden_size": 64}


@pytest.mark.parametrize(("values", "message"), [
    ({"model_type": "roberta"}, "model_type 'roberta', not a BERT checkpoint"),
    ({"position_embedding_type": "relative_key"},
     "position_embedding_type 'relative_key'; this BERT has absolute positions"),
])
def test_other_models_are_refused_naming_the_file(tmp_path, values, message):
    path = _config(tmp_path, **values)
    with pytest.raises(ValueError) as e:
        hf.read_bert_config(path)
    assert str(e.value) == f"{path}: {message}"
    with pytest.raises(ValueError) as e:
        hf.load_hf_checkpoint(str(tmp_path))
    assert str(e.value) == f"{path}: {message}"
