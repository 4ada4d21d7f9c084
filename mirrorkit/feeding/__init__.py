"""How Keras's ``fit``, ``evaluate`` and ``predict`` are fed a dataset `mk.distribute` made.

mirrorkit's own patches of Keras for its inputs, none of them a repair of a Keras bug:

- `one_iterator`: one distributed iterator for all the epochs of a ``fit`` (and across
  ``evaluate`` and ``predict`` calls), reading the dataset's repeating twin;
- `fit_epoch`: the epoch each ``fit`` begins, told to the shuffled orders
  (`mirrorkit.pipeline.epoch_order`);
- `validation_split`: ``fit(validation_split=)`` on a distributed dataset raises an error that
  says how to split it.

Each declares its patches where it is defined (`mirrorkit.patching.repair.declare`, or
`register` for the one applied on first use), and ``mk.compat.describe()`` lists them
with the feature that needs them.
"""

from mirrorkit.feeding import (  # noqa: F401 - importing the package declares them all
    fit_epoch,
    one_iterator,
    validation_split,
)
