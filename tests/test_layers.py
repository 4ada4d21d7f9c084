"""mirrorkit's packages form layers: no two of them import each other, counting every import.

An import inside a function ties two packages as surely as one at the top of a module: it
runs whenever the function does. So every ``import`` counts here, at module level, in
``if``/``try`` blocks and inside functions, and so does ``mk.NAME`` after
``import mirrorkit as mk`` (the package `mirrorkit/__init__.py`'s lazy table loads NAME
from). A package is a folder of mirrorkit (``compat``, ``training``, ...) or a module at
its top (``notices``, ``internals``).

The test fails on any cycle, naming the imports that close it.
"""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "mirrorkit"


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str | None:
    """The package of a mirrorkit module (``mirrorkit.compat.x`` -> ``compat``), or None."""
    parts = module.split(".")
    return parts[1] if parts[0] == "mirrorkit" and len(parts) > 1 else None


def _public_names() -> dict[str, str]:
    """`mk.NAME` -> the module mirrorkit's lazy table loads it from."""
    for node in ast.walk(ast.parse((PACKAGE / "__init__.py").read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_PUBLIC":
            return ast.literal_eval(node.value)
    raise AssertionError("mirrorkit/__init__.py has no _PUBLIC table")


def imported(module: str, tree: ast.Module, public: dict[str, str]) -> list[tuple[str, int]]:
    """Every mirrorkit module `module` imports, wherever the import is, with its line."""
    is_package = False
    package = module.rpartition(".")[0]
    found = []
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((alias.name, node.lineno))
                if alias.name == "mirrorkit":
                    aliases.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = (module if is_package else package).split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((base, node.lineno))
            found += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    for node in ast.walk(tree):  # mk.build after `import mirrorkit as mk`
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id in aliases and node.attr in public:
                found.append((public[node.attr], node.lineno))
    return found


def package_imports() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) package -> the ``file:line`` of each import between them."""
    public = _public_names()
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if path.name == "__init__.py" and path.parent == PACKAGE:
            continue  # the lazy table: its names count where they are used
        for target, line in imported(module, ast.parse(path.read_text()), public):
            importer, target_package = _package(module), _package(target)
            if importer and target_package and importer != target_package:
                where = f"{path.relative_to(PACKAGE.parent)}:{line}"
                found = edges.setdefault((importer, target_package), [])
                if where not in found:
                    found.append(where)
    return edges


def cycle(edges) -> list[str] | None:
    """One cycle of the package graph whose edges are `edges`, as a list of packages."""
    graph: dict[str, set[str]] = {}
    for importer, target in edges:
        graph.setdefault(importer, set()).add(target)
        graph.setdefault(target, set())
    state: dict[str, str] = {}

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


def test_no_two_packages_import_each_other():
    edges = package_imports()
    found = cycle(edges)
    if found:
        pairs = zip(found, found[1:], strict=False)
        steps = [f"{a} -> {b} ({', '.join(edges[(a, b)][:3])})" for a, b in pairs]
        raise AssertionError("packages that import each other:\n  " + "\n  ".join(steps))


def test_the_graph_counts_imports_inside_functions_and_mk_names():
    tree = ast.parse(
        "def f():\n    from mirrorkit.training import building\n"
        "def g():\n    import mirrorkit as mk\n    return mk.distribute\n"
    )
    found = imported("mirrorkit.scale.x", tree, {"distribute": "mirrorkit.pipeline.distributed"})
    assert ("mirrorkit.training.building", 2) in found
    assert ("mirrorkit.pipeline.distributed", 5) in found
    assert cycle({("a", "b"), ("b", "c"), ("c", "a")}) == ["a", "b", "c", "a"]
    assert cycle({("a", "b")}) is None


def test_the_patch_mechanism_imports_no_feature():
    """mirrorkit/patching is below every package that patches: it imports only internals."""
    edges = package_imports()
    below = {target for importer, target in edges if importer == "patching"}
    assert below <= {"internals"}, [edges[("patching", t)] for t in below - {"internals"}]
    assert {importer for importer, target in edges if target == "patching"} >= {
        "compat",
        "strategies",
        "throughput",
    }


def _levels(edges) -> dict[str, int]:
    """Each package's layer: 0 for one that imports no other, else one above its highest."""
    below: dict[str, set[str]] = {}
    for importer, target in edges:
        below.setdefault(importer, set()).add(target)
        below.setdefault(target, set())
    levels: dict[str, int] = {}

    def level(package: str) -> int:
        if package not in levels:
            levels[package] = 1 + max((level(p) for p in below[package]), default=-1)
        return levels[package]

    for package in below:
        level(package)
    return levels


def test_the_architecture_page_draws_the_layers_there_are():
    """docs/ARCHITECTURE.md's "Layers" table is the package graph's, row for row."""
    page = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text()
    table = page.split("## Layers", 1)[1].split("\n## ", 1)[0]
    drawn = {
        name: int(level)
        for level, names in re.findall(r"^\| (\d+) \| (.+) \|$", table, re.MULTILINE)
        for name in re.findall(r"`([\w]+)`", names)
    }
    assert drawn == _levels(package_imports())
