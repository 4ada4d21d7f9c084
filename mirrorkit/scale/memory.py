"""`mk.plan_memory`: does the model fit each replica's device, and the largest batch that does.

Weights, gradients and optimizer slots are counted from the built model's
variables. The rest is measured in a fresh process on the CPU, at batches
of 1/8 and 1/2 of the planned one (so planning works for a batch that would
not fit, and a measuring error is multiplied by 2.3 at most, not by 7 as
between 1/8 and 1/4): the growth of the process's peak resident memory from before the
model exists through one real step at the smaller batch, less the variables,
is the fixed runtime cost (the traced step, temporaries); the growth between
the two steps, per example, is the activation memory of one example, but
never less than twice the layers' outputs (kept for the backward pass, and
their gradients): peak RSS barely grows where the allocator reuses memory
freed earlier. The plan extrapolates linearly to the planned batch.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Callable
from typing import Any

from mirrorkit.environment_variables import (
    CUDA_VISIBLE_DEVICES,
    MALLOC_ARENA_MAX,
    MALLOC_MMAP_THRESHOLD_,
    MALLOC_TOP_PAD_,
    MALLOC_TRIM_THRESHOLD_,
    TF_CPP_MIN_LOG_LEVEL,
)
from mirrorkit.number_checks import positive_int

#: glibc's own malloc thresholds, set explicitly in the measuring process: the launcher's
#: workers keep freed memory for reuse (`mirrorkit.launcher.allocator`), and then a step's
#: memory reuses pages already counted and the peak RSS does not grow; with these, blocks of
#: 128 KiB and more are mapped and unmapped as they are used, so RSS growth measures them.
#: One arena: with glibc's default (one per thread, up to 8 per core) the first step's fixed
#: cost came out about 65 or about 86 MiB, run to run, on the same model (tests/test_plan_memory).
MEASURE_ENV = {
    MALLOC_ARENA_MAX: "1",
    MALLOC_MMAP_THRESHOLD_: "131072",
    MALLOC_TRIM_THRESHOLD_: "131072",
    MALLOC_TOP_PAD_: "131072",
}
_CHILD_ENV = {CUDA_VISIBLE_DEVICES: "", TF_CPP_MIN_LOG_LEVEL: "2", **MEASURE_ENV}
#: The share of device memory a plan may use; the rest is the runtime's own.
USABLE_SHARE = 0.9


@dataclasses.dataclass
class MemoryPlan:
    """Bytes one replica needs at a per-replica batch size, and whether they fit.

    Attributes:
        per_replica_batch_size: the batch the plan is for.
        weights_bytes: the model's variables.
        gradients_bytes: one gradient per trainable variable.
        optimizer_bytes: the optimizer's slot variables.
        activation_bytes_per_example: measured on the CPU, per example.
        runtime_bytes: measured fixed cost of a step beyond the variables (the
            traced step, its temporaries).
        device_bytes: the replica device's memory where TensorFlow can tell
            (the host's RAM for a CPU replica), else None.
    """

    per_replica_batch_size: int
    weights_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activation_bytes_per_example: float
    device_bytes: int | None
    runtime_bytes: int = 0

    @property
    def activations_bytes(self) -> int:
        """Activation memory at this batch size."""
        return int(self.activation_bytes_per_example * self.per_replica_batch_size)

    @property
    def total_bytes(self) -> int:
        """Everything one replica holds during a step."""
        return self._fixed_bytes + self.activations_bytes

    @property
    def _fixed_bytes(self) -> int:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes + self.runtime_bytes

    @property
    def fits(self) -> bool | None:
        """Whether the total fits in the usable device memory; None when unknown."""
        if self.device_bytes is None:
            return None
        return self.total_bytes <= USABLE_SHARE * self.device_bytes

    @property
    def largest_batch(self) -> int | None:
        """The largest per-replica batch that fits; None when the device memory is unknown."""
        if self.device_bytes is None:
            return None
        room = USABLE_SHARE * self.device_bytes - self._fixed_bytes
        if room <= 0:
            return 0
        return int(room // max(self.activation_bytes_per_example, 1.0))

    def __str__(self) -> str:
        mb = 1024 * 1024
        lines = [
            f"memory per replica at per-replica batch {self.per_replica_batch_size}:",
            f"  weights      {self.weights_bytes / mb:10.1f} MiB",
            f"  gradients    {self.gradients_bytes / mb:10.1f} MiB",
            f"  optimizer    {self.optimizer_bytes / mb:10.1f} MiB",
            f"  runtime      {self.runtime_bytes / mb:10.1f} MiB (traced step, temporaries)",
            f"  activations  {self.activations_bytes / mb:10.1f} MiB "
            f"({self.activation_bytes_per_example / 1024:.1f} KiB per example)",
            f"  total        {self.total_bytes / mb:10.1f} MiB",
        ]
        if self.device_bytes is None:
            lines.append("  device memory: unknown to TensorFlow; pass device_bytes=")
        else:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(
                f"  device {self.device_bytes / mb:,.0f} MiB ({USABLE_SHARE:.0%} usable): "
                f"{verdict}; largest per-replica batch that fits: {self.largest_batch:,}"
            )
        return "\n".join(lines)


def plan_memory(
    model_fn: Callable[[], Any],
    per_replica_batch_size: int,
    strategy: Any = None,
    *,
    device_bytes: int | None = None,
    example: tuple[Any, Any] | None = None,
    timeout_s: float = 600,
) -> MemoryPlan:
    """Plans one replica's memory for `model_fn`'s model at a per-replica batch size.

    Args:
        model_fn: a function of no arguments returning a compiled, built
            `keras.Model` (with an ``Input``); it runs in a fresh process.
        per_replica_batch_size: examples per replica per step.
        strategy: the strategy the model will train under; its first replica
            device decides which memory is compared (CPU: the host's RAM;
            GPU: TensorFlow cannot tell the total, so pass `device_bytes`).
            None means the CPU.
        device_bytes: the replica device's memory, overriding what TensorFlow tells.
        example: one ``(x, y)`` example (NumPy, no batch axis) repeated into
            the measured batches; None draws uniform inputs and zero targets
            shaped like the model's output (regression losses).
        timeout_s: stop the measuring process after this long.

    Returns:
        A `MemoryPlan`: bytes per replica, whether they fit, the largest batch.

    Raises:
        ValueError: a non-positive batch size or device memory, or a model
            without a known input shape.

    Example:
    ```python
    import keras
    import mirrorkit as mk

    def make_model():
        model = keras.Sequential([keras.Input((1024,)), keras.layers.Dense(4096),
                                  keras.layers.Dense(10)])
        model.compile(optimizer="adam", loss="mse")
        return model

    print(mk.plan_memory(make_model, per_replica_batch_size=256))
    ```
    """
    for label, value in (
        ("per_replica_batch_size", per_replica_batch_size),
        ("device_bytes", device_bytes),
    ):
        positive_int(value, label, or_none=True, what="a positive integer")
    import cloudpickle

    from mirrorkit.launcher.processes import run_function

    measured = run_function(
        _measure_here,
        (cloudpickle.dumps(model_fn), per_replica_batch_size, example),
        env=lambda i: _CHILD_ENV,
        timeout_s=timeout_s,
        stream=io.StringIO(),
        prefix="plan",
    )[0]
    if device_bytes is None:
        device_bytes = _device_bytes(strategy)
    return MemoryPlan(
        per_replica_batch_size=per_replica_batch_size, device_bytes=device_bytes, **measured
    )


def _device_bytes(strategy: Any) -> int | None:
    device = "CPU"
    if strategy is not None:
        device = strategy.extended.worker_devices[0].upper()
    if "GPU" in device:
        return None  # TensorFlow tells a GPU's usage, not its size
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def peak_rss_bytes() -> int:
    """This process's peak resident memory since it started or since `reset_peak_rss`.

    Linux's ``VmHWM`` (``/proc/self/status``); elsewhere ``ru_maxrss``, which never resets.
    """
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def reset_peak_rss() -> int:
    """Lowers this process's peak resident memory to its current one; returns the peak after.

    A transient peak before (TensorFlow's start-up can touch more memory than it
    keeps) would otherwise hide everything below it. Linux 4.0+ (``clear_refs``);
    elsewhere the peak is left as it is, so a growth measured from it is a floor.
    """
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass
    return peak_rss_bytes()


def _output_bytes_per_example(model) -> int:
    """Bytes of every layer's output for one example (layers with a known output shape)."""
    import numpy as np

    from mirrorkit.scale.batchnorm import all_layers

    total = 0
    for layer in all_layers(model):
        try:
            outputs = layer.output
        except (AttributeError, ValueError):
            continue  # a layer called several times, or never called symbolically
        for out in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            shape = getattr(out, "shape", None)
            if shape is not None and None not in tuple(shape)[1:]:
                total += int(np.prod(tuple(shape)[1:])) * np.dtype(out.dtype).itemsize
    return total


def _measure_here(pickled_model_fn: bytes, batch: int, example: Any = None) -> dict:
    """In a fresh process: count variables; measure activation bytes per example."""
    import cloudpickle
    import numpy as np
    import tensorflow as tf

    tf.constant(1.0) + 1.0  # TensorFlow's own runtime is not the model's memory
    start = reset_peak_rss()
    model = cloudpickle.loads(pickled_model_fn)()
    shape = getattr(model, "input_shape", None)
    if shape is None or not isinstance(shape, tuple) or None in shape[1:]:
        raise ValueError(
            "plan_memory needs a model with a fixed input shape (keras.Input((...))); got "
            f"input_shape={shape!r}"
        )

    def nbytes(variables):
        return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize for v in variables))

    def step(n):
        if example is not None:
            model.train_on_batch(*(np.repeat(np.asarray(a)[None], n, axis=0) for a in example))
            return
        x = tf.random.uniform((n, *shape[1:]))
        y = model(x[:1])  # output structure for the targets
        target = tf.zeros((n, *y.shape[1:]), y.dtype)
        model.train_on_batch(x, target)

    small, large = max(1, batch // 8), max(2, batch // 2)
    step(small)  # builds the optimizer, traces the step for this batch shape
    traced_once = reset_peak_rss()
    step(large)  # traces it for the other shape, so no tracing is measured below
    settled = reset_peak_rss()  # what the model, its optimizer and its traced steps hold
    second_trace = max(settled - traced_once, 0)  # a real run traces its one batch shape once
    # Each batch's peak three times, alternated: one peak alone came out up to 10 MiB high
    # now and then, which a difference of two peaks turns into twice the activations.
    small_peaks, large_peaks = [], []
    for _ in range(3):
        step(small)
        small_peaks.append(peak_rss_bytes() - settled)
        reset_peak_rss()
        step(large)
        large_peaks.append(peak_rss_bytes() - settled)
        reset_peak_rss()
    small_peak, large_peak = float(np.median(small_peaks)), float(np.median(large_peaks))
    slots = [v for v in model.optimizer.variables if len(v.shape) > 0]
    counted = {
        "weights_bytes": nbytes(model.weights),
        "gradients_bytes": nbytes(model.trainable_weights),
        "optimizer_bytes": nbytes(slots),
    }
    per_example = max(large_peak - small_peak, 0) / (large - small)
    runtime = settled - second_trace - start + small_peak - sum(counted.values())
    runtime -= per_example * small
    # Peak RSS barely grows when the allocator reuses memory freed earlier, so
    # the measured figure is a floor: never plan below the layers' outputs,
    # kept for the backward pass and matched by their gradients.
    per_example = max(per_example, 2 * _output_bytes_per_example(model))
    return {
        **counted,
        "activation_bytes_per_example": per_example,
        "runtime_bytes": int(max(runtime, 0)),
    }
