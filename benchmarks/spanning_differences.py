"""How far 2 CPU replicas end from one device, with and without the spanning repairs.

Gradient clipping (`clipnorm`, `global_clipnorm`, `clipvalue` on AdamW, 2 epochs of
tests/test_clipping.py's model), a Dense layer on sparse multi-hot inputs into Adam (2 epochs
of tests/test_sparse_gradients.py's model) and an in-batch softmax without and with
`mk.all_gather` (tests/test_global_batch_loss.py's model): the largest weight difference from
one device, in one process with 2 logical CPUs.

Run it as ``python benchmarks/spanning_differences.py``; the Benchmarks page has its
table (docs: benchmarks/).

Example:
```python
import subprocess, sys
subprocess.run([sys.executable, "benchmarks/spanning_differences.py"], check=True)
```
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))


def main() -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(2)]
    )
    import test_clipping as clipping
    import test_global_batch_loss as in_batch
    import test_sparse_gradients as sparse
    from _training import keras_own_step

    import mirrorkit as mk
    from mirrorkit.compat import gradient_sums

    one, two = mk.strategy("one_device"), mk.strategy(cpu_replicas=2)
    rows = []
    for name, args in sorted(clipping.CLIPPING.items()):
        reference = clipping.fit(one, **args)[0]
        repaired = clipping.fit(two, **args)[0]
        with keras_own_step():
            plain = clipping.fit(two, **args)[0]
        rows.append((f"AdamW, {name}", plain, repaired, reference, clipping.largest_difference))

    data = sparse.multi_hot()
    reference = sparse.fit(one, sparse.make_sparse_model, data, as_tf_data=True)[0]
    repaired = sparse.fit(two, sparse.make_sparse_model, data, as_tf_data=True)[0]
    merge = gradient_sums.summed_per_id
    gradient_sums.summed_per_id = lambda gradient: False
    plain = sparse.fit(two, sparse.make_sparse_model, data, as_tf_data=True)[0]
    gradient_sums.summed_per_id = merge
    rows.append(("sparse multi-hot into Adam", plain, repaired, reference,
                 sparse.largest_difference))  # fmt: skip

    reference = in_batch.fit(one)[0]
    rows.append(("in-batch softmax", in_batch.fit(two, gather=False)[0], in_batch.fit(two)[0],
                 reference, in_batch.largest_difference))  # fmt: skip

    print("| model | without the repair (or the gather) | with it |")
    print("| --- | --- | --- |")
    for name, plain, repaired, reference, difference in rows:
        without, with_it = difference(reference, plain), difference(reference, repaired)
        print(f"| {name} | {without:.2g} | {with_it:.2g} |")


if __name__ == "__main__":
    main()
