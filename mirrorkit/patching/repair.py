"""One repair of Keras: what it replaces and why (each one's account: docs: compat/).

Every patch mirrorkit makes to a TensorFlow or Keras module or class is a `Repair`, which
says when it goes in place (`Repair.when`): with ``compat.enable`` for the strategies it
applies to (`WITH_ENABLE`; a repair of another package waits for that package's import), on
the first use of the part of mirrorkit that needs it (`ON_FIRST_USE`), or while a part of
mirrorkit runs (`SCOPED`: ``ThroughputCallback``'s input clock while it is installed, the
step compiler during a trace, a strategy's collective keys during its construction, through
`scoped` / `apply_scoped`). The process-wide ones are defined at module level in the modules
`mirrorkit.patching.catalogue` names.

Each replaced attribute has one owner (`_Internal`), scoped repairs included: where two
repairs need the same Keras function, it composes their replacements by their declared
`Repair.place` (scoped ones above, innermost scope on top), never in the order they happened
to be applied.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
from collections.abc import Callable, Iterator
from typing import Any

from mirrorkit import internals

#: `Repair.when`: ``compat.enable`` puts it in place for a strategy it applies to
#: (``mk.strategy()`` calls it); a repair of another package than Keras and TensorFlow waits
#: for that package's import.
WITH_ENABLE = "with compat.enable"
#: `Repair.when`: the part of mirrorkit that needs it puts it in place on its first use
#: (`Repair.applied_when` says which), and it stays.
ON_FIRST_USE = "on first use"
#: `Repair.when`: in place only while a part of mirrorkit runs (`scoped`, `apply_scoped`).
SCOPED_WHILE = "while a part of mirrorkit runs"
WHEN = (WITH_ENABLE, ON_FIRST_USE, SCOPED_WHILE)


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
        fits_before: the first Keras release the replacement does not fit (``"3.16.0"``):
            from it on the repair stays off although the bug is still there, as its account
            says. Empty: it fits every Keras mirrorkit supports.
        feature: for a patch that repairs no upstream bug, the part of mirrorkit that needs
            it (``"mk.distribute's one iterator per fit"``); such a patch needs no canary.
        place: where its replacement goes among the repairs of the same internal: the
            lowest wraps Keras's own function, the highest is what Keras calls. One
            `_Internal` owns each replaced attribute and composes its repairs by place,
            whatever order they are applied or removed in; two repairs of one internal
            must declare different places. Scoped repairs go above the others, each new scope
            on top.
        when: when it goes in place: `WITH_ENABLE` (the default), `ON_FIRST_USE` or
            `SCOPED_WHILE`.
        applied_when: what ``compat.describe`` says of when it is put in place, where that
            is not ``compat.enable`` for a strategy it applies to (``"with the first step
            hook"``).
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
    fits_before: str = ""
    feature: str = ""
    place: int = 0
    when: str = WITH_ENABLE
    applied_when: str = ""
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
    #: The module of mirrorkit that defines it (set by `mirrorkit.patching.catalogue`).
    defined_in: str = ""
    #: For a scoped repair in place: its order among the scopes (the latest is on top).
    scope_order: int = 0

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
        """Whether mirrorkit put the replacement in place (and has not removed it)."""
        return self.owner is not None

    @property
    def in_place(self) -> bool:
        """Whether its module or class holds this repair's replacement now.

        Read from the attribute itself (under the other repairs of the same internal): what
        ``compat.describe`` lists.
        """
        if self.owner is None:
            return False
        internal = _INTERNALS.get((id(self.owner), self.target.split(".")[-1]))
        return internal is not None and internal.holds(self)

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

    @property
    def fits(self) -> bool:
        """Whether the replacement fits the installed Keras (before `fits_before`)."""
        if not self.fits_before:
            return True
        import keras  # the installed release, read when asked (a test may pin another)

        return _release(keras.__version__) < _release(self.fits_before)

    @property
    def wanted_here(self) -> bool:
        """Whether `apply` puts it in place on the installed Keras.

        It does when the bug is not fixed there (`fixed_in`), the replacement fits it
        (`fits_before`), and `needed` says so.
        """
        return not self.fixed_upstream and self.fits and self.needed()

    def apply(self) -> bool:
        """Puts the replacement in place; returns False if it already was, or is not needed.

        Raises:
            RuntimeError: something that is not a repair replaced the internal since another
                repair of it was applied.
        """
        if self.active or not self.wanted_here:
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
        self._compose_into(owner, attr)
        _APPLIED.append(self)
        return True

    def _compose_into(self, owner: Any, attr: str) -> None:
        """Adds this repair to the owner of ``owner.attr`` (made if it is the first)."""
        internal = _INTERNALS.get((id(owner), attr)) or _Internal(owner, attr)
        internal.compose([*internal.repairs, self], self)  # may raise InternalChangedError
        _INTERNALS[(id(owner), attr)] = internal
        self.original = internal.original
        self.owned = internal.owned
        self.owner = owner

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
        if self in _APPLIED:
            _APPLIED.remove(self)
        if self in SCOPED:
            SCOPED.remove(self)


class _Internal:
    """One replaced attribute of Keras or TensorFlow, and the repairs composed over it.

    It is the attribute's one owner: it keeps Keras's original and puts in place the
    replacements of its repairs, each wrapping the one below it by `Repair.place` (the
    scoped ones above the others, the latest scope on top), so that what Keras calls does
    not depend on the order the repairs came in or went in.

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

    def holds(self, repair: Repair) -> bool:
        """Whether the attribute now holds this owner's composition, `repair` in it."""
        return (
            any(r is repair for r in self.repairs)
            and vars(self.owner).get(self.attr, _ABSENT) is self.installed
        )

    def compose(self, repairs: list[Repair], changing: Repair) -> None:
        """Puts `repairs` in place over the original, by place (Keras's own when none).

        Args:
            repairs: the repairs of this attribute from now on.
            changing: the repair being applied or removed, for the error.

        Raises:
            RuntimeError: the attribute is no longer what this owner put there.
            ValueError: two of `repairs` that are not scoped declare the same place.
        """
        if self.repairs and vars(self.owner).get(self.attr, _ABSENT) is not self.installed:
            raise RuntimeError(
                f"the '{changing.name}' repair of {changing.module}.{changing.target} cannot "
                "change while a replacement that is not a repair wraps it: remove that first "
                "(mirrorkit.compat.disable() removes every repair)"
            )
        ordered = sorted(repairs, key=_layer)
        lasting = [repair for repair in ordered if repair.when != SCOPED_WHILE]
        places = [repair.place for repair in lasting]
        if len(set(places)) < len(places):
            raise ValueError(
                f"repairs {[r.name for r in lasting]} of {changing.module}.{changing.target} "
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


def _layer(repair: Repair) -> tuple[int, int, int]:
    """Where `repair` goes in its internal's composition: lasting ones by place, scopes above."""
    scoped = repair.when == SCOPED_WHILE
    return (int(scoped), repair.scope_order if scoped else 0, repair.place)


#: Stands for "the module or class has no attribute of its own by that name".
_ABSENT = object()

#: The scoped repairs in place now, in the order they were applied.
SCOPED: list[Repair] = []

#: The repairs `Repair.apply` put in place, in the order it did (`applied`).
_APPLIED: list[Repair] = []
#: The owner of each replaced attribute, by (id of its module or class, attribute name).
_INTERNALS: dict[tuple[int, str], _Internal] = {}
#: Numbers the scopes, so the latest one goes on top.
_SCOPES = itertools.count(1)


def applied() -> list[Repair]:
    """The repairs in place (not the scoped ones), in the order they were applied."""
    return list(_APPLIED)


def remove_all() -> None:
    """Removes every repair in place, scoped ones first, the last applied first."""
    for repair in reversed(list(SCOPED) + list(_APPLIED)):
        repair.remove()


def apply_scoped(repair: Repair) -> None:
    """Applies `repair` (``when=SCOPED_WHILE``) until `remove_scoped`, on top of the others.

    ``compat.active()`` lists it meanwhile. Its attribute's owner composes it with the other
    repairs of the same internal, as for a lasting repair.

    Raises:
        InternalChangedError: the target is missing (a scoped repair is needed, not optional).
        ValueError: `repair` is not declared ``when=SCOPED_WHILE``.
    """
    if repair.when != SCOPED_WHILE:
        raise ValueError(f"the '{repair.name}' repair is not scoped (when={repair.when!r})")
    if repair.active:
        return
    owner, attr = repair._owner_and_attr()
    if not hasattr(owner, attr):
        raise internals.changed(f"{repair.module}.{repair.target}", repair.upstream)
    repair.scope_order = next(_SCOPES)
    repair._compose_into(owner, attr)
    SCOPED.append(repair)


def remove_scoped(repair: Repair) -> None:
    """Puts back what `apply_scoped` replaced (nothing if it is not in place)."""
    if repair in SCOPED:
        repair.remove()


@contextlib.contextmanager
def scoped(repair: Repair) -> Iterator[Repair]:
    """`repair` in place for the block (`apply_scoped`, then `remove_scoped`)."""
    apply_scoped(repair)
    try:
        yield repair
    finally:
        remove_scoped(repair)
