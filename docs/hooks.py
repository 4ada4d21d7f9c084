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

import importlib.util
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


#: A table cell; a part of it between tags; a long word (a name, a path, an option).
_TABLE_CELL = re.compile(r"<td(?:\s[^>]*)?>.*?</td>", re.DOTALL)
_TAG = re.compile(r"(<[^>]+>)")
_LONG_WORD = re.compile(r"[^\s<>]{13,}")
#: Where a long word may break in a narrow column: after these, never mid-name.
_WORD_BREAKS = re.compile(r"(?<=[_./=,])(?=[^_./=,])")
#: A command-line option (``--hang-timeout``): kept whole, not broken after a hyphen.
_OPTION = re.compile(r"(?<![\w-])--[\w][\w-]*")


def break_table_words(html: str) -> str:
    """Lets a long word in a table cell break after ``_ . / = ,`` (``BAD_<wbr>ARGUMENTS``).

    A narrow column then breaks a name or path where a reader splits it, not mid-name
    (output.css lets a cell break a word elsewhere only where it is still wider than its
    column), in code and in prose (``SLURM_STEP_TASKS_PER_NODE``); an option
    (``--hang-timeout``) stays whole.
    """

    def word(match: re.Match) -> str:
        return _WORD_BREAKS.sub("<wbr>", match.group(0))

    def text(part: str) -> str:
        part = _LONG_WORD.sub(word, part)
        return _OPTION.sub(lambda option: f'<span class="option">{option.group(0)}</span>', part)

    def cell(match: re.Match) -> str:
        parts = _TAG.split(match.group(0))
        return "".join(p if p.startswith("<") else text(p) for p in parts)

    return _TABLE_CELL.sub(cell, html)


def on_page_content(html: str, page, config, files) -> str:
    """Long words in table cells may break at ``_ . /``, and docstrings' references link.

    On the API pages, each ``docs: PAGE/#SECTION`` a docstring names is a link.
    """
    html = break_table_words(html)
    if not page.file.src_uri.startswith("api/"):
        return html

    def link(match: re.Match) -> str:
        path, section = match.group(1), match.group(2) or ""
        href = get_relative_url(path, page.url) + section
        return f'docs: <a href="{href}">{path}{section}</a>'

    return SITE_REFERENCE.sub(link, html)


# The tables made from mirrorkit's repairs (a module of its own: the tests read it where
# mkdocs is not installed, as on CI's older legs).
_spec = importlib.util.spec_from_file_location(
    "mirrorkit_repair_tables", pathlib.Path(__file__).resolve().parent / "repair_tables.py"
)
repair_tables = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repair_tables)
REPAIRS_TABLE, GENERATED = repair_tables.REPAIRS_TABLE, repair_tables.GENERATED


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
        return getattr(repair_tables, make)()
    except ImportError as missing:  # the docs-only install: no mirrorkit, no TensorFlow
        return (
            f"(The table is made from mirrorkit's repairs, which this build could not import: "
            f'{missing.name or missing}. Build the site with `pip install -e ".[docs]"` to '
            "see it.)"
        )
