"""One home per contract: exit statuses, environment variables, TF_CONFIG, in one module each.

`docs/contracts.md` shows `mirrorkit.exit_statuses.STATUSES` and
`mirrorkit.environment_variables.VARIABLES` as tables, row for row; the rule
tests read mirrorkit's source (ast) for a status or a variable name spelled
outside its home. ``python tests/test_contracts.py`` prints the two tables.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import signal

import pytest

from mirrorkit import environment_variables, exit_statuses, number_checks
from mirrorkit.cluster import tf_config

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mirrorkit"
PAGE = ROOT / "docs" / "contracts.md"
STATUS_HEADER = "| status | name | meaning | returned by |"
VARIABLE_HEADER = "| variable | meaning | set by | read by |"


def status_rows() -> list[str]:
    """The exit-status table's rows as `docs/contracts.md` shows them."""
    return [
        f"| {s.code} | `{s.name}` | {s.meaning} | {s.returned_by} |" for s in exit_statuses.STATUSES
    ]


def variable_rows() -> list[str]:
    """The environment-variable table's rows as `docs/contracts.md` shows them."""
    return [
        f"| `{v.name}` | {v.meaning} | {v.set_by} | {v.read_by} |"
        for v in environment_variables.VARIABLES
    ]


def _table(text: str, header: str) -> list[str]:
    lines = text.splitlines()
    start = lines.index(header) + 2  # the header, then | --- |
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append(line)
    return rows


def _constants(module) -> dict[str, object]:
    return {n: v for n, v in vars(module).items() if re.fullmatch(r"[A-Z][A-Z0-9_]*", n)}


# --- the page and the modules agree -----------------------------------------------------


def test_every_exit_status_is_in_the_table_and_the_page_row_for_row():
    codes = {n: v for n, v in _constants(exit_statuses).items() if isinstance(v, int)}
    assert {s.name: s.code for s in exit_statuses.STATUSES} == codes
    assert len(set(codes.values())) == len(codes), "two names for one status"
    expected = "\n".join([STATUS_HEADER, "| --- | --- | --- | --- |", *status_rows()])
    assert _table(PAGE.read_text(), STATUS_HEADER) == status_rows(), (
        f"docs/contracts.md's exit statuses differ from mirrorkit/exit_statuses.py; "
        f"the table is:\n{expected}"
    )


def test_every_environment_variable_is_in_the_table_and_the_page_row_for_row():
    names = {
        n: v
        for n, v in _constants(environment_variables).items()
        if isinstance(v, str) and not n.endswith("_PREFIX")
    }
    assert all(n == v for n, v in names.items()), "a constant is spelled as its variable"
    assert [v.name for v in environment_variables.VARIABLES] == list(
        dict.fromkeys(v.name for v in environment_variables.VARIABLES)
    ), "a variable listed twice"
    assert {v.name for v in environment_variables.VARIABLES} == set(names.values())
    expected = "\n".join([VARIABLE_HEADER, "| --- | --- | --- | --- |", *variable_rows()])
    assert _table(PAGE.read_text(), VARIABLE_HEADER) == variable_rows(), (
        f"docs/contracts.md's environment variables differ from "
        f"mirrorkit/environment_variables.py; the table is:\n{expected}"
    )


def test_the_page_check_notices_a_row_the_module_lacks():
    page = PAGE.read_text().replace(
        STATUS_HEADER + "\n| --- | --- | --- | --- |\n",
        STATUS_HEADER + "\n| --- | --- | --- | --- |\n| 99 | `EXTRA` | x | y |\n",
    )
    assert _table(page, STATUS_HEADER) != status_rows()


def test_statuses_keep_the_conventions_they_name():
    assert exit_statuses.BAD_ARGUMENTS == 2  # argparse's
    assert exit_statuses.TIMED_OUT == 124  # coreutils' timeout
    assert exit_statuses.STEP_HUNG != exit_statuses.TIMED_OUT
    assert exit_statuses.INTERRUPTED == 128 + signal.SIGINT
    assert exit_statuses.STARTUP_STOPPED == 128 + signal.SIGKILL
    assert exit_statuses.TERMINATED == 128 + signal.SIGTERM


def test_the_tf_config_writer_writes_any_task_and_refuses_one_outside_its_cluster():
    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2", "127.0.0.1:3"]}
    assert json.loads(tf_config.for_task(cluster, "worker", 1)) == {
        "cluster": cluster,
        "task": {"type": "worker", "index": 1},
    }
    assert tf_config.tf_config(["127.0.0.1:2"], 0) == tf_config.for_task(
        {"worker": ["127.0.0.1:2"]}, "worker", 0
    )
    for task_type, index in (("evaluator", 0), ("worker", 2), ("chief", -1)):
        with pytest.raises(ValueError, match=f"TF_CONFIG task '{task_type}' {index} is not in"):
            tf_config.for_task(cluster, task_type, index)


