"""Runs the notebooks top to bottom and stores their outputs, as the docs site shows them.

    python notebooks/store_outputs.py                       # every notebook here
    python notebooks/store_outputs.py 01_quickstart.ipynb   # one

Each notebook runs in a real Jupyter kernel (nbclient, ``python3``) with this folder as its
current folder, and is written back in place. TensorFlow's known C++ start-up lines, which a
machine without a GPU prints on stderr before any cell's own output ("Could not find cuda
drivers", "failed call to cuInit", "All log messages before absl::InitializeLog()"), are left
out of the stored outputs, as `mirrorkit launch` leaves them out of what it streams
(`mirrorkit.launcher.tf_noise`): they say nothing about the notebook. Every other output is
stored as it came, stderr included. Needs the ``dev`` extra.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

from mirrorkit.launcher.tf_noise import without_startup_lines

HERE = Path(__file__).resolve().parent


def store(path: Path) -> None:
    """Executes the notebook at `path` and writes it back with its new outputs."""
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(
        notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}
    ).execute()
    for cell in notebook.cells:
        outputs = []
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream" and output.get("name") == "stderr":
                output["text"] = without_startup_lines(output["text"])
                if not output["text"]:
                    continue
            outputs.append(output)
        if cell.cell_type == "code":
            cell.outputs = outputs
    nbformat.write(notebook, path)
    print(f"stored {path.name}")


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.name for p in HERE.glob("*.ipynb"))
    for name in names:
        store(HERE / name)
