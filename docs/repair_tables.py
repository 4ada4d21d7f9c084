"""The tables of the Keras repairs page and of Development, made from mirrorkit's repairs.

docs/hooks.py puts them in place when the site is built (`GENERATED` on docs/compat.md,
`REPAIRS_TABLE` on docs/development.md); the tests read this module directly, without mkdocs
(CI's older legs have mirrorkit and TensorFlow, not the site's tools).
"""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parent.parent


#: The line of docs/development.md the table of Keras repairs and their tests replaces.
REPAIRS_TABLE = (
    "<!-- repairs-and-tests table: generated from each Repair's account and tests "
    "(docs/hooks.py) -->"
)


def compat_sections() -> dict[str, str]:
    """The ``###`` sections of the Keras repairs page (docs/compat.md): anchor -> title.

    The anchors are the ones mkdocs gives the headings (its ``toc`` extension's slugify).
    """
    from markdown.extensions.toc import slugify

    sections = {}
    in_code = False
    for line in (ROOT / "docs" / "compat.md").read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("### "):
            title = line[4:].strip()
            sections[slugify(title, "-")] = title
    return sections


def documented_repairs() -> list:
    """Every repair mirrorkit defines, in the catalogue's order (`mirrorkit.patching.catalogue`).

    Each has an account on the Keras repairs page. Raises ImportError where mirrorkit (or
    TensorFlow) is not installed.
    """
    from mirrorkit.patching import catalogue

    return list(catalogue.repairs())


#: Who gets a repair, by its ``applies_to`` (module and name), in the order the table has them.
AUDIENCES = {
    "mirrorkit.cluster.workers.every_strategy": "every strategy",
    "mirrorkit.compat.symbolic_build._models_build_under_it": (
        "every strategy but TensorFlow's default (a one-device strategy too)"
    ),
    "mirrorkit.cluster.workers.spans_replicas": (
        "two or more replicas, or a `MultiWorkerMirroredStrategy`"
    ),
    "mirrorkit.cluster.workers.is_multi_worker": "a `MultiWorkerMirroredStrategy` of any size",
}

#: The lines of docs/compat.md that the tables made from the repairs replace.
GENERATED = {
    "<!-- generated: the repairs each strategy gets (docs/hooks.py) -->": "strategies_table",
    "<!-- generated: the repairs at a glance (docs/hooks.py) -->": "glance_table",
    "<!-- generated: each repair's target (docs/hooks.py) -->": "targets_table",
}


def audience(repair) -> str:
    """Which strategies get `repair`: a label of `AUDIENCES`.

    Raises:
        ValueError: its ``applies_to`` is none of `AUDIENCES`' (add it there, with its label).
    """
    function = repair.applies_to
    name = f"{function.__module__}.{function.__qualname__}"
    if name not in AUDIENCES:
        raise ValueError(
            f"the '{repair.name}' repair applies to strategies by {name}, which docs/hooks.py's "
            "AUDIENCES does not name: add it there with the row it makes"
        )
    return AUDIENCES[name]


def _conditions(repair) -> list[str]:
    """What else decides whether `repair` is in place: its package's import, Keras's fix."""
    found = []
    if repair.package not in ("keras", "tensorflow"):
        found.append(f"once `{repair.package}` is imported, before or after mirrorkit")
    if repair.applied_when:
        found.append(repair.applied_when)
    if repair.fits_before:
        found.append(
            f"off from Keras {repair.fits_before}, which it does not fit yet: the bug is "
            "still there"
        )
    if repair.fixed_in:
        found.append(f"steps aside from Keras {repair.fixed_in}, which fixed it")
    elif repair.checks_keras:
        found.append("steps aside where Keras has the fix")
    return found


def _named(repair) -> str:
    conditions = _conditions(repair)
    return f"`{repair.name}`" + (f" ({'; '.join(conditions)})" if conditions else "")


def strategies_table() -> str:
    """Which repairs each strategy gets, and those a part of mirrorkit applies on first use."""
    from mirrorkit.patching.repair import ON_FIRST_USE, WITH_ENABLE

    repairs = documented_repairs()
    rows = ["| strategy | repairs applied |", "| --- | --- |"]
    for label in AUDIENCES.values():
        ones = [r for r in repairs if r.when == WITH_ENABLE and audience(r) == label]
        if ones:
            rows.append(f"| {label} | {', '.join(_named(r) for r in ones)} |")
    first_use = [r for r in repairs if r.when == ON_FIRST_USE]
    if first_use:
        listed = ", ".join(_named(r) for r in first_use)
        rows.append(f"| any strategy, on the first use of the part that needs it | {listed} |")
    return "\n".join(rows)


def glance_table() -> str:
    """One row per failure (a repair's account): its repairs, upstream report and Keras."""
    sections = compat_sections()
    by_account: dict[str, list] = {}
    for repair in documented_repairs():
        by_account.setdefault(repair.account, []).append(repair)
    rows = [
        "| what goes wrong without it | repairs (as `mk.compat.active()` names them) | "
        "upstream | Keras |",
        "| --- | --- | --- | --- |",
    ]
    for account, repairs in by_account.items():
        title = sections.get(account, account)
        names = ", ".join(f"`{r.name}`" for r in repairs)
        said = (re.sub(r"\s*\(docs: [^)]*\)", "", r.upstream) for r in repairs)
        upstream = "; ".join(dict.fromkeys(said))
        if any(r.fixed_in for r in repairs):
            keras = "before " + ", ".join(sorted({r.fixed_in for r in repairs if r.fixed_in}))
        elif any(r.checks_keras for r in repairs):
            keras = "while Keras has the bug (its code is read first)"
        elif all(r.feature for r in repairs):
            keras = "every supported Keras (a feature of mirrorkit, not a bug of Keras)"
        else:
            keras = "every supported Keras"
        rows.append(f"| [{title}](#{account}) | {names} | {upstream} | {keras} |")
    return "\n".join(rows)


def targets_table() -> str:
    """Each repair's target in Keras or TensorFlow, and what happens where it is missing."""
    from mirrorkit.patching.repair import SCOPED_WHILE

    rows = ["| internal | replaced by | when missing or changed |", "| --- | --- | --- |"]
    for repair in documented_repairs():
        missing = "warning; that repair stays off, and what it repairs fails as in plain Keras"
        if repair.when == SCOPED_WHILE:
            missing = "error"
        rows.append(f"| `{repair.module}.{repair.target}` | `{repair.name}` | {missing} |")
    return "\n".join(rows)


def repairs_table() -> str:
    """The Markdown table of each repair, its account on compat.md and its tests."""
    sections = compat_sections()
    rows = [
        "| repair (as `mk.compat.active()` names it) | account on compat.md | tests |",
        "| --- | --- | --- |",
    ]
    for each in documented_repairs():
        title = sections.get(each.account, each.account or "(none)")
        account = f"[{title}](compat.md#{each.account})" if each.account else title
        tests = ", ".join(f"`{test}`" for test in each.tests) or "(none)"
        rows.append(f"| `{each.name}` | {account} | {tests} |")
    return "\n".join(rows)
