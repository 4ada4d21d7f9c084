"""The notebooks in notebooks/ run top to bottom in a real Jupyter kernel and render.

Each is executed with nbclient in a fresh kernel of this interpreter (as
tests/test_notebook.py does); the executed outputs must hold an HTML table and
a PNG image, and no error.
"""

import os

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.multiprocess

NOTEBOOKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "notebooks")
NAMES = [
    "01_quickstart.ipynb",
    "02_scaling.ipynb",
    "03_multiworker_from_a_notebook.ipynb",
]


def test_every_notebook_is_tested():
    assert sorted(n for n in os.listdir(NOTEBOOKS) if n.endswith(".ipynb")) == NAMES


def _outputs(notebook):
    return [output for cell in notebook.cells for output in cell.get("outputs", [])]


def _text(outputs):
    return "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")


@pytest.mark.parametrize("name", NAMES)
def test_stored_outputs_show_tables_and_plots(name):
    """The notebooks in git keep a real run's outputs, so a reader sees them without running."""
    outputs = _outputs(nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4))
    data = [o.get("data", {}) for o in outputs]
    assert any("<table" in d.get("text/html", "") for d in data)
    assert any("image/png" in d for d in data)
    assert not [o for o in outputs if o.get("output_type") == "error"]
    stderr = "".join(o["text"] for o in outputs if o.get("name") == "stderr")
    assert "cuInit" not in stderr and "absl::InitializeLog" not in stderr, "store_outputs.py"
    assert "mirrorkit: " not in stderr, "a stored notice on stderr: run notebooks/store_outputs.py"


def test_storing_drops_only_tensorflow_s_startup_lines():
    from mirrorkit.launcher.tf_noise import without_startup_lines

    stderr = (
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
        "I0000 00:00:1796017053.395280   23163 cudart_stub.cc:31] Could not find cuda drivers "
        "on your machine, GPU will not be used.\n"
        "a cell's own lineE0000 00:00:1796017064.973243   23163 cuda_platform.cc:52] failed call "
        "to cuInit: INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\n"
        "E0000 00:00:1796017064.97   23163 some_file.cc:52] a real error\n"
        "Traceback: a real error\n"
    )
    assert without_startup_lines(stderr) == (
        "a cell's own line\n"
        "E0000 00:00:1796017064.97   23163 some_file.cc:52] a real error\n"
        "Traceback: a real error\n"
    )


@pytest.mark.parametrize("name", NAMES)
def test_notebook_executes_and_renders(name, tmp_path):
    notebook = nbformat.read(os.path.join(NOTEBOOKS, name), as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    outputs = _outputs(notebook)
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, [f"{e['ename']}: {e['evalue']}" for e in errors]
    data = [o.get("data", {}) for o in outputs]
    assert any("<table" in d.get("text/html", "") for d in data), "no HTML table rendered"
    assert any("image/png" in d for d in data), "no plot rendered"
    text = _text(outputs)
    assert "INFO:tensorflow" not in text  # mk.strategy keeps TensorFlow's notebook INFO quiet
    # mirrorkit's notices are ordinary output in a notebook, never stderr lines that
    # TensorFlow's own stderr can split (a worker's relayed lines carry its [wN] prefix)
    said = {
        o["name"]
        for o in outputs
        if o.get("output_type") == "stream"
        for line in o.get("text", "").splitlines()
        if line.startswith("mirrorkit: ")
    }
    assert "stderr" not in said, said
    if name.startswith("01"):  # the quickstart's notices (the strategy, the dropped remainder)
        assert said == {"stdout"}, said
    assert "[w0] WARNING: All log messages before absl" not in text  # launch drops them
