"""mkdocs hooks: the repository files outside docs/ that the site shows or links.

Pages link a repository file with the relative path that also works on GitHub
(``../examples/quickstart.py`` from ``docs/scenarios.md``). mkdocs resolves a
link against the files it knows by the link's path, so each such file is added
under that path (``../examples/quickstart.py``) and copied into the site under
``source/`` (``source/examples/quickstart.py``). A link to a file that does not
exist stays unresolved, and ``mkdocs build --strict`` fails on it.

mirrorkit's messages and docstrings name a page of this site by its URL path,
``docs: compat/#saving-from-every-worker``; on the API pages, which render the
docstrings, each such path becomes a link to the page.

The notebooks are added twice: as pages (``notebooks/01_quickstart.ipynb``,
which mkdocs-jupyter renders with their stored outputs) and as files under
``../notebooks/`` for links.
"""

from __future__ import annotations

import pathlib
import re

from mkdocs.plugins import CombinedEvent, event_priority
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.utils import get_relative_url

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Repository files pages may link, as globs relative to the repository root.
LINKED = (
    "examples/**/*",
    "tests/*.py",
    "tests/keras_io/*.py",
    "benchmarks/*",
    "notebooks/*",
    "ci/*",
    ".ci/run",
    "pyproject.toml",
    "LICENSE",
)


def _repository_files() -> list[str]:
    found = set()
    for pattern in LINKED:
        for path in ROOT.glob(pattern):
            # a Markdown file would become a page of raw HTML under source/ (and a second
            # search hit for the changelog, which has its page): pages link none of them
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".md":
                found.add(path.relative_to(ROOT).as_posix())
    return sorted(found)


@event_priority(100)  # before mkdocs-jupyter's on_files, which turns notebooks into pages
def _add_notebook_pages(files: Files, config) -> Files:
    """Add the notebooks as pages (rendered by mkdocs-jupyter)."""
    for path in sorted(ROOT.glob("notebooks/*.ipynb")):
        rel = path.relative_to(ROOT).as_posix()
        files.append(File(rel, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


@event_priority(-100)  # after mkdocs-jupyter: these stay plain files, never pages
def _add_linked_files(files: Files, config) -> Files:
    """Add the repository files pages link, under their ``../`` path."""
    docs = config["docs_dir"]
    for rel in _repository_files():
        files.append(
            File(
                f"../{rel}",
                docs,
                config["site_dir"],
                config["use_directory_urls"],
                dest_uri=f"source/{rel}",
                # Set here: mkdocs would exclude them by their "../" (its default excludes ".*").
                inclusion=InclusionLevel.NOT_IN_NAV,
            )
        )
    return files


on_files = CombinedEvent(_add_notebook_pages, _add_linked_files)


#: A page of the site named in a message or docstring: ``docs: PAGE/`` or ``docs: PAGE/#SECTION``.
SITE_REFERENCE = re.compile(r"(?<![\w/])docs:\s+((?:[a-z0-9_-]+/)+)(#[\w-]+)?")


def on_page_content(html: str, page, config, files) -> str:
    """On the API pages, link each ``docs: PAGE/#SECTION`` a docstring names."""
    if not page.file.src_uri.startswith("api/"):
        return html

    def link(match: re.Match) -> str:
        path, section = match.group(1), match.group(2) or ""
        href = get_relative_url(path, page.url) + section
        return f'docs: <a href="{href}">{path}{section}</a>'

    return SITE_REFERENCE.sub(link, html)


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


#: A name of the public API in a page's inline code: `mk.resumable`, `mk.compat.enable(s)`,
#: `mk.callbacks.NaNGuard()`; group 1 is the dotted name after ``mk.``.
API_NAME = re.compile(r"(?<![\[\w])`mk\.([A-Za-z_][\w.]*?)(?:\([^`]*\))?`(?!\]|\()")


def api_identifiers() -> set[str]:
    """The dotted names after ``mk.`` that the API reference documents.

    ``resumable``, ``callbacks.NaNGuard``, ``compat.enable``: read from ``docs/api/`` and the
    modules' public names, without importing TensorFlow.
    """
    import ast

    found = set()
    for line in (ROOT / "docs" / "api" / "mirrorkit.md").read_text().splitlines():
        if line.startswith("::: mirrorkit."):
            found.add(line.removeprefix("::: mirrorkit.").strip())
    callbacks = (ROOT / "docs" / "api" / "callbacks.md").read_text()
    found |= {f"callbacks.{n}" for n in re.findall(r"^ +- (\w+)$", callbacks, re.M)}
    compat = ast.parse((ROOT / "mirrorkit" / "compat" / "__init__.py").read_text())
    found |= {
        f"compat.{node.name}"
        for node in compat.body
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
    }
    return found


def link_api_names(markdown: str, known: set[str]) -> str:
    """Each `mk.NAME` in `markdown`'s prose a cross-reference to its API entry.

    Not in fenced code, headings or a link already; a name the API reference does not
    document stays plain code.
    """
    lines, fenced = [], False
    for line in markdown.splitlines(keepends=True):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        if not fenced and not line.startswith("#"):

            def link(match: re.Match) -> str:
                name = match.group(1).rstrip(".")
                if name not in known:
                    return match.group(0)
                return f"[{match.group(0)}][mirrorkit.{name}]"

            line = API_NAME.sub(link, line)
        lines.append(line)
    return "".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Link the guides' `mk.*` names to the API reference; put the repairs' tables in place.

    docs/development.md: the repairs and their tests; docs/compat.md: `GENERATED`'s tables.
    """
    if not page.file.src_uri.startswith(("api/", "changelog")):
        markdown = link_api_names(markdown, api_identifiers())
    if page.file.src_uri == "development.md":
        wanted = {REPAIRS_TABLE: "repairs_table"}
    elif page.file.src_uri == "compat.md":
        wanted = GENERATED
    else:
        return markdown
    for marker, make in wanted.items():
        if marker not in markdown:
            raise ValueError(f"docs/{page.file.src_uri} lost its line {marker!r}")
        markdown = markdown.replace(marker, generated(make))
    return markdown


def generated(make: str) -> str:
    """The table `make` (a function of this module) returns, or why this build has none."""
    try:
        return globals()[make]()
    except ImportError as missing:  # the docs-only install: no mirrorkit, no TensorFlow
        return (
            f"(The table is made from mirrorkit's repairs, which this build could not import: "
            f'{missing.name or missing}. Build the site with `pip install -e ".[docs]"` to '
            "see it.)"
        )
