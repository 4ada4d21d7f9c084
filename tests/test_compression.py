"""Gradient compression in the all-reduce keeps data-parallel training within tolerance."""

import numpy as np
import pytest
from _training import make_model

import mirrorkit as mk

#: Documented tolerance (docs/benchmarks.md): max absolute weight difference after 8 SGD steps.
FP16_TOLERANCE = 2e-3


def _train(strategy, compression=None, accumulation=None):
    from _training import GLOBAL_BATCH, make_data

    x, y = make_data()
    model = mk.build(
        lambda: make_model("sgd", 0.1, accumulation),
        strategy,
        gradient_compression=compression,
    )
    data = mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    model.fit(data, epochs=2, verbose=0)
    return model.get_weights()


@pytest.fixture(scope="module")
def uncompressed():
    """One device and 2 replicas without compression: trained once for both 16-bit formats."""
    return _train(mk.strategy("one_device")), _train(mk.strategy(cpu_replicas=2))


@pytest.mark.parametrize("compression, tolerance", [("fp16", FP16_TOLERANCE), ("bf16", 2e-2)])
def test_compressed_all_reduce_stays_close_to_one_device(
    compression, tolerance, uncompressed, capfd
):
    reference, exact = uncompressed
    compressed = _train(mk.strategy(cpu_replicas=2), compression)
    exact_diff = max(float(np.abs(a - b).max()) for a, b in zip(exact, reference, strict=True))
    diff = max(float(np.abs(a - b).max()) for a, b in zip(compressed, reference, strict=True))
    assert exact_diff < 1e-5
    assert 0 < diff < tolerance  # the 16-bit all-reduce is in effect, and close
    assert f"gradient_compression='{compression}'" in capfd.readouterr().err


def test_compression_under_accumulation_is_applied():
    """gradient_accumulation_steps=2: the K-step average goes through the compressed all-reduce
    (it bypassed the gradient hooks once, and fp16 trained bit for bit as float32)."""
    strategy = mk.strategy(cpu_replicas=2)
    exact = _train(strategy, accumulation=2)
    compressed = _train(strategy, "fp16", accumulation=2)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(compressed, exact, strict=True))
    assert 0 < diff < FP16_TOLERANCE


def test_unknown_compression_is_an_error():
    with pytest.raises(ValueError, match="gradient_compression must be None, 'fp16' or 'bf16'"):
        mk.build(
            lambda: make_model("sgd", 0.1), mk.strategy(cpu_replicas=2), gradient_compression="int8"
        )
