"""The training recipes and their combinations: one device's step on N replicas, pairwise.

A recipe is one choice per `FACTORS` entry: the precision policy, clipping, gradient
accumulation, gradient compression, a dense model or an Embedding, the optimizer (SGD with
momentum, AdamW, SGD with an EMA that overwrites the weights, and the newer Lion and Muon)
and whether ``fit`` runs Keras's own ``train_step`` or the model's own (which scales its
loss and applies the gradients itself). `RECIPES` covers every pair of choices of two
factors at least once (`pairwise`), not the full product. `train` fits a recipe; with
``mixed_float16`` an example of replica 1's part of step 1 overflows float16, so that every
replica must skip that step and halve the loss scale together, as one device does.
"""

from __future__ import annotations

import itertools

import numpy as np

FACTORS = {
    "precision": ("float32", "mixed_float16", "mixed_bfloat16"),
    "clip": ("none", "clipnorm", "global_clipnorm", "clipvalue"),
    "accumulation": (1, 2),
    "compression": ("none", "fp16", "bf16"),
    "layer": ("dense", "embedding"),
    "optimizer": ("sgd", "adamw", "ema", "lion", "muon"),
    "step": ("fit", "train_step"),
}

GLOBAL_BATCH = 16
EXAMPLES = 96  # 6 steps of the global batch
OVERFLOW_ROW = GLOBAL_BATCH + 12  # step 1, the second half of its batch: replica 1 (or worker 1)
VOCABULARY = 12

#: What each cell may differ from one device by, at most (weights, absolutely): float32 to
#: 1e-5; float16 compute to its resolution (10 bits: 2e-3, as tests/test_mixed_precision.py);
#: bfloat16 compute or all-reduce to its (7 bits: 2e-2, as tests/test_compression.py).
TOLERANCES = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 2e-2}


def pairwise(factors: dict) -> list[dict]:
    """Recipes that hold every pair of levels of two factors at least once (greedy, stable)."""
    names = list(factors)
    uncovered = {
        (a, la, b, lb)
        for a, b in itertools.combinations(names, 2)
        for la in factors[a]
        for lb in factors[b]
    }
    recipes = []
    while uncovered:
        a, la, b, lb = min(uncovered, key=lambda p: (names.index(p[0]), names.index(p[2]), str(p)))
        recipe = {a: la, b: lb}
        for name in names:
            if name in recipe:
                continue
            recipe[name] = max(
                factors[name],
                key=lambda level, name=name: sum(
                    (x, recipe[x], name, level) in uncovered
                    or (name, level, x, recipe[x]) in uncovered
                    for x in recipe
                ),
            )
        recipes.append({name: recipe[name] for name in names})
        uncovered -= {(x, recipe[x], y, recipe[y]) for x, y in itertools.combinations(names, 2)}
    return recipes


RECIPES = pairwise(FACTORS)


def label(recipe: dict) -> str:
    return "-".join(str(recipe[name]) for name in FACTORS)


def tolerance(recipe: dict) -> float:
    """The cell's tolerance: the coarsest precision that touches its numbers."""
    kinds = {"float32"}
    if recipe["precision"] == "mixed_float16" or recipe["compression"] == "fp16":
        kinds.add("float16")
    if recipe["precision"] == "mixed_bfloat16" or recipe["compression"] == "bf16":
        kinds.add("bfloat16")
    return max(TOLERANCES[k] for k in kinds)


def data(recipe: dict, overflow_row: int | None = OVERFLOW_ROW):
    rng = np.random.default_rng(4)
    if recipe["layer"] == "embedding":
        x = rng.integers(0, VOCABULARY, size=(EXAMPLES, 3)).astype("int32")
    else:
        x = rng.normal(size=(EXAMPLES, 4)).astype("float32")
    y = rng.normal(size=(EXAMPLES, 1)).astype("float32")
    if recipe["precision"] == "mixed_float16" and overflow_row is not None:
        y[overflow_row] = 6e4  # its squared error overflows float16
    return x, y


