"""`mk.launch` from a real Jupyter kernel: a function defined in a cell runs on 2 workers."""

import nbformat
import pytest
from nbclient import NotebookClient

pytestmark = pytest.mark.multiprocess

CELLS = [
    "import mirrorkit as mk",
    """def train(steps):
    import numpy as np
    import keras
    import mirrorkit as mk

    strategy = mk.strategy()
    model = mk.build(
        lambda: (lambda m: (m.compile(optimizer="sgd", loss="mse"), m)[1])(
            keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        ),
        strategy,
    )
    x = np.ones((64, 4), "float32")
    data = mk.distribute((x, x[:, :1]), strategy, global_batch_size=16, seed=0)
    history = model.fit(data, epochs=steps, verbose=0)
    print(f"worker {mk.describe().worker_index} done")
    return strategy.num_replicas_in_sync, len(history.history["loss"])""",
    "result = mk.launch(train, num_workers=2, args=(2,), timeout_s=240)\nprint('result', result)",
]


def test_mk_launch_runs_a_notebook_function_on_two_workers(tmp_path):
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    NotebookClient(
        notebook,
        timeout=300,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    text = "".join(
        output.get("text", "")
        for cell in notebook.cells
        for output in cell.get("outputs", [])
        if output.get("output_type") == "stream"
    )
    assert "[w0] worker 0 done" in text and "[w1] worker 1 done" in text  # streamed into the cell
    assert "result (2, 2)" in text  # worker 0's return value
