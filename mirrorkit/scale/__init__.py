"""Training at scale: what changes besides the strategy when the global batch grows.

`lr` scales the learning rate and warms it up; `batchnorm` finds batch
normalisation whose statistics are per replica; `custom_step` reads a user's own
``train_step``; `memory` plans one replica's memory. (Whether a user's model
trains the same on N replicas as on one is `mirrorkit.equivalence`.)
"""
