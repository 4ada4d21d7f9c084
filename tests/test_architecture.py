"""The package's shape: no import cycle, small modules, no untested doctests, errors on stderr."""

import ast
import pathlib
import re

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mirrorkit"
MAX_LINES = 420  # "about 400": a module past it is usually two concerns


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        yield name, path


def _imports(name, path):
    """The mirrorkit modules `name` imports when it is imported (module level, not in functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.If | ast.Try):  # guarded imports still run at import time
            for child in ast.walk(node):
                if isinstance(child, ast.ImportFrom) and child.module:
                    found.add(child.module)
    return found


def _graph():
    names = dict(_modules())
    return {
        name: {m for m in _imports(name, path) if m in names and m != name}
        for name, path in names.items()
    }


def _cycle(graph):
    """One import cycle as a list of modules, or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


def test_no_import_cycle_among_mirrorkit_modules():
    graph = _graph()
    # the graph sees real imports:
    assert "mirrorkit.strategies.topology" in graph["mirrorkit.strategies.factory"]
    assert _cycle(graph) is None, " -> ".join(_cycle(graph))


def test_the_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("name, path", list(_modules()), ids=lambda v: str(v))
def test_module_stays_small(name, path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it along its concern"


def test_docstring_examples_are_fenced_not_doctests():
    # pytest does not run --doctest-modules on mirrorkit/, so a `>>>` example would never run.
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{i}"
        for _, path in _modules()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.match(r"\s*>>> ", line)
    ]
    assert found == [], f"write these examples as ```python blocks: {found}"


def test_docs_architecture_names_every_module():
    doc = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    missing = [
        str(path.relative_to(PACKAGE))
        for _, path in _modules()
        if not (path.name == "__init__.py" and path.parent != PACKAGE)  # a subpackage: its modules
        and f"`{path.relative_to(PACKAGE)}`" not in doc
    ]
    assert missing == [], f"say in one line what each owns in docs/ARCHITECTURE.md: {missing}"


def test_a_command_error_goes_to_stderr(capsys):
    from mirrorkit.commands import cli

    args = cli.build_parser().parse_args(["bench", "--replicas", "0"])
    assert args.run(args) == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert "mirrorkit bench: --replicas counts must be positive" in said.err
