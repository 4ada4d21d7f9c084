"""mirrorkit's notices: one `logging` channel, the ``"mirrorkit"`` logger.

What mirrorkit chose, repaired or dropped is said through `LOGGER`, on the
chief only (`mirrorkit.cluster.chief.say`), level INFO (a warning-like notice
WARNING). Unless you configure that logger, notices look as they always did:
``mirrorkit: <notice>`` on stderr, and on stdout in a notebook's kernel (so that
TensorFlow's own stderr lines do not split them). The standard calls change that:

- ``logging.getLogger("mirrorkit").setLevel(logging.WARNING)``: only warnings;
  ``logging.ERROR``: none. In a ``mirrorkit.flags`` script, absl's
  ``--verbosity`` sets it (``--verbosity=-1``: warnings only).
- A handler of your own on that logger (``addHandler``): the notices go there
  instead of the default output.
- ``logging.getLogger("mirrorkit").propagate = True``: to your root logger's
  handlers too (it does not propagate by default: an absl script's root handler
  would print every notice twice).

Python warnings (an untested Keras, a changed internal) stay warnings: the
``warnings`` module's filters silence them.

Importing this module (``import mirrorkit`` does) sets the logger up, once; a
level, handler or ``propagate`` you set afterwards is kept.

Example:
```python
import logging
import mirrorkit as mk

logging.getLogger("mirrorkit").setLevel(logging.WARNING)  # mirrorkit's INFO notices off
strategy = mk.strategy(cpu_replicas=2)  # says nothing now
logging.getLogger("mirrorkit").setLevel(logging.INFO)
```
"""

from __future__ import annotations

import logging
import sys

#: The logger every mirrorkit notice goes through.
LOGGER = logging.getLogger("mirrorkit")


class _DefaultOutput(logging.Handler):
    """``mirrorkit: <notice>`` on stderr (stdout in a notebook's kernel).

    Quiet while the logger has a handler of the user's: the notices go there
    instead. The stream is looked up at each notice, so a redirected
    ``sys.stderr`` (pytest's capture, ``contextlib.redirect_stderr``) gets it.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if any(_users(handler) for handler in LOGGER.handlers):
            return
        stream = sys.stderr
        if type(stream).__module__.startswith("ipykernel"):  # a notebook: ordinary output
            stream = sys.stdout
        try:
            stream.write(f"mirrorkit: {record.getMessage()}\n")
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own rule: a notice never stops the program
            self.handleError(record)


def _users(handler: logging.Handler) -> bool:
    """Whether `handler` is one the user added (pytest adds capture handlers of its own)."""
    return handler is not DEFAULT_OUTPUT and not type(handler).__module__.startswith("_pytest")


DEFAULT_OUTPUT = _DefaultOutput()

#: The level mirrorkit gave the logger (None: the user had set one).
_default_level: int | None = None

#: The keys of the notices said once in this process.
_said: set[str] = set()


def first_time(key: str) -> bool:
    """True the first time `key` is asked about in this process (the one say-once).

    Args:
        key: what makes two notices the same notice.
    """
    if key in _said:
        return False
    _said.add(key)
    return True


def say(message: str, level: int = logging.INFO) -> None:
    """Gives a notice through `LOGGER`, in this process whatever its role.

    Most notices are the chief's (`mirrorkit.cluster.chief.say`); a launcher
    reports its own workers.

    Args:
        message: the notice, without the ``mirrorkit:`` prefix.
        level: its logging level.
    """
    LOGGER.log(level, message)


def follow_verbosity(level: int) -> None:
    """Sets the notices' level from a script's own verbosity, unless the user set one.

    Args:
        level: a `logging` level (absl's ``--verbosity``, converted by `mirrorkit.flags`).
    """
    global _default_level
    if _default_level is not None and LOGGER.level == _default_level:
        LOGGER.setLevel(level)
        _default_level = level


def _set_up() -> None:
    global _default_level
    if DEFAULT_OUTPUT in LOGGER.handlers:
        return
    if LOGGER.level == logging.NOTSET:
        LOGGER.setLevel(logging.INFO)
        _default_level = logging.INFO
    LOGGER.addHandler(DEFAULT_OUTPUT)
    LOGGER.propagate = False


_set_up()
