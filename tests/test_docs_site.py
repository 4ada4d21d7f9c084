"""The documentation site (mkdocs.yml, docs/) builds in strict mode and stays true.

- The site builds with `mkdocs build --strict` (a broken link or anchor, a page left out of
  the navigation, a missing API reference or a docstring that does not render fails it).
  Without the `docs` extra the test fails, saying how to install it: CI's newest leg installs
  it (`.ci/run`), so the build is never skipped in silence.
- The API reference names every public name, and `mirrorkit/__init__.pyi` (the stub
  mkdocstrings follows to find the lazily loaded names) imports exactly the names and modules
  `_PUBLIC` lists.
- Every relative link from the README lands on a file that exists, and on a heading of it when
  the link has an anchor (GitHub's anchors: the README is read there).
- The numbers the pages take from code are the code's: the tested version range, the legs of
  the version matrix, the keras.io examples and their changed lines, the notebooks, the absl
  flags. Every example CI runs is linked from a page.
- mirrorkit's messages and docstrings name a page of the site (``docs: compat/#section``),
  never a file of the repository, and each page and section they name exists on the built
  site; the API pages link them.
"""

from __future__ import annotations

import ast
import html
import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mirrorkit import versions

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
INIT = ROOT / "mirrorkit" / "__init__.py"

NUMBERS = {
    2: "two", 3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine",
    10: "ten", 11: "eleven", 12: "twelve", 13: "thirteen", 14: "fourteen", 15: "fifteen",
    16: "sixteen",
}  # fmt: skip


