"""`bert-dag` starts with the Prefect settings `make demo` has always had: no telemetry, and two
minutes for the temporary server (Prefect's 20 s fail on a loaded machine); a value the
environment sets wins."""
from __future__ import annotations

import os

from flows import cli


def test_bert_dag_sets_prefects_defaults_unless_the_environment_does(monkeypatch, tmp_path,
                                                                     capsys):
    monkeypatch.delenv("PREFECT_SERVER_ANALYTICS_ENABLED", raising=False)
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")
    assert cli.main(["--plan", "--output", str(tmp_path / "run")]) == 0  # no flow, no server
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "300"
    assert "Forecast:" in capsys.readouterr().out
