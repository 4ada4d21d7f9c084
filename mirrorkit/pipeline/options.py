"""`mk.distribute`'s options: defaults resolved, bad and contradictory values refused."""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from mirrorkit.number_checks import positive_int
from mirrorkit.pipeline import class_weights

#: ``shard=`` values -> TensorFlow's auto-shard policies.
SHARD_POLICIES = {
    "example": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


class Options:
    """`mk.distribute`'s pipeline options after defaults and checks.

    Attributes:
        shuffle, drop, shard, for_eval, cache, prefetch, preprocess, buffer:
            the resolved values (``drop`` is ``drop_remainder``, ``buffer``
            ``shuffle_buffer_size``).
        drop_auto: whether ``drop_remainder`` was left ``"auto"``.
        class_weight: ``{class id: weight}`` or None.
        repeat: whether the epochs repeat endlessly, each one batched before the
            next begins (`mirrorkit.pipeline.repeating`'s twin for ``fit``); never
            a user's option.
        order: the `EpochOrder` an in-memory shuffle reuses (the twin's: its
            dataset's own), or None for a new one.
    """

    def __init__(self, **kwargs: Any):
        self.__dict__.update(kwargs)

    @classmethod
    def check(
        cls,
        shuffle,
        drop_remainder,
        shard,
        for_eval,
        cache,
        prefetch,
        preprocess,
        buffer,
        class_weight=None,
    ) -> Options:
        """Resolves the defaults; raises on a bad or contradictory value, naming it."""
        if shard not in ("auto", *SHARD_POLICIES):
            raise ValueError(f"shard must be 'auto', 'file', 'example' or 'off'; got {shard!r}")
        if drop_remainder not in ("auto", True, False):
            raise ValueError(
                f"drop_remainder must be 'auto', True or False; got {drop_remainder!r}"
            )
        if for_eval and drop_remainder is True:
            raise ValueError(
                "for_eval=True uses every example once; drop_remainder=True would drop some. "
                "Leave drop_remainder='auto'."
            )
        if for_eval and shuffle:
            raise ValueError(
                "for_eval=True keeps input order (so predict rows match inputs); shuffle=True "
                "contradicts it. Leave shuffle unset."
            )
        if preprocess is not None and not callable(preprocess):
            raise TypeError(f"preprocess must be a function of one example; got {preprocess!r}")
        buffer = positive_int(
            buffer, "shuffle_buffer_size", or_none=True, what="a positive integer"
        )
        return cls(
            shuffle=(not for_eval) if shuffle is None else bool(shuffle),
            drop=(not for_eval) if drop_remainder == "auto" else drop_remainder,
            drop_auto=drop_remainder == "auto",
            shard=shard,
            for_eval=bool(for_eval),
            cache=bool(cache),
            prefetch=bool(prefetch),
            preprocess=preprocess,
            buffer=buffer,
            class_weight=class_weights.check(class_weight, bool(for_eval)),
            repeat=False,
            order=None,
        )
