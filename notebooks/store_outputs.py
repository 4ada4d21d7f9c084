"""Runs the notebooks top to bottom and stores their outputs, as the docs site shows them.

    python notebooks/store_outputs.py                       # every notebook here
    python notebooks/store_outputs.py 01_quickstart.ipynb   # one

Each notebook runs in a real Jupyter kernel (nbclient, ``python3``) with this folder as its
current folder, and is written back in place. TensorFlow's C++ start-up lines, which a machine
without a GPU prints on stderr before any cell's own output ("Could not find cuda drivers",
"failed call to cuInit", "All log messages before absl::InitializeLog()"), are left out of the
stored outputs: they say nothing about the notebook and a GPU machine does not print them.
Every other output is stored as it came, stderr included. Needs the ``dev`` extra.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent

#: A line of TensorFlow's C++ log (``I0000 00:00:17.. 123 file.cc:31] ...``) or absl's
#: warning before its log is set up.
TENSORFLOW_STARTUP = re.compile(
    r"^(?:[IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ [\w./-]+:\d+\] .*"
    r"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR)$"
)


def without_tensorflow_startup(text: str) -> str:
    """`text` without TensorFlow's C++ start-up lines (a line may hold one at its end).

    Example:
    ```python
    line = "I0000 00:00:1.5   7 cudart_stub.cc:31] Could not find cuda drivers on your machine"
    assert without_tensorflow_startup(f"{line}\\nmirrorkit: hello\\n") == "mirrorkit: hello\\n"
    ```
    """
    kept = []
    for line in text.splitlines(keepends=True):
        # TensorFlow's C++ log can land mid-line in another stream's text.
        start = re.search(r"[IWEF]\d{4} \d\d:\d\d:[\d.]+\s+\d+ [\w./-]+:\d+\] ", line)
        if start and start.start() > 0:
            head, tail = line[: start.start()], line[start.start() :]
            if TENSORFLOW_STARTUP.match(tail.rstrip("\n")):
                kept.append(head + "\n")
                continue
        if not TENSORFLOW_STARTUP.match(line.rstrip("\n")):
            kept.append(line)
    return "".join(kept)


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
                output["text"] = without_tensorflow_startup(output["text"])
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
