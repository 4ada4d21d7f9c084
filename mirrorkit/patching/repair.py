"""One repair of Keras: what it replaces and why (each one's account: docs: compat/).

Every patch mirrorkit makes to TensorFlow or Keras is a `Repair`: the process-wide
ones in `mirrorkit.compat.REPAIRS`, applied by ``compat.enable``; the ones a part
of mirrorkit needs for a while (``ThroughputCallback``'s input clock while it is
installed, the step compiler during a trace, a strategy's collective keys during
its construction) through `scoped` / `apply_scoped`, which keep them listed in
``compat.active()`` while they are in place.

Each attribute that process-wide repairs replace has one owner (`_Internal`): where two
repairs need the same Keras function, it composes their replacements by their declared
`Repair.place`, never in the order they happened to be applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from mirrorkit import internals


def _release(version: str) -> tuple[int, ...]:
    """``"3.16.0.dev2026"`` -> ``(3, 16, 0)``: the release numbers a version begins with."""
    numbers = []
    for part in version.replace("-", ".").split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit()) if part[:1].isdigit() else ""
        if not digits:
            break
        numbers.append(int(digits))
    return tuple(numbers)


def _always() -> bool:
    """The default canary: the bug is there in every Keras mirrorkit supports."""
    return True


@dataclasses.dataclass
class Repair:
    """Replaces one attribute of a Keras module or class, reversibly.

    Attributes:
        name: short name, e.g. ``symbolic_build``.
        upstream: the upstream issue it repairs (its account: docs: compat/).
        module: the dotted module holding the target.
        target: ``"Class.method"`` or ``"function"`` inside `module`.
        replacement: builds the replacement from the function it wraps (built again when
            another repair of the same internal comes or goes).
        applies_to: whether a given strategy needs it.
        needed: whether the installed Keras still has the bug (its canary, read
            from Keras's own code); when it returns False the repair steps
            aside, silently: the bug is fixed upstream.
        account: the anchor of the failure's account on the Keras repairs page (docs:
            compat/), e.g. ``first-batch-build``: the section that says what fails without
            the repair. The maintainers' table of repairs and their tests (docs:
            development/#repairs-and-tests) is generated from `account` and `tests`.
        tests: the pytest node ids that reproduce the failure without the repair and check
            the repair, e.g. ``tests/test_compat.py::test_steps_per_execution_fails_upstream``.
            A test marked ``upstream`` among them is the repair's canary: it turns the repair
            off and fails once Keras no longer has the bug (CI runs the canaries on every
            pair, the nightlies included), naming this repair.
        fixed_in: the first Keras release that fixed the bug (``"3.16.0"``); from it on the
            repair steps aside, as when `needed` returns False. Empty: not fixed yet.
        feature: for a patch that repairs no upstream bug, the part of mirrorkit that needs
            it (``"mk.distribute's one iterator per fit"``); such a patch needs no canary.
        place: where its replacement goes among the repairs of the same internal: the
            lowest wraps Keras's own function, the highest is what Keras calls. One
            `_Internal` owns each replaced attribute and composes its repairs by place,
            whatever order they are applied or removed in; two repairs of one internal
            must declare different places.
    """

    name: str
    upstream: str
    module: str
    target: str
    replacement: Callable[[Any], Any]
    applies_to: Callable[[Any], bool]
    needed: Callable[[], bool] = _always
    account: str = ""
    tests: tuple[str, ...] = ()
    fixed_in: str = ""
    feature: str = ""
    place: int = 0
    #: Keras's own function under it (None while the repair is not in place).
    original: Any = None
    #: Whether the owner held the target itself (not inherited from a base class).
    owned: bool = True
    #: This repair's replacement in its internal's composition (the attribute itself when it
    #: has the highest place); None while the repair is not in place.
    installed: Any = None
    #: The module or class `apply` replaced the attribute of: `remove` restores it there,
    #: even if the dotted path names another object by then (``tensorflow.nn`` is one module
    #: object or another, depending on how it was imported).
    owner: Any = None
    #: When it is put in place, where that is not `compat.enable` for a strategy it applies
    #: to (``"with the first step hook"``): what `compat.describe` says.
    applied_when: str = ""

    @property
    def checks_keras(self) -> bool:
        """Whether the repair reads Keras's code to tell if the bug is still there.

        A repair of another package (keras_hub, keras_tuner) whose `needed` only asks whether
        that package is imported reads no Keras code.
        """
        return self.needed is not _always and self.package == "keras"

    @property
    def package(self) -> str:
        """The top-level package the target belongs to: ``keras``, ``tensorflow``, ..."""
        return self.module.split(".")[0]

    @property
    def active(self) -> bool:
        """Whether the replacement is in place."""
        return self.original is not None

    def _owner_and_attr(self) -> tuple[Any, str]:
        """The class or module that holds the target, and the attribute's name.

        Raises:
            InternalChangedError: the module cannot be imported, or has no class on the path.
        """
        used_for = f"the '{self.name}' repair ({self.upstream})"
        owner = internals.load_module(self.module, used_for=used_for)
        *path, attr = self.target.split(".")
        for part in path:  # the class: the repairs' targets are listed in docs: compat/
            found = internals.renamed(owner, part)  # a class a later Keras renamed, too
            if found is None:
                raise internals.changed(f"{self.module}.{'.'.join(path)}", used_for)
            owner = getattr(owner, found)
        return owner, attr

    @property
    def fixed_upstream(self) -> bool:
        """Whether the installed Keras is `fixed_in` or later (the repair steps aside)."""
        if not self.fixed_in:
            return False
        import keras  # the installed release, read when asked (a test may pin another)

        return _release(keras.__version__) >= _release(self.fixed_in)

    def apply(self) -> bool:
        """Puts the replacement in place; returns False if it already was, or is not needed.

        Raises:
            RuntimeError: something that is not a repair replaced the internal since another
                repair of it was applied.
        """
        if self.active or self.fixed_upstream or not self.needed():
            return False
        try:
            owner, attr = self._owner_and_attr()
        except internals.InternalChangedError:
            owner, attr = None, ""
        if owner is None or not hasattr(owner, attr):
            internals.warn(
                f"{self.module}.{self.target}",
                f"the '{self.name}' repair ({self.upstream}), which is NOT applied; "
                "what it repairs fails as in plain Keras",
            )
            return False
        internal = _INTERNALS.get((id(owner), attr)) or _Internal(owner, attr)
        internal.compose([*internal.repairs, self], self)  # may raise InternalChangedError
        _INTERNALS[(id(owner), attr)] = internal
        self.original = internal.original
        self.owned = internal.owned
        self.owner = owner
        _APPLIED.append(self)
        return True

    def remove(self) -> None:
        """Takes the replacement away; Keras's original is back when it was the last one.

        The other repairs of the same internal stay, composed by place as before.

        Raises:
            RuntimeError: something that is not a repair replaced the internal since.
        """
        if not self.active:
            return
        key = (id(self.owner), self.target.split(".")[-1])
        internal = _INTERNALS[key]
        internal.compose([r for r in internal.repairs if r is not self], self)
        if not internal.repairs:
            del _INTERNALS[key]
        self.original = None
        self.installed = None
        self.owner = None
        _APPLIED.remove(self)


class _Internal:
    """One replaced attribute of Keras or TensorFlow, and the repairs composed over it.

    It is the attribute's one owner: it keeps Keras's original and puts in place the
    replacements of its repairs, each wrapping the one below it by `Repair.place`, so that
    what Keras calls does not depend on the order the repairs came in or went in.

    Args:
        owner: the module or class holding the attribute.
        attr: the attribute's name.
    """

    def __init__(self, owner: Any, attr: str):
        self.owner = owner
        self.attr = attr
        self.original = getattr(owner, attr)
        #: Whether the owner held the attribute itself (not inherited from a base class).
        self.owned = attr in vars(owner)
        self.repairs: list[Repair] = []
        self.installed: Any = None

    def compose(self, repairs: list[Repair], changing: Repair) -> None:
        """Puts `repairs` in place over the original, by place (Keras's own when none).

        Args:
            repairs: the repairs of this attribute from now on.
            changing: the repair being applied or removed, for the error.

        Raises:
            RuntimeError: the attribute is no longer what this owner put there.
            ValueError: two of `repairs` declare the same place.
        """
        if self.repairs and vars(self.owner).get(self.attr) is not self.installed:
            raise RuntimeError(
                f"the '{changing.name}' repair of {changing.module}.{changing.target} cannot "
                "change while a replacement that is not a repair wraps it: remove that first "
                "(mirrorkit.compat.disable() removes every repair)"
            )
        ordered = sorted(repairs, key=lambda repair: repair.place)
        places = [repair.place for repair in ordered]
        if len(set(places)) < len(places):
            raise ValueError(
                f"repairs {[r.name for r in ordered]} of {changing.module}.{changing.target} "
                f"declare places {places}: give each its own place (Repair.place) so that "
                "their order is declared"
            )
        function, layers = self.original, []
        for repair in ordered:  # each wraps the one below it; may raise InternalChangedError
            function = repair.replacement(function)
            layers.append(function)
        for repair, layer in zip(ordered, layers, strict=True):
            repair.installed = layer
        if ordered:
            setattr(self.owner, self.attr, function)
        elif self.owned:
            setattr(self.owner, self.attr, self.original)
        else:
            delattr(self.owner, self.attr)
        self.repairs, self.installed = ordered, function if ordered else None


#: The scoped repairs in place now, in the order they were applied.
SCOPED: list[Repair] = []

#: The repairs `Repair.apply` put in place, in the order it did (`applied`).
_APPLIED: list[Repair] = []
#: The owner of each replaced attribute, by (id of its module or class, attribute name).
_INTERNALS: dict[tuple[int, str], _Internal] = {}


def applied() -> list[Repair]:
    """The repairs in place (not the scoped ones), in the order they were applied."""
    return list(_APPLIED)


#: Repairs a part of mirrorkit declares for the strategies `compat.enable` is called for,
#: besides compat's own (`declare`), in the order declared.
_DECLARED: list[Repair] = []
#: Whether `compat.enable` was called for every strategy (None) since the last `disable`.
_ENABLED_FOR_ALL = [False]
#: The strategies `compat.enable` was called for since then, held weakly: a strategy the
#: user dropped is not kept alive for a repair declared later.
_ENABLED: weakref.WeakSet = weakref.WeakSet()


#: Every repair a module of mirrorkit defines (compat's, the declared ones, those a part of
#: mirrorkit applies on first use), in the order their modules registered them; not the
#: scoped ones, made per call.
_KNOWN: list[Repair] = []


def register(repair: Repair) -> Repair:
    """Lists `repair` among mirrorkit's repairs (`known`), where it is defined.

    For a repair that a part of mirrorkit applies itself on first use (`declare` registers
    the ones `compat.enable` applies; ``compat`` registers its own).

    Args:
        repair: the repair.

    Returns:
        `repair`, for ``REPAIR = register(Repair(...))``.

    Example:
    ```python
    from mirrorkit.patching.repair import known

    print([repair.name for repair in known()][:3])
    ```
    """
    if not any(repair is seen for seen in _KNOWN):
        _KNOWN.append(repair)
    return repair


def known() -> list[Repair]:
    """Every repair the imported modules of mirrorkit define, in the order registered.

    ``import mirrorkit.strategies`` and ``mirrorkit.training.step_chain`` import every module
    that defines one.
    """
    return list(_KNOWN)


def declare(repair: Repair) -> Repair:
    """Declares a repair that `compat.enable` applies with its own, where it is defined.

    A part of mirrorkit that changes Keras for every strategy spanning replicas (the notices
    at ``fit``) declares its repair when it is imported; it is applied at once if
    `compat.enable` was already called for a strategy it applies to.

    Args:
        repair: the repair, with `Repair.applies_to` saying which strategies need it.

    Returns:
        `repair`, for ``REPAIR = declare(Repair(...))``.
    """
    register(repair)
    if not any(repair is seen for seen in _DECLARED):
        _DECLARED.append(repair)
        if _ENABLED_FOR_ALL[0] or any(repair.applies_to(strategy) for strategy in list(_ENABLED)):
            repair.apply()
    return repair


def declared() -> list[Repair]:
    """The repairs parts of mirrorkit declared for `compat.enable`, in the order declared."""
    return list(_DECLARED)


def enable_declared(strategy: Any) -> None:
    """Applies the declared repairs `strategy` needs (None: all), now and when declared later."""
    if strategy is None:
        _ENABLED_FOR_ALL[0] = True
    else:
        _ENABLED.add(strategy)
    for repair in _DECLARED:
        if strategy is None or repair.applies_to(strategy):
            repair.apply()


def remove_all() -> None:
    """Removes every repair in place, in the reverse of the order they were applied."""
    for repair in reversed(list(_APPLIED)):
        repair.remove()
    _ENABLED.clear()
    _ENABLED_FOR_ALL[0] = False


def apply_scoped(repair: Repair) -> None:
    """Applies `repair` until `remove_scoped`; ``compat.active()`` lists it meanwhile.

    Raises:
        InternalChangedError: the target is missing (a scoped repair is needed, not optional).
    """
    owner, attr = repair._owner_and_attr()
    if not hasattr(owner, attr):
        raise internals.changed(f"{repair.module}.{repair.target}", repair.upstream)
    original = getattr(owner, attr)
    repair.owned = attr in vars(owner)
    repair.owner = owner
    setattr(owner, attr, repair.replacement(original))
    repair.original = original if original is not None else _NONE
    SCOPED.append(repair)


def remove_scoped(repair: Repair) -> None:
    """Puts back what `apply_scoped` replaced (nothing if it is not in place)."""
    if repair not in SCOPED:
        return
    SCOPED.remove(repair)
    original = None if repair.original is _NONE else repair.original
    owner, attr = repair.owner, repair.target.split(".")[-1]
    if repair.owned:
        setattr(owner, attr, original)
    else:
        delattr(owner, attr)
    repair.original = None
    repair.owner = None


@contextlib.contextmanager
def scoped(repair: Repair) -> Iterator[Repair]:
    """`repair` in place for the block (`apply_scoped`, then `remove_scoped`)."""
    apply_scoped(repair)
    try:
        yield repair
    finally:
        remove_scoped(repair)


#: Stands for an original value of None while a scoped repair is in place.
_NONE = object()