# --- one set of argument checks -------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "3", None])
def test_positive_int_names_the_argument_and_the_value(bad):
    with pytest.raises(ValueError) as err:
        number_checks.positive_int(bad, "steps", fix="Give e.g. steps=10.")
    assert str(err.value) == f"steps must be a positive integer; got {bad!r}. Give e.g. steps=10."


def test_number_checks_take_numpy_scalars_and_none_where_allowed():
    import numpy as np

    assert number_checks.positive_int(np.int64(4), "steps") == 4
    assert type(number_checks.positive_int(np.int64(4), "steps")) is int
    assert number_checks.positive_int(None, "log_every", or_none=True) is None
    with pytest.raises(ValueError, match="log_every must be a positive integer or None; got 0"):
        number_checks.positive_int(0, "log_every", or_none=True)
    assert number_checks.non_negative_int(np.int32(0), "warmup_steps") == 0
    with pytest.raises(ValueError, match="warmup_steps must be a non-negative integer; got -1"):
        number_checks.non_negative_int(-1, "warmup_steps")
    assert number_checks.positive_number(np.float32(0.5), "timeout_s", unit="seconds") == 0.5


@pytest.mark.parametrize("bad", [0, -2.5, float("inf"), float("nan"), True, "1"])
def test_positive_number_refuses_what_is_not_a_finite_positive_number(bad):
    with pytest.raises(ValueError) as err:
        number_checks.positive_number(bad, "timeout_s", unit="seconds")
    assert str(err.value) == f"timeout_s must be a positive number of seconds; got {bad!r}"


def test_a_bool_is_not_a_shuffle_buffer():
    from mirrorkit.pipeline.options import Options

    args = dict(shuffle=None, drop_remainder="auto", shard="auto", for_eval=False)
    args.update(cache=False, prefetch=True, preprocess=None)
    said = "shuffle_buffer_size must be a positive integer; got True$"
    with pytest.raises(ValueError, match=said):
        Options.check(**args, buffer=True)
    assert Options.check(**args, buffer=None) is not None


# --- rules: a contract is spelled only in its home ----------------------------------------

ENV_HOME = "environment_variables.py"
STATUS_HOME = "exit_statuses.py"
_EXITS = {("sys", "exit"), ("os", "_exit"), (None, "exit"), (None, "quit"), (None, "SystemExit")}


def _sources(package: pathlib.Path = PACKAGE):
    for path in sorted(package.rglob("*.py")):
        yield path.relative_to(package).as_posix(), ast.parse(path.read_text())


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _strings(tree: ast.AST):
    """Every string literal that is not a docstring (f-string parts included), with its line."""
    docs = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node.lineno, node.value


def spelled_variables(package: pathlib.Path = PACKAGE) -> list[str]:
    """``module:line: text`` for each literal outside its home that spells a variable's name.

    A literal that starts with ``MIRRORKIT_``, or is exactly a variable mirrorkit
    reads or sets (``"TF_CONFIG"``, ``"SLURM_JOB_ID"``); prose that mentions one
    (``"... set MIRRORKIT_PORT to ..."``) is not.
    """
    names = {v.name for v in environment_variables.VARIABLES}
    return [
        f"{module}:{line}: {text!r}"
        for module, tree in _sources(package)
        if module != ENV_HOME
        for line, text in _strings(tree)
        if text.startswith(environment_variables.MIRRORKIT_PREFIX) or text in names
    ]


def _call_name(call: ast.Call) -> tuple[str | None, str] | None:
    if isinstance(call.func, ast.Name):
        return None, call.func.id
    if isinstance(call.func, ast.Attribute) and isinstance(call.func.value, ast.Name):
        return call.func.value.id, call.func.attr
    return None


def _returned(node: ast.AST | None, kind: type) -> list:
    """The `kind` nodes an expression can evaluate to (through ``a if c else b``, ``a or b``)."""
    if isinstance(node, ast.IfExp):
        return _returned(node.body, kind) + _returned(node.orelse, kind)
    if isinstance(node, ast.BoolOp):
        return [found for value in node.values for found in _returned(value, kind)]
    return [node] if isinstance(node, kind) else []


