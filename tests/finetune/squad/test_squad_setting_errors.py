"""The SQuAD family's window and answer settings are no command's flags: their errors name
them as settings, and the one flag among them (`--max_seq_length`) as a flag."""
from __future__ import annotations

import pytest

from finetune.squad.features import WindowConfig
from finetune.squad.postprocess import PostprocessConfig


@pytest.mark.parametrize("build, message", [
    (lambda: WindowConfig(max_seq_length=60), ("--max_seq_length 60 leaves no passage token "
     "after a question of up to 64 tokens (the SQuAD family's max_query_length) and 3 special "
     "tokens")),
    (lambda: WindowConfig(doc_stride=0), "doc_stride must be >= 1, got 0"),
    (lambda: WindowConfig(max_query_length=0), "max_query_length must be >= 1, got 0"),
    (lambda: PostprocessConfig(n_best_size=0), "n_best_size must be >= 1, got 0"),
    (lambda: PostprocessConfig(max_answer_length=0), "max_answer_length must be >= 1, got 0"),
])
def test_errors_name_settings_not_missing_flags(build, message):
    with pytest.raises(ValueError) as error:
        build()
    assert str(error.value) == message
    assert WindowConfig(max_seq_length=68).max_query_length == 64  # 64 + 3 + 1 passage token
