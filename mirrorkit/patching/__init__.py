"""How mirrorkit changes Keras and TensorFlow: one mechanism, below every feature that uses it.

- `repair`: `Repair`, one reversible replacement of an attribute of a Keras or TensorFlow
  module or class, with its reason, the strategies it applies to and its canary; one
  owner per replaced attribute, which composes the repairs of it by their declared place;
  the repairs in place in the order they were applied (`applied`), and the scoped ones
  (`SCOPED`, `scoped`) a part of mirrorkit keeps in place while it runs.
- `catalogue`: the one list of the modules that define repairs, read when first asked.
- `instance`: a patch of one object (a model's train function, an optimizer's
  all-reduce, a callback's method), which ``compat.describe`` lists and
  ``compat.disable`` undoes.
- `attached`: what mirrorkit remembers about a Keras or TensorFlow object, kept weakly
  beside it rather than as an attribute on it.
- `fit_step`: the mark that a replica is inside ``fit``'s train or test step, which
  the one-device step replacement sets and the loss and gradient repairs read.

It imports no other part of mirrorkit but `mirrorkit.internals` (guarded reads of
private internals), so every package may define its patches with it; the catalogue names
the modules that do by their dotted names and imports them at run time only.
"""