def _int_literals(node: ast.AST | None) -> list[int]:
    """The integer literals an expression can evaluate to."""
    return [c.value for c in _returned(node, ast.Constant) if type(c.value) is int]


def _function_key(stem: str, node: ast.AST) -> tuple[str, str] | None:
    """``f`` in module `stem` is (stem, "f"); ``module.f`` is ("module", "f")."""
    if isinstance(node, ast.Name):
        return stem, node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id, node.attr
    return None


def _status_functions(trees: dict[str, ast.AST]) -> set[tuple[str, str]]:
    """(module stem, function) of every function whose return value is an exit status.

    Those whose value reaches ``sys.exit(f(...))``, those a command line registers
    (``set_defaults(run=f)``), and those a status function returns (``return f(...)``).
    """
    found: set = set()
    for module, tree in trees.items():
        stem = pathlib.PurePath(module).stem
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            if _call_name(node) in _EXITS and node.args and isinstance(node.args[0], ast.Call):
                found.add(_function_key(stem, node.args[0].func))
            if isinstance(node.func, ast.Attribute) and node.func.attr == "set_defaults":
                found |= {_function_key(stem, kw.value) for kw in node.keywords if kw.arg == "run"}
    functions = {
        (pathlib.PurePath(module).stem, node.name): node
        for module, tree in trees.items()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
    }
    todo = [key for key in found if key]
    while todo:
        stem, name = todo.pop()
        function = functions.get((stem, name))
        for node in ast.walk(function) if function else ():
            if not isinstance(node, ast.Return):
                continue
            for call in _returned(node.value, ast.Call):
                called = _function_key(stem, call.func)
                if called and called not in found:
                    found.add(called)
                    todo.append(called)
    found.discard(None)
    return found


def spelled_statuses(package: pathlib.Path = PACKAGE) -> tuple[list[str], set]:
    """``module:line: code`` for each exit status written as a number outside its home.

    A number is an exit status where it is passed to ``sys.exit``, ``os._exit``,
    ``exit``, ``quit`` or ``SystemExit``, or returned by a function whose value is
    an exit status (`_status_functions`). Also returns those functions.
    """
    trees = dict(_sources(package))
    status_functions = _status_functions(trees)
    found = []
    for module, tree in trees.items():
        if module == STATUS_HOME:
            continue
        stem = pathlib.PurePath(module).stem
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            returns = (stem, function.name) in status_functions
            for node in ast.walk(function):
                if isinstance(node, ast.Call) and _call_name(node) in _EXITS and node.args:
                    codes = _int_literals(node.args[0])
                elif returns and isinstance(node, ast.Return):
                    codes = _int_literals(node.value)
                else:
                    continue
                found += [f"{module}:{node.lineno}: {code}" for code in codes]
    return sorted(set(found)), status_functions


def test_environment_variable_names_are_spelled_only_in_their_module():
    found = spelled_variables()
    assert found == [], (
        "import these names from mirrorkit/environment_variables.py (and list a new one "
        f"there, and so in docs/contracts.md): {found}"
    )


def test_exit_statuses_are_numbers_only_in_their_module():
    found, status_functions = spelled_statuses()
    # the search sees the functions that return a status (else it would find nothing):
    for function in [("launch", "run"), ("demo", "_fail"), ("bench", "run"), ("_child", "main")]:
        assert function in status_functions, function
    assert found == [], f"use the names of mirrorkit/exit_statuses.py: {found}"


_SPELLED = '''
import os, sys


def run(args):
    """MIRRORKIT_X and TF_CONFIG in a docstring are prose."""
    os.environ["MIRRORKIT_X"] = os.environ.get("TF_CONFIG", "see TF_CONFIG")
    return _fail() if args else 0


def _fail():
    return 2 if sys.argv else 1


def main(parser):
    parser.set_defaults(run=run)
    sys.exit(3)


def helper():
    return 4  # not a status
'''


def test_the_rules_find_a_spelled_status_and_variable(tmp_path):
    (tmp_path / "launch.py").write_text(_SPELLED)
    assert spelled_variables(tmp_path) == ["launch.py:7: 'MIRRORKIT_X'", "launch.py:7: 'TF_CONFIG'"]
    found, _ = spelled_statuses(tmp_path)
    assert found == ["launch.py:12: 1", "launch.py:12: 2", "launch.py:17: 3", "launch.py:8: 0"]


if __name__ == "__main__":
    print("\n".join([STATUS_HEADER, "| --- | --- | --- | --- |", *status_rows()]))
    print()
    print("\n".join([VARIABLE_HEADER, "| --- | --- | --- | --- |", *variable_rows()]))
