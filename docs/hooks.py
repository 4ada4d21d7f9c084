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
    """Every repair with an account on the Keras repairs page, in the order the table has them.

    `mirrorkit.compat.REPAIRS` first, in its order, then the ones other parts of mirrorkit
    define (declared for ``compat.enable``, or applied on first use), as registered. Raises
    ImportError where mirrorkit (or TensorFlow) is not installed.
    """
    import mirrorkit.strategies.factory  # noqa: F401 - with step_chain, every module defining one
    import mirrorkit.training.step_chain  # noqa: F401
    from mirrorkit import compat
    from mirrorkit.patching import repair

    return [*compat.REPAIRS, *(r for r in repair.known() if r not in compat.REPAIRS)]


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


def on_page_markdown(markdown: str, page, config, files) -> str:
    """On docs/development.md, put the table of Keras repairs and their tests in its place."""
    if page.file.src_uri != "development.md" or REPAIRS_TABLE not in markdown:
        return markdown
    try:
        table = repairs_table()
    except ImportError as missing:  # the docs-only install: no mirrorkit, no TensorFlow
        table = (
            f"(The table is made from mirrorkit's repairs, which this build could not import: "
            f'{missing.name or missing}. Build the site with `pip install -e ".[docs]"` to '
            "see it.)"
        )
    return markdown.replace(REPAIRS_TABLE, table)
