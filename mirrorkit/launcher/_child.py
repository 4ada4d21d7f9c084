"""Entry point of a worker process started by `mirrorkit.launcher.processes`.

Usage: ``python -m mirrorkit.launcher._child PAYLOAD RESULT``. Loads
``(fn, args)`` from PAYLOAD, calls it, and writes ``("ok", value)`` or
``("error", traceback)`` to RESULT; exits 1 when the function raised.
"""

from __future__ import annotations

import sys
import traceback

import cloudpickle

from mirrorkit.exit_statuses import FAILED, OK


def main(payload: str, result: str) -> int:
    """Runs the pickled call; returns the process exit code."""
    try:
        with open(payload, "rb") as f:
            fn, args = cloudpickle.load(f)
        outcome = ("ok", fn(*args))
        code = OK
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent
        text = traceback.format_exc()
        sys.stderr.write(text)
        outcome, code = ("error", text), FAILED
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        with open(result, "wb") as f:
            cloudpickle.dump(outcome, f)
    except Exception as err:  # noqa: BLE001 - an unpicklable return value is a failure too
        kind = type(outcome[1]).__name__
        text = (
            f"The function ran, but its return value (a {kind}) could not be sent back to the "
            f"launcher: cloudpickle cannot pickle it ({type(err).__name__}: {err}). Return plain "
            "values instead: numbers, strings, NumPy arrays, lists or dicts of them (e.g. "
            "model.get_weights() or history.history, not the model, a dataset or a tensor "
            "holding a device), or save the object to a file and return its path."
        )
        if outcome[0] == "error":
            text = f"{outcome[1]}\n(and the error could not be sent back: {err})"
        sys.stderr.write(text + "\n")
        with open(result, "wb") as f:
            cloudpickle.dump(("error", text), f)
        code = FAILED
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
