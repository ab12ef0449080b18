"""Our own checks' errors at the commands' entry points are one line on stderr and exit 2, with
no usage block above them: the line names the setting, and argparse's usage (20 lines of flags
for bert-finetune) would push it out of sight."""
from __future__ import annotations

import pytest

from finetune import cli as finetune_cli
from finetune.glue import cli as glue_cli
from flows import cli as flow_cli
from training import pretrain


@pytest.mark.parametrize("main, argv, message", [
    (pretrain.main, ["--set", "engine.zero_stage=7"],
     "bert-pretrain: error: --set engine.zero_stage='7': must be one of 0, 1, 2 or 3"),
    (finetune_cli.main, ["--model", "m", "--data", "d", "--output", "o", "--tasks", "nope"],
     "bert-finetune: error: --tasks: unknown task 'nope'; known: "),
    (glue_cli.main, ["--model", "m", "--data", "d", "--output", "o", "--tasks", "rte",
                     "--set", "epochs=0"],
     "bert-glue: error: --set epochs: must be > 0, got 0.0"),
    (flow_cli.main, ["--preset", "tiny", "--set", "pretrain.phase1.steps=0"],
     "bert-dag: error: setting pretrain.phase1.steps: must be positive"),
])
def test_a_bad_setting_is_one_line_without_the_usage(main, argv, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(message), err
    assert len(err.splitlines()) == 1 and "usage:" not in err, err
