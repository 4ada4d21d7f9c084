"""docs/repair_tables.py, the tables of the Keras repairs page, loaded once without mkdocs."""

from __future__ import annotations

import functools
import importlib.util
import pathlib
from types import ModuleType

PATH = pathlib.Path(__file__).resolve().parent.parent / "docs" / "repair_tables.py"


@functools.cache
def tables() -> ModuleType:
    """The module (it imports mirrorkit's catalogue when a table is asked for)."""
    spec = importlib.util.spec_from_file_location("mirrorkit_docs_repair_tables", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
