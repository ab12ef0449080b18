"""common/logs.py: the one logging set-up (levels by BERT_LOG_LEVEL / --verbose) and the
progress bar that draws rarely where it cannot redraw in place."""
from __future__ import annotations

import argparse
import io
import logging
import sys

import pytest

from common import logs

WATCHED = ("", "httpx", "apache_beam", "matplotlib", "DeepSpeed", "prefect.task_runs")


@pytest.fixture(autouse=True)
def restore_logging(monkeypatch):
    """Each test starts unset and leaves the process's loggers as it found them."""
    monkeypatch.delenv(logs.ENV, raising=False)
    root = logging.getLogger()
    handlers = root.handlers[:]
    levels = {name: logging.getLogger(name).level
              for name in (*logs.LIBRARY_LOGGERS, *logs.RUN_LOGGERS, "")}
    yield
    root.handlers[:] = handlers
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def effective_levels() -> dict[str, str]:
    return {name or "root": logging.getLevelName(logging.getLogger(name).getEffectiveLevel())
            for name in WATCHED}


def test_by_default_ours_speak_at_info_and_the_libraries_at_warning():
    assert logs.setup() == logging.INFO
    assert effective_levels() == {"root": "INFO", "httpx": "WARNING", "apache_beam": "WARNING",
                                  "matplotlib": "WARNING", "DeepSpeed": "WARNING",
                                  "prefect.task_runs": "INFO"}
    assert logs.os.environ[logs.ENV] == "INFO"  # what the stages' subprocesses inherit


def test_verbose_brings_the_libraries_info_lines_back_and_tells_subprocesses():
    assert logs.setup(verbose_flag=True) == logging.DEBUG
    assert effective_levels() == {"root": "DEBUG", "httpx": "INFO", "apache_beam": "INFO",
                                  "matplotlib": "INFO", "DeepSpeed": "INFO",
                                  "prefect.task_runs": "DEBUG"}
    assert logs.os.environ[logs.ENV] == "DEBUG"


def test_bert_log_level_warning_quiets_ours_too(monkeypatch):
    monkeypatch.setenv(logs.ENV, "warning")
    assert logs.setup() == logging.WARNING
    assert set(effective_levels().values()) == {"WARNING"}


def test_an_unknown_level_warns_in_one_line_and_logs_at_info(monkeypatch, caplog):
    monkeypatch.setenv(logs.ENV, "LOUD")
    with caplog.at_level(logging.WARNING, logger="common.logs"):
        assert logs.level() == logging.INFO
    assert [r.getMessage() for r in caplog.records] == [
        "BERT_LOG_LEVEL=LOUD: not a level (use DEBUG/INFO/WARNING/ERROR); logging at INFO"]


def test_the_verbose_flag_is_one_spelling():
    parser = argparse.ArgumentParser()
    logs.add_verbose_flag(parser)
    assert parser.parse_args(["--verbose"]).verbose is True
    assert parser.parse_args([]).verbose is False


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def draws(stream: io.StringIO) -> int:
    """How many times a bar drew itself (each draw starts with a carriage return)."""
    return sum(1 for part in stream.getvalue().split("\r") if part.strip())


def run_bar(stream: io.StringIO, steps: int = 50) -> None:
    bar = logs.progress(total=steps, desc="phase1", file=stream, mininterval=0)
    for step in range(steps):
        bar.update(1)
        bar.set_postfix(loss=f"{10 - step / 10:.3f}")
    bar.close()


def test_a_captured_bar_draws_its_first_and_last_line_only():
    captured = io.StringIO()
    run_bar(captured)
    # whole lines, no carriage return: a log line written between draws starts a line its own
    first, last = captured.getvalue().split("\n")[:-1]
    assert captured.getvalue().endswith("\n") and "\r" not in captured.getvalue()
    assert first.startswith("phase1:   0%|") and "0/50" in first
    assert last.startswith("phase1: 100%|") and "50/50" in last and "loss=5.100" in last
    # no monitor thread: its redraw of an idle bar makes the next update draw again at once
    bar = logs.progress(total=1, file=io.StringIO())
    assert (bar.mininterval, bar.monitor, type(bar).monitor_interval) == (60.0, None, 0)
    bar.close()


def test_a_bar_on_a_terminal_redraws_in_place_each_update():
    from tqdm import tqdm

    tqdm._instances.clear()  # bars other tests left open would stack this one below them
    terminal = Terminal()
    run_bar(terminal)
    # the first draw, each of the 50 updates and 50 postfixes, the last: each over the one before
    assert draws(terminal) == 102
    assert "\n" not in terminal.getvalue().rstrip("\n")


def test_a_root_handler_stays_unless_forced_and_prefects_stays_even_then():
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    mine = logging.StreamHandler(io.StringIO())
    root.handlers[:] = [mine]
    logs.setup()
    assert root.handlers == [mine]  # a command's own set-up (or pytest's) is left alone
    logs.setup(force=True)  # a Beam job: Python's bare handler, from Beam's import, goes
    assert len(root.handlers) == 1 and root.handlers[0] is not mine
    assert root.handlers[0].formatter._fmt == logs.FORMAT
    flows = PrefectConsoleHandler(stream=sys.stderr)  # a flow's console, as Prefect makes it
    root.handlers[:] = [flows]
    logs.setup(force=True)  # a job's run() inside a flow keeps the flow's format
    assert root.handlers == [flows]


def test_prefects_completed_lines_stay_off_the_console_unless_verbose():
    """A flow's console shows no "Finished in state Completed()" line (one per task and the
    flow); a failed state, the flow's own lines and our stages' still show. --verbose brings
    the completed ones back."""
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    console = io.StringIO()
    root.handlers[:] = [PrefectConsoleHandler(stream=console)]

    def lines() -> list[str]:
        console.seek(0)
        console.truncate()
        for name, level, message in (
                ("prefect.task_runs", logging.INFO, "Finished in state Completed()"),
                ("prefect.flow_runs", logging.INFO, "Finished in state Completed()"),
                ("prefect.task_runs", logging.ERROR, "Finished in state Failed('boom')"),
                ("prefect.flow_runs", logging.INFO, "run folder runs/tiny (preset tiny)"),
                ("flows", logging.INFO, "corpus: reused runs/tiny/corpus-1")):
            logging.getLogger(name).log(level, message)
        return [line.rsplit(" - ", 1)[-1] for line in console.getvalue().splitlines()]

    logs.setup()
    logs.setup()  # again: still one filter
    assert lines() == ["Finished in state Failed('boom')", "run folder runs/tiny (preset tiny)",
                       "corpus: reused runs/tiny/corpus-1"]
    logs.setup(verbose_flag=True)
    assert lines()[:2] == ["Finished in state Completed()"] * 2


def test_a_disabled_captured_bar_closes_quietly():
    captured = io.StringIO()
    bar = logs.progress(total=3, file=captured, disable=True)
    bar.update(3)
    bar.close()
    assert captured.getvalue() == ""


def test_a_captured_bar_not_left_writes_its_first_line_and_nothing_to_clear_it():
    captured = io.StringIO()
    bar = logs.progress(total=3, desc="rte", file=captured, leave=False)
    bar.update(3)
    bar.close()
    (line,) = captured.getvalue().split("\n")[:-1]
    assert line.startswith("rte:   0%|") and captured.getvalue().endswith("]\n")
