"""Each Keras repair declares its account on the Keras repairs page and its tests.

docs/development.md's table "Keras repairs and their tests" is generated from each
`Repair`'s ``account`` and ``tests`` (docs/repair_tables.py), so these are checked here: every
repair mirrorkit applies process-wide has an account that is a ``###`` section of docs/compat.md and
at least one test, and every test it names is a ``def test_...`` of an existing file.
"""

from __future__ import annotations

import ast
import functools
import pathlib

import pytest
from _docs_tables import tables

ROOT = pathlib.Path(__file__).resolve().parent.parent


@functools.cache
def _repairs():
    return tuple(tables().documented_repairs())


@functools.cache
def _test_functions(path: str) -> frozenset[str]:
    tree = ast.parse((ROOT / path).read_text())
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    )


def _missing_tests(tests: tuple[str, ...]) -> list[str]:
    """The node ids of `tests` that name no file, or no ``def test_...`` in it."""
    missing = []
    for node_id in tests:
        path, sep, name = node_id.partition("::")
        name = name.split("[")[0]  # a parametrized test's case: the function is checked
        if not sep or not name.startswith("test_") or not (ROOT / path).is_file():
            missing.append(node_id)
        elif name not in _test_functions(path):
            missing.append(node_id)
    return missing


def _defined_at_module_level() -> set[str]:
    """The names of the repairs every module of mirrorkit defines as ``REPAIR``/``REPAIRS``.

    Found by reading the source, not through the registry: a module that defines a repair
    but never registers it is found here.
    """
    import importlib

    from mirrorkit.patching.repair import Repair

    found = set()
    for path in sorted((ROOT / "mirrorkit").rglob("*.py")):
        tree = ast.parse(path.read_text())
        assigned = {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        if not assigned & {"REPAIR", "REPAIRS"}:
            continue
        dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        module = importlib.import_module(dotted.removesuffix(".__init__"))
        ones = vars(module).get("REPAIRS") or (vars(module).get("REPAIR"),)
        found |= {one.name for one in ones if isinstance(one, Repair)}
    return found


def test_no_repair_is_left_out():
    """Every repair a module of mirrorkit defines is registered and in the table, once."""
    expected = _defined_at_module_level()
    assert {"one_iterator", "fit_epoch", "step_chain", "fit_notices"} <= expected, expected
    names = [r.name for r in _repairs()]
    assert len(names) == len(set(names)), names
    assert set(names) == expected


@pytest.mark.parametrize("repair", _repairs(), ids=lambda repair: repair.name)
def test_each_repair_has_an_account_on_the_repairs_page(repair):
    sections = tables().compat_sections()
    assert repair.account, f"the '{repair.name}' repair declares no account (Repair.account)"
    assert repair.account in sections, (
        f"the '{repair.name}' repair's account '{repair.account}' is no ### section of "
        f"docs/compat.md: {sorted(sections)}"
    )


@pytest.mark.parametrize("repair", _repairs(), ids=lambda repair: repair.name)
def test_each_repair_names_tests_that_exist(repair):
    assert repair.tests, f"the '{repair.name}' repair declares no tests (Repair.tests)"
    assert not _missing_tests(repair.tests), (
        f"the '{repair.name}' repair names tests that do not exist: {_missing_tests(repair.tests)}"
    )


def test_a_test_that_does_not_exist_is_caught():
    assert _missing_tests(
        (
            "tests/test_compat.py::test_no_such_test",
            "tests/no_such_file.py::test_x",
            "tests/test_compat.py",
        )
    ) == [
        "tests/test_compat.py::test_no_such_test",
        "tests/no_such_file.py::test_x",
        "tests/test_compat.py",
    ]


def test_the_generated_table_has_a_row_per_repair_with_its_link():
    hooks = tables()
    table = hooks.repairs_table().splitlines()
    assert len(table) == 2 + len(_repairs())
    assert (
        "[First-batch build](compat.md#first-batch-build)"
        in table[2 + [r.name for r in _repairs()].index("symbolic_build")]
    )
    page = (ROOT / "docs" / "development.md").read_text()
    assert hooks.REPAIRS_TABLE in page, "docs/development.md lost the table's marker line"


#: Repairs of an upstream bug that have no canary yet: no test that shows the bug without
#: them, no code read from Keras, no fixed_in. This list only shrinks: give a repair a canary
#: (a test marked ``upstream`` in its ``tests``) and take it off.
NO_CANARY_YET: tuple[str, ...] = ()


@functools.cache
def _upstream_tests(path: str) -> frozenset[str]:
    """The tests of `path` marked ``upstream`` (each, or the whole module by ``pytestmark``)."""
    tree = ast.parse((ROOT / path).read_text())
    whole = any(
        isinstance(node, ast.Assign)
        and any(getattr(target, "id", "") == "pytestmark" for target in node.targets)
        and "upstream" in ast.unparse(node.value)
        for node in tree.body
    )
    return frozenset(
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and node.name.startswith("test_")
        and (whole or any("mark.upstream" in ast.unparse(d) for d in node.decorator_list))
    )


def _has_canary(repair) -> bool:
    if repair.checks_keras or repair.fixed_in:
        return True
    return any(
        node_id.split("::")[1].split("[")[0] in _upstream_tests(node_id.split("::")[0])
        for node_id in repair.tests
    )


def test_every_repair_of_an_upstream_bug_knows_when_it_is_no_longer_needed():
    """A canary (an ``upstream`` test, a `needed` that reads Keras, or ``fixed_in``) for each.

    A patch for a feature of mirrorkit (``feature`` set) repairs nothing upstream and needs none.
    """
    bugs = [repair for repair in _repairs() if not repair.feature]
    without = sorted(repair.name for repair in bugs if not _has_canary(repair))
    assert without == sorted(NO_CANARY_YET), (
        "give each repair of an upstream bug a canary (a test marked upstream among its tests, "
        "a needed() that reads Keras's code, or fixed_in), and keep NO_CANARY_YET to the ones "
        f"still without: {without}"
    )


#: Repairs of an upstream bug without a canary of their own yet, which share their family's.
#: This list only shrinks: give a repair an ``upstream`` test (or a case of one) that takes it
#: off alone and that no other repair names, or retire it.
SHARED_CANARY_YET: tuple[str, ...] = ()


def _own_canaries(repair) -> list[str]:
    """The upstream tests (or cases) among `repair`'s tests that no other repair names."""
    others = {test for other in _repairs() if other is not repair for test in other.tests}
    return [
        node_id
        for node_id in repair.tests
        if node_id not in others
        and node_id.split("::")[1].split("[")[0] in _upstream_tests(node_id.split("::")[0])
    ]


def test_every_repair_of_an_upstream_bug_has_a_canary_of_its_own():
    """A canary that takes the repair off alone shows Keras's failure, so CI's closing summary
    names that one repair to retire, not a family."""
    bugs = [repair for repair in _repairs() if not repair.feature]
    shared = sorted(repair.name for repair in bugs if not _own_canaries(repair))
    assert shared == sorted(SHARED_CANARY_YET), (
        "give each repair of an upstream bug a canary of its own, and keep SHARED_CANARY_YET "
        f"to the ones still without: {shared}"
    )


def test_a_patch_for_a_feature_of_mirrorkit_says_which():
    features = {repair.name: repair.feature for repair in _repairs() if repair.feature}
    assert {"one_iterator", "fit_epoch", "step_chain", "fit_notices"} <= set(features), features
    assert all(len(text) > 10 for text in features.values()), features


def test_a_failing_canary_names_the_repair_to_retire():
    """conftest's report hook names, for a failed upstream test, the repairs that declare it."""
    from conftest import repairs_checked_by

    assert repairs_checked_by("tests/test_compat.py::test_steps_per_execution_fails_upstream") == [
        "step_function"
    ]
    assert repairs_checked_by("tests/test_compat.py::test_no_such_test[case]") == []


def test_the_closing_summary_names_the_repairs_to_retire():
    """CI's legs end with the repairs whose canaries no longer see the bug (conftest)."""
    import types

    from conftest import canary_summary

    def report(nodeid, outcome):
        return types.SimpleNamespace(
            nodeid=nodeid,
            when="call",
            keywords={"upstream": 1},
            passed=outcome == "passed",
            failed=outcome == "failed",
        )

    stats = {
        "passed": [report("tests/test_compat.py::test_jit_compile_fails_upstream", "passed")],
        "failed": [report("tests/test_compat.py::test_string_inputs_fail_upstream", "failed")],
    }
    lines = canary_summary(stats)
    assert "1 repairs still needed (step_function)" in lines[0], lines
    assert lines[-1] == (
        "retire now: symbolic_build (tests/test_compat.py::test_string_inputs_fail_upstream)"
    ), lines
    assert canary_summary({"passed": []}) == []


def _canaries_that_take_every_repair_off() -> list[str]:
    """The upstream tests whose own code calls ``compat.disable()``: they take every repair off,
    so their failure names no one repair."""
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        marked = _upstream_tests(f"tests/{path.name}")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name in marked:
                if "compat.disable()" in ast.unparse(node):
                    found.append(f"tests/{path.name}::{node.name}")
    return found


def test_no_canary_takes_every_repair_off():
    """A canary takes its repair off alone (the ``taken_off`` fixture): with every repair off,
    a failure could be another repair's bug, and a fix upstream would retire a family."""
    assert _canaries_that_take_every_repair_off() == []
