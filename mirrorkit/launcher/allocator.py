"""Memory allocator settings for local workers: keep freed memory for the next step.

Every all-reduce on CPU serialises each gradient bucket into new protobuf
buffers of megabytes (TensorFlow's gRPC collective transport). glibc's
malloc hands buffers that large out with ``mmap`` or trims them back to the
system when they are freed, so the next step maps them again and faults in
every page: about 2,000 page faults per step of the benchmark CNN on 2
workers. These settings keep freed memory in the process for reuse: blocks up
to 32 MB come from the heap, and up to 1 GB of free heap top (plus 64 MB of
padding) stays mapped. Measured here, a 2-worker CNN step (benchmark CNN, one
core each) went from 105 to 99 ms and from 99 to 95 ms in two A/B rounds,
faults per step from about 2,000 to under 60; one worker alone did not change.

The cost is memory: a worker's resident size stays near its peak instead of
shrinking after it. Set any of these variables (or ``GLIBC_TUNABLES`` with a
``glibc.malloc`` tunable) yourself and mirrorkit sets none of them.
"""

from __future__ import annotations

import os
import platform

from mirrorkit.environment_variables import (
    GLIBC_TUNABLES,
    MALLOC_MMAP_THRESHOLD_,
    MALLOC_TOP_PAD_,
    MALLOC_TRIM_THRESHOLD_,
)

#: glibc malloc settings given to every local worker (bytes).
MALLOC_ENV = {
    MALLOC_MMAP_THRESHOLD_: str(32 * 2**20),
    MALLOC_TRIM_THRESHOLD_: str(2**30),
    MALLOC_TOP_PAD_: str(64 * 2**20),
}


def malloc_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The malloc settings for workers; none where the user chose their own, or libc is not glibc.

    Args:
        environ: the environment to check; this process's when None.

    Example:
    ```python
    from mirrorkit.launcher.allocator import malloc_env

    assert malloc_env({"MALLOC_TOP_PAD_": "0"}) == {}  # the user chose one
    ```
    """
    environ = os.environ if environ is None else environ
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return {}
    if any(name in environ for name in MALLOC_ENV) or "glibc.malloc" in environ.get(
        GLIBC_TUNABLES, ""
    ):
        return {}
    return dict(MALLOC_ENV)


def describe() -> str:
    """One line saying what the workers' allocator keeps, for the launcher to say once."""
    return (
        "workers keep freed memory for reuse (glibc MALLOC_MMAP_THRESHOLD_=32 MiB, "
        "MALLOC_TRIM_THRESHOLD_=1 GiB, MALLOC_TOP_PAD_=64 MiB): fewer page faults per "
        "all-reduce, resident memory stays near its peak; set any MALLOC_* variable to choose"
    )
