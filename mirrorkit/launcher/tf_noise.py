"""TensorFlow's known start-up lines, dropped from worker output unless asked for.

Every TensorFlow process writes a handful of C++ log lines while it loads,
before Python code can configure anything, and ``TF_CPP_MIN_LOG_LEVEL`` does
not silence all of them (TensorFlow 2.21 logs some through absl before
absl's logging is initialised, and ``failed call to cuInit`` is logged at
ERROR although it only means "no GPU here", tensorflow#59849). On a CPU
machine they look like failures and bury the first real output line:

```
WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
I0000 00:00:1796015185.799183 5311 cudart_stub.cc:31] Could not find cuda drivers on your ...
E0000 00:00:1796015190.667170 5311 cuda_platform.cc:52] failed call to cuInit: ... (303)
```

The launcher (`mirrorkit launch`, `mk.launch`, and every caller of
`mirrorkit.launcher.processes`) drops exactly these lines from what it
streams: each pattern below matches one known message in full, so any other
line, every traceback and every real error still comes through. A worker's
``--log-dir`` file keeps everything. ``mirrorkit launch --tf-startup-logs``,
``mk.launch(..., tf_startup_logs=True)`` or ``MIRRORKIT_TF_STARTUP_LOGS=1``
keep them.

``failed call to cuInit`` is dropped only for the two codes that mean "no
GPU": 303 (no CUDA driver installed) and 100 (``CUDA_ERROR_NO_DEVICE``, e.g.
``CUDA_VISIBLE_DEVICES=""``). Any other code is a broken GPU set-up and stays.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from mirrorkit.environment_variables import MIRRORKIT_TF_STARTUP_LOGS

# absl's header ("I0000 00:00:1796015185.799183    5311 file.cc:31] ") and the
# older TensorFlow one ("2024-05-01 12:00:00.123456: I tensorflow/core/file.cc:31] ").
_HEADER = (
    r"(?:[IWEF]\d{4} \d{2}:\d{2}:\d+\.\d+\s+\d+ "
    r"|\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d+: [IWEF] )(?:\S+/)?"
)

#: (source file, message) of every known start-up line after the log header.
_LOGGED = (
    ("cudart_stub.cc", r"Could not find cuda drivers on your machine, GPU will not be used\."),
    ("cuda_platform.cc", r"failed call to cuInit: .*\((?:303|100)\)"),
    ("cuda_driver.cc", r"failed call to cuInit: .*\((?:303|100)\)"),
    (
        "cpu_feature_guard.cc",
        r"This TensorFlow binary is optimized to use available CPU instructions in "
        r"performance-critical operations\.",
    ),
    ("port.cc", r"oneDNN custom operations are on\. .*TF_ENABLE_ONEDNN_OPTS=0`?\."),
    *(
        (
            f"cuda_{name}.cc",
            rf"Unable to register {plugin} factory: Attempting to register factory for plugin "
            rf"{plugin} when one has already been registered",
        )
        for name, plugin in (("dnn", "cuDNN"), ("fft", "cuFFT"), ("blas", "cuBLAS"))
    ),
    (
        "computation_placer.cc",
        r"computation placer already registered\. Please check linkage and avoid linking the "
        r"same target more than once\.",
    ),
    ("py_utils.cc", r"TF-TRT Warning: Could not find TensorRT"),
)

#: Whole lines without a log header.
_PLAIN = (
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    # The second line of cpu_feature_guard.cc's message.
    r"To enable the following instructions: [A-Za-z0-9_ ,.]+, in other operations, rebuild "
    r"TensorFlow with the appropriate compiler flags\.",
)

_PATTERN = re.compile(
    "|".join(
        [rf"{_HEADER}{re.escape(source)}:\d+\] {message}" for source, message in _LOGGED]
        + list(_PLAIN)
    )
)


def is_startup_line(line: str) -> bool:
    """Whether `line` (without its newline) is one of TensorFlow's known start-up lines.

    Example:
    ```python
    from mirrorkit.launcher.tf_noise import is_startup_line

    assert is_startup_line(
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
    )
    assert not is_startup_line("Epoch 1/3")
    ```
    """
    return _PATTERN.fullmatch(line.rstrip("\r")) is not None


#: Where a start-up line may begin inside another line's text.
_STARTS = re.compile(rf"{_HEADER}|WARNING: All log messages before absl")


def without_startup_lines(text: str) -> str:
    r"""`text` without TensorFlow's known start-up lines.

    A start-up line written into the end of another line (two streams sharing one
    terminal, as a notebook kernel's stderr does) is cut off and the line's own
    text kept.

    Example:
    ```python
    from mirrorkit.launcher.tf_noise import without_startup_lines

    noise = "E0000 00:00:1.5   7 cuda_platform.cc:52] failed call to cuInit: UNKNOWN ERROR (303)"
    assert without_startup_lines(f"{noise}\nEpoch 1/3{noise}\n") == "Epoch 1/3\n"
    ```
    """
    kept = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\n")
        if is_startup_line(body):
            continue
        cut = next(
            (m.start() for m in _STARTS.finditer(body, 1) if is_startup_line(body[m.start() :])),
            None,
        )
        kept.append(line if cut is None else body[:cut] + "\n")
    return "".join(kept)


def keep_startup_lines() -> bool:
    """Whether this launch keeps the start-up lines (``MIRRORKIT_TF_STARTUP_LOGS=1``)."""
    value = os.environ.get(MIRRORKIT_TF_STARTUP_LOGS, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def keeping(keep: bool) -> Iterator[None]:
    """Within the block, launches keep the start-up lines when `keep` is true.

    The setting travels in the environment so that a launch supervised from
    inside a private network namespace (a separate process) sees it too. A
    ``MIRRORKIT_TF_STARTUP_LOGS`` the user set is left as it is when `keep`
    is false.
    """
    if not keep:
        yield
        return
    before = os.environ.get(MIRRORKIT_TF_STARTUP_LOGS)
    os.environ[MIRRORKIT_TF_STARTUP_LOGS] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MIRRORKIT_TF_STARTUP_LOGS, None)
        else:
            os.environ[MIRRORKIT_TF_STARTUP_LOGS] = before
