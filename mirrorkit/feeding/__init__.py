"""How Keras's ``fit``, ``evaluate`` and ``predict`` are fed a dataset `mk.distribute` made.

mirrorkit's own patches of Keras for its inputs, none of them a repair of a Keras bug:

- `one_iterator`: one distributed iterator for all the epochs of a ``fit`` (and across
  ``evaluate`` and ``predict`` calls), reading the dataset's repeating twin;
- `fit_epoch`: the epoch each ``fit`` begins, told to the shuffled orders
  (`mirrorkit.pipeline.epoch_order`);
- `validation_split`: ``fit(validation_split=)`` on a distributed dataset raises an error that
  says how to split it.

Each defines its patches where it is, each saying when it goes in place; the catalogue
(`mirrorkit.patching.catalogue`) names these modules, and ``mk.compat.describe()`` lists
the patches with the feature that needs them.
"""