def _optimizer(recipe: dict):
    import keras

    clip = {} if recipe["clip"] == "none" else {recipe["clip"]: 0.5}
    accumulation = recipe["accumulation"] if recipe["accumulation"] > 1 else None
    common = {"gradient_accumulation_steps": accumulation, **clip}
    kind = recipe["optimizer"]
    if kind == "sgd":
        return keras.optimizers.SGD(0.05, momentum=0.9, **common)
    if kind == "adamw":
        return keras.optimizers.AdamW(0.01, weight_decay=0.01, **common)
    if kind == "ema":
        return keras.optimizers.SGD(
            0.05, use_ema=True, ema_momentum=0.8, ema_overwrite_frequency=3, **common
        )
    if kind == "lion":
        return keras.optimizers.Lion(0.003, **common)
    return keras.optimizers.Muon(learning_rate=0.01, adam_lr_ratio=1.0, **common)


def make_model(recipe: dict):
    """The recipe's compiled model, with fixed initial weights (under the caller's scope)."""
    import keras
    import tensorflow as tf

    class OwnStep(keras.Model):
        """keras.io "Customizing what happens in fit()", with the loss scaled for mixed
        precision as its guide does."""

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                scaled = self.optimizer.scale_loss(loss)
            grads = tape.gradient(scaled, self.trainable_variables)
            self.optimizer.apply(grads, self.trainable_variables)
            self.tracker.update_state(loss)
            return {"loss": self.tracker.result()}

        @property
        def metrics(self):
            return [self.tracker]

    if recipe["layer"] == "embedding":
        inputs = keras.Input((3,), dtype="int32")
        hidden = keras.layers.Flatten()(keras.layers.Embedding(VOCABULARY, 4)(inputs))
    else:
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(3, activation="tanh")(inputs)
    outputs = keras.layers.Dense(1, dtype="float32")(hidden)
    if recipe["step"] == "train_step":
        model = OwnStep(inputs, outputs)
        model.tracker = keras.metrics.Mean(name="loss")
    else:
        model = keras.Model(inputs, outputs)
    model.compile(optimizer=_optimizer(recipe), loss="mse")
    rng = np.random.default_rng(7)
    model.set_weights(
        [rng.normal(scale=0.5, size=w.shape).astype("float32") for w in model.get_weights()]
    )
    return model


def train(strategy, recipe: dict, overflow_row: int | None = OVERFLOW_ROW, callbacks=()) -> dict:
    """Fits `recipe` on `strategy`: weights, each step's iterations and loss scale, and the
    stages the optimizer step ran (`mirrorkit.compat.step_record.ran`)."""
    import keras

    import mirrorkit as mk
    from mirrorkit.compat import step_record
    from mirrorkit.training.gradient_hooks import innermost_optimizer

    class Steps(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.iterations, self.scales = [], []

        def on_train_batch_end(self, batch, logs=None):
            optimizer = self.model.optimizer
            self.iterations.append(int(optimizer.iterations.numpy()))
            if hasattr(optimizer, "dynamic_scale"):
                self.scales.append(float(optimizer.dynamic_scale.numpy()))

    keras.mixed_precision.set_global_policy(recipe["precision"])
    try:
        compression = None if recipe["compression"] == "none" else recipe["compression"]
        model = mk.build(lambda: make_model(recipe), strategy, gradient_compression=compression)
        steps = Steps()
        x, y = data(recipe, overflow_row)
        inputs = mk.distribute((x, y), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
        model.fit(inputs, epochs=1, verbose=0, callbacks=[steps, *callbacks])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return {
        "weights": [w.copy() for w in model.get_weights()],
        "iterations": steps.iterations,
        "scales": steps.scales,
        "ran": step_record.ran(innermost_optimizer(model)),
    }


def differences(one: dict, other: dict) -> float:
    """The largest weight difference; iterations and loss scales must be equal at every step."""
    assert other["iterations"] == one["iterations"], (other["iterations"], one["iterations"])
    assert other["scales"] == one["scales"], (other["scales"], one["scales"])
    for weight in other["weights"]:
        assert np.isfinite(weight).all(), "a weight is not finite"
    return max(
        float(np.abs(a - b).max()) for a, b in zip(one["weights"], other["weights"], strict=True)
    )


def train_all(strategy, recipes) -> dict:
    """Every recipe in `recipes` on `strategy`, by label (a worker's, in the shared job)."""
    return {label(recipe): train(strategy, recipe) for recipe in recipes}
