"""keras-hub tasks on mirrorkit's input: one device, 2 replicas and 2 real workers agree.

A ``BertTextClassifier`` on a small ``BertBackbone`` made from a config (no download),
``preprocessor=None``, trained with ``fit`` on an `mk.distribute` dataset, then ``evaluate``
and ``predict`` on one; each placement in fresh processes. Needs the ``hub`` extra
(keras-hub, Python 3.11+); CI's newest leg installs it. A canary shows, in this process, that a
task without the ``keras_hub_inputs`` repair fails on an `mk.distribute` dataset.
"""

import numpy as np
import pytest

keras_hub = pytest.importorskip("keras_hub", reason="the hub extra: pip install -e '.[hub]'")

from _multiworker import run_workers  # noqa: E402
from _quoted import assert_quoted_in, quoted_block  # noqa: E402

from mirrorkit.launcher.processes import run_function  # noqa: E402

SEQUENCE = 8
EXAMPLES = 64
BATCH = 16


def _inputs():
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, SEQUENCE + 1, size=EXAMPLES)
    padding_mask = np.arange(SEQUENCE)[None, :] < lengths[:, None]
    x = {
        "token_ids": np.where(padding_mask, rng.integers(1, 50, (EXAMPLES, SEQUENCE)), 0),
        "segment_ids": np.zeros((EXAMPLES, SEQUENCE), "int32"),
        "padding_mask": padding_mask,
    }
    y = (x["token_ids"][:, 0] > 25).astype("int32")
    return x, y


def _classifier(preprocessor=None):
    import keras
    import keras_hub

    backbone = keras_hub.models.BertBackbone(
        vocabulary_size=50,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=SEQUENCE,
        dropout=0.0,
    )
    classifier = keras_hub.models.BertTextClassifier(
        backbone, num_classes=2, preprocessor=preprocessor, dropout=0.0
    )
    classifier.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["sparse_categorical_accuracy"],
    )
    return classifier


def train_task(cpu_replicas):
    """In a fresh process or worker: fit, evaluate and predict; plain values back."""
    import keras
    import keras_hub  # noqa: F401 - imported before mk.strategy, as a user's script does

    import mirrorkit as mk

    if cpu_replicas == 1:
        strategy = mk.strategy("one_device")
    else:  # None in a worker: MultiWorkerMirroredStrategy
        strategy = mk.strategy(cpu_replicas=cpu_replicas)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        classifier = _classifier()
    x, y = _inputs()
    train = mk.distribute((x, y), strategy, global_batch_size=BATCH, shuffle=False)
    history = classifier.fit(train, epochs=2, verbose=0, validation_data=train)
    evaluation = classifier.evaluate(
        mk.distribute((x, y), strategy, global_batch_size=BATCH, for_eval=True), verbose=0
    )
    predictions = classifier.predict(
        mk.distribute(x, strategy, global_batch_size=BATCH, for_eval=True), verbose=0
    )
    return {
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "weights": [w.copy() for w in classifier.get_weights()],
        "iterations": int(classifier.optimizer.iterations.numpy()),
        "evaluation": [float(v) for v in evaluation],
        "predictions": np.asarray(predictions),
    }


@pytest.fixture(scope="module")
def placements():
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(3) as pool:
        one = pool.submit(run_function, train_task, (1,), timeout_s=600)
        two = pool.submit(run_function, train_task, (2,), timeout_s=600)
        workers = pool.submit(run_workers, train_task, None, n=2, timeout_s=600)
        return {"one": one.result()[0], "replicas": two.result()[0], "workers": workers.result()}


def _assert_as_one_device(one, got, where):
    assert got["iterations"] == one["iterations"], where
    assert got["history"].keys() == one["history"].keys(), where
    for key, values in one["history"].items():
        np.testing.assert_allclose(got["history"][key], values, atol=1e-5, err_msg=f"{where} {key}")
    for i, (a, b) in enumerate(zip(one["weights"], got["weights"], strict=True)):
        np.testing.assert_allclose(b, a, atol=1e-5, err_msg=f"{where} weight {i}")
    np.testing.assert_allclose(got["evaluation"], one["evaluation"], atol=1e-5, err_msg=where)
    np.testing.assert_allclose(got["predictions"], one["predictions"], atol=1e-5, err_msg=where)


@pytest.mark.multiprocess
def test_a_task_on_two_replicas_equals_one_device(placements):
    _assert_as_one_device(placements["one"], placements["replicas"], "2 replicas")


@pytest.mark.multiprocess
def test_a_task_on_two_workers_equals_one_device_and_the_workers_agree(placements):
    for i, worker in enumerate(placements["workers"]):
        _assert_as_one_device(placements["one"], worker, f"worker {i}")


@pytest.mark.slow  # imports keras-hub (seconds) and fits a task in the pytest process
def test_a_task_with_a_preprocessor_is_told_to_preprocess_in_the_pipeline():
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)
    vocabulary = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "fox"]
    preprocessor = keras_hub.models.BertTextClassifierPreprocessor(
        keras_hub.tokenizers.BertTokenizer(vocabulary=vocabulary), sequence_length=SEQUENCE
    )
    with strategy.scope():
        classifier = _classifier(preprocessor)
    texts, labels = np.array(["the quick fox", "the fox"] * 16), np.array([0, 1] * 16)
    data = mk.distribute((texts, labels), strategy, global_batch_size=BATCH)
    with pytest.raises(ValueError, match=r"preprocess=task\.preprocessor"):
        classifier.fit(data, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="Leave out batch_size"):
        classifier.evaluate(data, batch_size=BATCH, verbose=0)
    # What the error says to do trains:
    data = mk.distribute(
        (texts, labels), strategy, global_batch_size=BATCH, preprocess=preprocessor
    )
    classifier.preprocessor = None
    assert len(classifier.fit(data, epochs=1, verbose=0).history["loss"]) == 1


@pytest.mark.upstream
def test_a_task_fails_on_a_distributed_dataset_upstream():
    """keras-hub's PipelineModel turns any input that is no tf.data or grain dataset into one
    with from_tensor_slices, which a distributed dataset is not. If this stops failing, retire
    keras_hub_inputs."""
    import mirrorkit as mk
    from mirrorkit.compat import keras_hub_inputs

    strategy = mk.strategy(cpu_replicas=2)
    with strategy.scope():
        classifier = _classifier()
    x, y = _inputs()
    data = mk.distribute((x, y), strategy, global_batch_size=BATCH, shuffle=False)
    keras_hub_inputs.REPAIR.remove()  # mk.distribute put it in place
    try:
        with pytest.raises(AttributeError, match="_to_batched_tensor_list") as caught:
            classifier.fit(data, epochs=1, verbose=0)
    finally:
        keras_hub_inputs.REPAIR.apply()
    quote = quoted_block("compat.md", "0.32 raises:")
    assert_quoted_in(quote, f"AttributeError: {caught.value}")