def _assigned(path: Path, name: str):
    """The literal value assigned to `name` at the top level of a Python file."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == name:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{path} assigns no {name}")


def _words(text: str) -> str:
    """Text with its line breaks and runs of spaces made single spaces."""
    return " ".join(text.split())


def _pages() -> dict[str, str]:
    return {p.relative_to(DOCS).as_posix(): p.read_text() for p in DOCS.rglob("*.md")}


@pytest.fixture(scope="module")
def built_site(tmp_path_factory):
    """The site, built once for this module's tests: (its folder, mkdocs's run, seconds)."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.fail('mkdocs is not installed: pip install -e ".[docs]" (CI\'s newest leg does)')
    folder = tmp_path_factory.mktemp("docs")
    start = time.monotonic()
    done = subprocess.run(  # from another folder: the site builds from any directory
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml")]
        + ["--site-dir", str(folder / "site")],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return folder / "site", done, time.monotonic() - start


@pytest.mark.slow
def test_the_site_builds_in_strict_mode(built_site):
    site, done, took = built_site
    assert done.returncode == 0, f"mkdocs build --strict failed after {took:.0f} s:\n{done.stderr}"
    api = (site / "api" / "mirrorkit" / "index.html").read_text()
    for name in _public_names():
        assert f'id="mirrorkit.{name}"' in api, f"the API reference does not render mk.{name}"
    text = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert "distribute(\n    data: Any,\n" in text, "signatures are not formatted (ruff)"
    # parameters as lists that wrap at any width: tables cut descriptions at 1280 px
    assert "<table" not in api and '<li class="doc-section-item' in api
    # docstring examples wrap (docs/stylesheets/api.css): at 1280 px a scroll bar hid line ends
    assert "stylesheets/api.css" in api and "pre-wrap" in (site / "stylesheets/api.css").read_text()
    returns = text.split("distribute(\n    data: Any,", 1)[1].split("Returns:", 1)[1][:800]
    rows = returns.split("Raises:", 1)[0]  # mk.distribute returns one object: one row
    assert rows.count("DistributedDataset") == 1 and "own distributed dataset" in rows, rows
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        page = site / "notebooks" / notebook.stem / "index.html"
        assert page.is_file(), f"{notebook.name} is not a page of the site"
    assert "Unreleased" in (site / "changelog" / "index.html").read_text()
    # no repository Markdown file becomes a raw page under source/ (nor a second changelog)
    assert not list((site / "source").rglob("*.md")), list((site / "source").rglob("*.md"))
    index = json.loads((site / "search" / "search_index.json").read_text())["docs"]
    hits = {d["location"].split("#")[0] for d in index if "Unreleased" in d["text"] + d["title"]}
    assert hits == {"changelog/"}, hits
    _how_do_i_answers_are_found(index)
    # the search box splits at . and _ too: `gradienttape` finds tf.GradientTape
    separator = json.loads((site / "search" / "search_index.json").read_text())["config"]
    separator = separator["separator"]
    assert [w for w in re.split(separator, "tf.GradientTape mixed_float16") if w] == [
        "tf",
        "GradientTape",
        "mixed",
        "float16",
    ], separator
    _named_pages_exist(site)


#: Pages for the project's builders, not its users: their tables may scroll.
BUILDERS_PAGES = ("development/", "ARCHITECTURE/")


@pytest.mark.slow
def test_no_output_block_or_table_is_wider_than_its_box_at_1280_px(built_site):
    """In headless Chromium, 1280 px wide: every output block, table and notebook image of the
    user pages and notebooks is seen whole (none wider than its box); a planted page with a
    wide table and an output line that does not wrap is caught."""
    from _browser import CHROMIUM, clipped

    if CHROMIUM is None:
        pytest.skip("no Chromium here (CI's newest leg installs Debian's chromium package)")
    site, done, _ = built_site
    assert done.returncode == 0, done.stderr[-3000:]
    pages = sorted(
        path.relative_to(site).as_posix()
        for path in site.rglob("index.html")
        if not path.relative_to(site).as_posix().startswith(("source/", *BUILDERS_PAGES))
    )
    planted = site / "planted" / "index.html"
    planted.parent.mkdir()
    wide = "x" * 400
    planted.write_text(
        (site / "resume" / "index.html")
        .read_text()
        .replace(
            '<h2 id="back-up-and-restart">',
            f'<table style="width: 3000px"><tr><td>{wide}</td><td>a wide table</td></tr></table>'
            f'<div class="language-text highlight"><pre><code style="white-space: pre">{wide}'
            '</code></pre></div><h2 id="back-up-and-restart">',
        )
    )
    found = clipped(site, [*pages, "planted/index.html"])
    caught = found.pop("planted/index.html")
    assert [line.split(":")[0] for line in caught] == ["output", "table"], caught
    assert len(found) == len(pages) > 30 and {"notebooks/01_quickstart/index.html"} <= set(found)
    assert {page: lines for page, lines in found.items() if lines} == {}


#: A page of the site a message or docstring names (docs/hooks.py links them on the API pages).
SITE_REFERENCE = re.compile(r"(?<![\w/])docs:\s+((?:[a-z0-9_-]+/)+)(#[\w-]+)?")


def _package_strings():
    """(file:line, text) of every string in mirrorkit, its examples and benchmarks."""
    for folder in ("mirrorkit", "examples", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    yield f"{path.relative_to(ROOT)}:{node.lineno}", node.value


def _named_pages_exist(site: Path) -> None:
    """Every `docs: PAGE/#SECTION` in a message, docstring, page or notebook is on the site."""
    texts = list(_package_strings()) + [
        (path.relative_to(ROOT).as_posix(), path.read_text())
        for path in [*DOCS.rglob("*.md"), *(ROOT / "notebooks").glob("*.ipynb")]
    ]
    named = 0
    for where, text in texts:
        for match in SITE_REFERENCE.finditer(text):
            page, section = match.group(1), match.group(2)
            target = site / page / "index.html"
            assert target.is_file(), f"{where} names docs: {page}, which is not a page of the site"
            if section:
                assert f'id="{section[1:]}"' in target.read_text(), (
                    f"{where} names docs: {page}{section}, which is not a section of that page"
                )
            named += 1
    assert named > 40, f"only {named} pages named: has the form `docs: PAGE/#SECTION` changed?"
    compat = (site / "api" / "compat" / "index.html").read_text()
    assert 'docs: <a href="../../compat/">compat/</a>' in compat, "the API pages link docs: pages"
    # the API pages name no module a user has no page for (mirrorkit.pipeline.epoch_order)
    public = {"mirrorkit.callbacks", "mirrorkit.flags", "mirrorkit.compat"}
    for page in (site / "api").rglob("index.html"):
        named = set(re.findall(r"<code>(mirrorkit\.[\w.]+)</code>", page.read_text()))
        assert named <= public, f"{page.relative_to(site)} names {sorted(named - public)}"


def test_messages_and_docstrings_name_site_pages_not_repository_files():
    """A message or docstring names `docs: inputs/#section`, the page's path on the site."""
    files = [
        f"{where}: {match.group()}"
        for where, text in _package_strings()
        for match in re.finditer(r"docs/[\w/-]+\.md", text)
    ]
    assert files == [], f"name the site's page (docs: PAGE/#SECTION) instead: {files}"


#: Questions users asked, a search term each, and the page that answers it (issue: docs).
QUESTIONS = {
    "2 GPUs in a notebook": ("GPUs", "notebook/"),
    "an absl script on Slurm": ("srun", "clusters/slurm/"),
    "resume after a crash": ("resumable", "resume/"),
    "supported versions": ("CUDA", "versions/"),
    "a custom train_step": ("train_step", "own-train-step/"),
    "silencing mirrorkit's notices": ("silence", "troubleshooting/"),
    "a model built outside the scope": ("outside the scope", "own-train-step/"),
    "a GAN": ("GAN", "own-train-step/"),
    "reading the throughput report": ("input_wait_share", "throughput/"),
    "what an error means": ("task.type", "errors/"),
    "tuning with KerasTuner": ("KerasTuner", "tuning/"),
    "mixed precision": ("float16", "scale/"),
    "serving after training": ("SavedModel", "keras-multi-worker/"),
    "the JAX backend": ("JAX", "versions/"),
    "a Slurm time limit": ("--signal", "clusters/slurm/"),
    "a tracking server on this machine": ("--reach", "multi-worker/"),
    "an MLflow server on this machine": ("MLflow", "multi-worker/"),
    "running out of GPU memory": ("ResourceExhaustedError", "scale/"),
    "KerasTuner's Hyperband": ("Hyperband", "tuning/"),
    "a GradientTape loop": ("GradientTape", "own-train-step/"),
    "a job that prints nothing": ("prints nothing", "failures/"),
    "an Embedding whose ids repeat, with Adam": ("ids repeat", "scale/"),
    "Keras 3's DataParallel on TensorFlow": ("DataParallel", "keras-distribution/"),
    "a GPU slowed by thermal throttling": ("throttling", "throughput/"),
}


def _how_do_i_answers_are_found(index):
    """Each question's term is on the page that answers it, and the How do I page links it."""
    how = " ".join(d["text"] for d in index if d["location"].startswith("how-do-i/"))
    for question, (term, page) in QUESTIONS.items():
        found = {
            d["location"].split("#")[0]
            for d in index
            if term.lower() in (d["title"] + " " + d["text"]).lower()
        }
        assert page in found, f"searching {term!r} ({question}) does not find {page}: {found}"
        assert term.lower() in how.lower() or page.rstrip("/") in how, question


def _public() -> dict[str, str]:
    return _assigned(INIT, "_PUBLIC")


def _public_names() -> list[str]:
    modules = _assigned(INIT, "_MODULES")
    return [name for name in _public() if name not in modules]


def test_the_stub_imports_what_public_names():
    stub = ast.parse((ROOT / "mirrorkit" / "__init__.pyi").read_text())
    modules = _assigned(INIT, "_MODULES")
    imported = {}
    for node in stub.body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                assert alias.asname == alias.name, f"re-export {alias.name} as {alias.name}"
                submodule = f"{node.module}.{alias.name}"
                imported[alias.name] = submodule if alias.name in modules else node.module
    assert imported == _public(), "mirrorkit/__init__.pyi and _PUBLIC must name the same things"


def test_the_api_reference_names_every_public_name():
    reference = (DOCS / "api" / "mirrorkit.md").read_text()
    documented = re.findall(r"^::: mirrorkit\.(\w+)$", reference, re.M)
    assert sorted(documented) == sorted(_public_names())
    for module in _assigned(INIT, "_MODULES"):
        page = (DOCS / "api" / f"{module}.md").read_text()
        assert f"::: mirrorkit.{module}\n" in page, module
    callbacks = (DOCS / "api" / "callbacks.md").read_text()
    listed = re.findall(r"^        - (\w+)$", callbacks, re.M)
    assert sorted(listed) == sorted(_assigned(ROOT / "mirrorkit/callbacks/__init__.py", "__all__"))


def _github_anchor(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    anchors, fence = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            anchors.add(_github_anchor(line.lstrip("#")))
    return anchors


def test_every_link_from_the_readme_lands_on_a_page_that_exists():
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local, "the README links the site's pages"
    for link in local:
        path, _, anchor = link.partition("#")
        target = (README.parent / path).resolve() if path else README
        assert target.exists(), f"README links {link}, which does not exist"
        if anchor:
            assert anchor in _anchors(target.read_text()), f"README links {link}: no such heading"


def test_the_docs_tools_install_alone_or_with_mirrorkit():
    """`pip install --group docs` (no TensorFlow) and the docs extra install the same tools."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extra = project["project"]["optional-dependencies"]["docs"]
    group = project["dependency-groups"]["docs"]
    assert group == extra, "pyproject.toml's docs group and docs extra list different tools"
    names = [re.split(r"[<>=\[;]", tool)[0] for tool in group]
    assert "tensorflow" not in names and "keras" not in names, names


def test_getting_started_lists_every_extra():
    """The extras table of Getting started names each extra pyproject.toml defines, no other."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    page = (DOCS / "index.md").read_text().split("| extra | what it adds |", 1)[1]
    listed = re.findall(r"^\| `([a-z]+)` \|", page.split("\n\n", 1)[0], re.MULTILINE)
    assert sorted(listed) == sorted(extras["optional-dependencies"]), listed


def test_the_readme_is_a_short_first_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200, "the README is the first page: move details to docs/"
    for command in (
        'pip install -e ".[dev]" && mirrorkit demo',
        "python -m pytest -q",
        'pip install -e ".[docs]" && mkdocs build --strict',
    ):
        assert command in text, command


def test_the_tested_range_in_the_docs_is_the_code_s():
    pattern = r"TensorFlow \d+\.\d+-\d+\.\d+ with Keras \d+\.\d+-\d+\.\d+"
    found = 0
    for path in [README, *DOCS.rglob("*.md")]:
        for said in re.findall(pattern, path.read_text()):
            assert said == versions.tested_range(), f"{path.name} says {said}"
            found += 1
    assert found
    page = (DOCS / "versions.md").read_text()
    for leg, (tf, keras) in versions.MATRIX.items():
        assert f"| {leg} | {tf} | {keras} |" in page, leg


def test_the_keras_io_counts_are_the_ports():
    counts = []
    for path in sorted((ROOT / "tests" / "keras_io").glob("*.py")):
        if path.name != "__init__.py":
            lines = _assigned(path, "LINES_CHANGED")
            counts.append((lines["added"] - lines["reindented"], lines["reindented"]))
    new, indented = [c[0] for c in counts], [c[1] for c in counts]
    page = _words((DOCS / "index.md").read_text())
    assert f"{NUMBERS[len(counts)].capitalize()} keras.io examples" in page
    said = f"{min(new)} to {max(new)} new lines, plus {min(indented)} to {max(indented)} only"
    assert said in page
    batched = ("image_dataset_from_directory", "text_dataset_from_directory")
    batched += ("timeseries_dataset_from_array", "FeatureSpace")
    ports = [p for p in (ROOT / "tests" / "keras_io").glob("*.py") if p.name != "__init__.py"]
    using = [p.name for p in ports if any(name in p.read_text() for name in batched)]
    inputs = _words((DOCS / "inputs.md").read_text())
    assert f"{NUMBERS[len(using)]} keras.io examples" in inputs, using


def test_the_notebooks_page_names_every_notebook():
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    page = (DOCS / "notebook.md").read_text()
    assert f"holds {NUMBERS[len(notebooks)]} short notebooks" in _words(page)
    assert f"holds {NUMBERS[len(notebooks)]} notebooks" in _words(README.read_text())
    nav = (ROOT / "mkdocs.yml").read_text()
    for name in notebooks:
        assert f"(notebooks/{name})" in page and f"notebooks/{name}" in nav, name


def test_the_flags_table_lists_every_flag():
    from mirrorkit.flags.definitions import FLAG_NAMES

    page = (DOCS / "absl-flags.md").read_text()
    for name in FLAG_NAMES:
        assert f"`--{name}`" in page, name


def test_every_example_ci_runs_is_linked_from_a_page():
    linked = "\n".join(_pages().values())
    for path in sorted((ROOT / "examples").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(ROOT).as_posix()
            assert f"../{rel})" in linked or f"../../{rel})" in linked, f"no page links {rel}"
