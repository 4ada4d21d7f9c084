"""Training at scale: what changes besides the strategy when the global batch grows.

`lr` scales the learning rate and warms it up; `batchnorm` finds batch
normalisation whose statistics are per replica; the other modules plan
memory and check a user's own model for equivalence across replica counts.
"""
