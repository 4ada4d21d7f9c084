"""Where a hook sits in one of mirrorkit's chains: its stage and its order, checked.

`gradient_hooks` (around the gradient all-reduce) and `step_hooks` (around the
training step) place their hooks the same way: a hook names its stage and
order, or, when it is one of mirrorkit's own, takes them from the chain's
``PLACES``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar


def place(
    kind: str,
    name: Any,
    fn: Any,
    stage: str | None,
    places: Mapping[str, tuple[str, int]],
    stages: Sequence[str],
) -> tuple[str, int] | None:
    """Checks a hook; returns its (stage, order) from `places` when it gave no stage.

    Args:
        kind: how errors name the hook ("gradient hook", "step hook").
        name: the hook's name.
        fn: its function.
        stage: the stage it gave, or None for one of mirrorkit's own.
        places: mirrorkit's own hooks: name -> (stage, order).
        stages: the chain's stages.

    Returns:
        ``(stage, order)`` from `places`, or None when the hook gave its stage.

    Raises:
        ValueError: an empty name, an unknown stage, or a name not in `places` without one.
        TypeError: `fn` is not callable.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a {kind} needs a non-empty name; got {name!r}")
    if not callable(fn):
        raise TypeError(f"{kind} {name!r}: fn must be callable; got {fn!r}")
    if stage is None:
        if name not in places:
            raise ValueError(
                f"{kind} {name!r} needs stage= (one of {', '.join(stages)}); "
                f"only mirrorkit's own hooks ({', '.join(places)}) take theirs from PLACES"
            )
        return places[name]
    if stage not in stages:
        raise ValueError(
            f"{kind} {name!r}: stage must be one of {', '.join(stages)}; got {stage!r}"
        )
    return None


@dataclasses.dataclass(frozen=True)
class PlacedHook:
    """A hook of a chain: `GradientHook` and `StepHook` say which chain (KIND, PLACES, STAGES).

    Args:
        name: the hook's name on what it is registered on (one hook per name).
        fn: what it runs (each chain says how it is called).
        stage: its stage; None for mirrorkit's own hooks, which take theirs from PLACES.
        order: the place within the stage (lower first; ties by name).
    """

    KIND: ClassVar[str] = "hook"
    PLACES: ClassVar[Mapping[str, tuple[str, int]]] = {}
    STAGES: ClassVar[Sequence[str]] = ()

    name: str
    fn: Callable[..., Any]
    stage: str | None = None
    order: int = 0

    def __post_init__(self):
        placed = place(self.KIND, self.name, self.fn, self.stage, self.PLACES, self.STAGES)
        if placed is not None:
            object.__setattr__(self, "stage", placed[0])
            object.__setattr__(self, "order", placed[1])
