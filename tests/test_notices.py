"""mirrorkit's notices go through the "mirrorkit" logger: shown, silenced, redirected, once."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest

from mirrorkit import notices
from mirrorkit.cluster import chief


@pytest.fixture
def logger():
    """The "mirrorkit" logger, put back as it was after the test."""
    saved = (notices.LOGGER.level, list(notices.LOGGER.handlers), notices.LOGGER.propagate)
    yield notices.LOGGER
    level, handlers, propagate = saved
    notices.LOGGER.setLevel(level)
    notices.LOGGER.handlers[:] = handlers
    notices.LOGGER.propagate = propagate


def test_a_notice_reads_as_before_on_stderr(logger, capsys):
    chief.say("two replicas")
    captured = capsys.readouterr()
    assert captured.err == "mirrorkit: two replicas\n" and captured.out == ""


def test_the_standard_level_call_silences_notices_and_keeps_warnings(logger, capsys):
    logger.setLevel(logging.WARNING)
    chief.say("an info notice")
    chief.say("a warning notice", logging.WARNING)
    assert capsys.readouterr().err == "mirrorkit: a warning notice\n"
    logger.setLevel(logging.ERROR)
    chief.say("a warning notice", logging.WARNING)
    assert capsys.readouterr().err == ""


def test_a_handler_of_your_own_takes_the_notices_instead(logger, capsys):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger.addHandler(handler)
    chief.say("redirected")
    assert [r.getMessage() for r in records] == ["redirected"]
    assert records[0].name == "mirrorkit" and records[0].levelno == logging.INFO
    assert capsys.readouterr().err == ""


def test_say_once_says_once_and_only_on_the_chief(logger, capsys, monkeypatch):
    monkeypatch.setattr(notices, "_said", set())
    chief.say_once("key", "first")
    chief.say_once("key", "second")
    assert capsys.readouterr().err == "mirrorkit: first\n"
    assert not notices.first_time("key")  # one say-once: the chief's and the launcher's
    notices._said.discard("key")
    chief.say_once("key", "again")  # the key forgotten (as tests do): said again
    assert capsys.readouterr().err == "mirrorkit: again\n"
    monkeypatch.setenv(
        "TF_CONFIG",
        '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, '
        '"task": {"type": "worker", "index": 1}}',
    )
    chief.say("not the chief")
    assert capsys.readouterr().err == ""


def test_a_notebook_kernel_shows_notices_as_ordinary_output(logger, capsys, monkeypatch):
    class OutStream:  # the class of ipykernel's sys.stderr, as its module names it
        __module__ = "ipykernel.iostream"

        def write(self, text):
            raise AssertionError(f"a notice went to the kernel's stderr: {text!r}")

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", OutStream())
    chief.say("in a notebook")
    assert capsys.readouterr().out == "mirrorkit: in a notebook\n"


SCRIPT = textwrap.dedent(
    """
    from absl import app
    from mirrorkit import flags as mk_flags

    mk_flags.define_flags()

    def main(argv):
        mk_flags.strategy_from_flags(default_cpu_replicas=2)

    app.run(main)
    """
)


@pytest.mark.multiprocess
@pytest.mark.parametrize("verbosity, shown", [(None, True), ("-1", False)])
def test_an_absl_script_follows_its_verbosity(tmp_path, verbosity, shown):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    argv = [sys.executable, str(script)] + ([f"--verbosity={verbosity}"] if verbosity else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("mirrorkit: ")]
    assert bool(said) == shown, done.stderr[-3000:]
    assert any("MirroredStrategy, 2 replicas" in line for line in said) == shown
