"""The repairs only a multi-worker strategy needs: chief-only files, agreed decisions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mirrorkit.cluster import workers
from mirrorkit.patching.repair import Repair


def multi_worker_repair(
    name: str,
    upstream: str,
    target: str,
    replacement: Callable[[Any], Any],
    module: str = "keras.callbacks",
    account: str = "",
    tests: tuple[str, ...] = (),
    place: int = 0,
) -> Repair:
    """A `Repair` that only a multi-worker strategy needs (chief-only files, agreed decisions).

    `account` and `tests` are the repair's (`Repair`): its section on the Keras repairs page,
    and the tests that reproduce the failure and check the repair; `place`, its place among
    the repairs of the same internal.
    """
    return Repair(
        name=name,
        upstream=upstream,
        module=module,
        target=target,
        replacement=replacement,
        applies_to=workers.is_multi_worker,
        account=account,
        tests=tests,
        place=place,
    )
