"""The repairs only a multi-worker strategy needs: chief-only files, agreed decisions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mirrorkit.cluster import workers
from mirrorkit.patching.repair import Repair

#: The canary that takes each multi-worker callback or saving repair off alone, on 2 workers.
OWN_CANARY = (
    "tests/test_multi_worker_canaries.py::"
    "test_a_callback_repair_taken_off_alone_fails_as_keras_does_upstream"
)


def multi_worker_repair(
    name: str,
    upstream: str,
    target: str,
    replacement: Callable[[Any], Any],
    module: str = "keras.callbacks",
    account: str = "",
    tests: tuple[str, ...] = (),
    place: int = 0,
    own_canary: bool = False,
    fixed_in: str = "",
) -> Repair:
    """A `Repair` that only a multi-worker strategy needs (chief-only files, agreed decisions).

    `account` and `tests` are the repair's (`Repair`): its section on the Keras repairs page,
    and the tests that reproduce the failure and check the repair; `place`, its place among
    the repairs of the same internal; `own_canary`, whether the 2-worker canary that takes
    each such repair off alone (`OWN_CANARY`) has a case for it; `fixed_in`, the Keras release
    that fixed the bug (`Repair.fixed_in`).
    """
    return Repair(
        name=name,
        upstream=upstream,
        module=module,
        target=target,
        replacement=replacement,
        applies_to=workers.is_multi_worker,
        account=account,
        tests=(f"{OWN_CANARY}[{name}]", *tests) if own_canary else tests,
        place=place,
        fixed_in=fixed_in,
    )
