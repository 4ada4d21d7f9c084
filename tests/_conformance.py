"""The conformance matrix's cases: every input kind Keras's fit accepts, one device vs mirrorkit.

Each case is one input kind, written twice the way its user would write it:
on one device (plain Keras, no strategy, no mirrorkit: the reference) and
converted to mirrorkit (the model built with ``mk.build``, the input given to
``mk.distribute``, or to ``fit`` directly where that is what mirrorkit tells a
user to do). Every case runs the same operations: ``fit`` with validation data,
``evaluate`` and ``predict`` on the validation input, then the final weights and
``optimizer.iterations`` are read.

`run_all` runs every case of one placement in one fresh process (TensorFlow
starts once per placement), deterministically: `keras.utils.set_random_seed`
before each case, `tf.config.experimental.enable_op_determinism()`, no shuffle
(or the dataset's own seeded shuffle), and the same initial weights (drawn from
a fixed NumPy generator). It returns, per case, the numbers to compare and the
mirrorkit notices said while the case ran (``mirrorkit: ...`` lines on stderr),
or the error it raised.

`write_data(workdir)` writes the files the directory cases read (PNG images in
class folders, text files), once, before the processes start.
"""

from __future__ import annotations

import contextlib
import io
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

SEED = 1337
EPOCHS = 2
BATCH = 16  # the global batch: 8 per replica on 2 replicas
FEATURES = 4
CLASSES = 3
LEARNING_RATE = 0.1


# ---------------------------------------------------------------- placements


@dataclass
class Placement:
    """Where a case runs: `name` is "one_device", "replicas" or "workers"."""

    name: str
    strategy: Any = None

    @property
    def reference(self) -> bool:
        return self.name == "one_device"

    def build(self, model_fn: Callable[[], Any]):
        if self.reference:
            model = model_fn()
        else:
            import mirrorkit as mk

            model = mk.build(model_fn, self.strategy)
        _initial_weights(model)
        return model

    def distribute(self, data, **kwargs):
        import mirrorkit as mk

        return mk.distribute(data, self.strategy, **kwargs)


def _initial_weights(model) -> None:
    """The same starting weights everywhere, whatever the initializers drew."""
    rng = np.random.default_rng(7)
    for variable in model.trainable_variables:
        shape = tuple(variable.shape)
        variable.assign(rng.normal(scale=0.3, size=shape).astype(variable.dtype))


# ---------------------------------------------------------------- data


def arrays(n: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=(n,)).astype("int32")
    return x, y


def train_arrays(n: int = 64):
    return arrays(n, 1)


def val_arrays(n: int = 35):
    """35 rows: the last batch of 3 splits unevenly (2 + 1) over 2 replicas."""
    return arrays(n, 2)


def weights_for(n: int, seed: int):
    return np.random.default_rng(seed).uniform(0.2, 2.0, size=(n,)).astype("float32")


IMAGES_PER_CLASS = 13
IMAGE_SIZE = (8, 8)
TEXTS_PER_CLASS = 10
WORDS = ("good", "bad", "fine", "awful", "great", "poor", "nice", "grim", "okay", "meh")


def write_data(workdir: str) -> None:
    """PNG images in two class folders and text files in two class folders, under `workdir`."""
    from PIL import Image

    rng = np.random.default_rng(3)
    for label in ("cats", "dogs"):
        folder = os.path.join(workdir, "images", label)
        os.makedirs(folder)
        for i in range(IMAGES_PER_CLASS):
            pixels = rng.integers(0, 256, size=(*IMAGE_SIZE, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(folder, f"{i:03d}.png"))
    for label in ("neg", "pos"):
        folder = os.path.join(workdir, "texts", label)
        os.makedirs(folder)
        for i in range(TEXTS_PER_CLASS):
            words = rng.choice(WORDS, size=int(rng.integers(3, 9)))
            with open(os.path.join(folder, f"{i:03d}.txt"), "w") as f:
                f.write(" ".join(words))


# ---------------------------------------------------------------- models


def _compile(model, loss=None, metrics=None, **kwargs):
    import keras

    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE),
        loss=loss or keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=metrics if metrics is not None else ["sparse_categorical_accuracy"],
        jit_compile=False,
        **kwargs,
    )
    return model


def classifier(**compile_kwargs):
    import keras

    model = keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(8, activation="tanh"),
            keras.layers.Dense(CLASSES),
        ]
    )
    return _compile(model, **compile_kwargs)


def weighted_classifier():
    return classifier(metrics=[], weighted_metrics=["sparse_categorical_accuracy"])


def two_outputs():
    import keras

    a = keras.Input((3,), name="a")
    b = keras.Input((2,), name="b")
    hidden = keras.layers.Dense(6, activation="tanh")(keras.layers.Concatenate()([a, b]))
    out_a = keras.layers.Dense(CLASSES, name="out_a")(hidden)
    out_b = keras.layers.Dense(1, name="out_b")(hidden)
    model = keras.Model({"a": a, "b": b}, {"out_a": out_a, "out_b": out_b})
    return _compile(
        model,
        loss={
            "out_a": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            "out_b": "mse",
        },
        metrics={"out_a": ["sparse_categorical_accuracy"], "out_b": ["mae"]},
    )


def image_model():
    import keras

    model = keras.Sequential(
        [
            keras.Input((*IMAGE_SIZE, 3)),
            keras.layers.Rescaling(1.0 / 255),
            keras.layers.Conv2D(2, 3, activation="relu"),
            keras.layers.Flatten(),
            keras.layers.Dense(2),
        ]
    )
    return _compile(model)


def sequence_model(vocabulary: int = 24):
    import keras

    model = keras.Sequential(
        [
            keras.Input((6,), dtype="int64"),
            keras.layers.Embedding(vocabulary, 4),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(2),
        ]
    )
    return _compile(model)


def timeseries_model():
    import keras

    model = keras.Sequential([keras.Input((5, 3)), keras.layers.Flatten(), keras.layers.Dense(1)])
    return _compile(model, loss="mse", metrics=["mae"])


def string_model(sentences):
    """A word through StringLookup and a sentence through TextVectorization, in the model."""
    import keras

    word = keras.Input((1,), dtype="string", name="word")
    sentence = keras.Input((1,), dtype="string", name="sentence")
    lookup = keras.layers.StringLookup(vocabulary=list(WORDS[:6]), output_mode="one_hot")
    vectorize = keras.layers.TextVectorization(max_tokens=12, output_mode="multi_hot")
    vectorize.adapt(sentences)
    features = keras.layers.Concatenate()(
        [keras.layers.Flatten()(lookup(word)), keras.layers.Flatten()(vectorize(sentence))]
    )
    out = keras.layers.Dense(CLASSES)(keras.layers.Dense(6, activation="tanh")(features))
    return _compile(keras.Model({"word": word, "sentence": sentence}, out))


# ---------------------------------------------------------------- cases


@dataclass
class Run:
    """What a case hands to `fit`, `evaluate` and `predict` on one placement."""

    fit: tuple = ()
    fit_kwargs: dict = field(default_factory=dict)
    validation: Any = None
    evaluate: tuple = ()
    evaluate_kwargs: dict = field(default_factory=dict)
    predict: tuple = ()
    predict_kwargs: dict = field(default_factory=dict)


@dataclass
class Case:
    """One input kind: `inputs(p)` gives the `Run` for placement p; `model_fn` builds the model.

    `notices`: text that mirrorkit must say (once) on 2 replicas and on 2 workers.
    `unsaid`: text that mirrorkit must not say (a notice that would be wrong for this input).
    `error`: for a kind mirrorkit refuses, texts its error must contain (what to do instead).
    """

    name: str
    model_fn: Callable[[str], Any]
    inputs: Callable[[Placement, str], Run]
    notices: tuple[str, ...] = ()
    unsaid: tuple[str, ...] = ()
    error: tuple[str, ...] = ()


def _numpy_run(p, x, y, xv, yv, sample_weight=None, val_weight=None, **fit_kwargs):
    """NumPy arrays: to fit directly on one device; through mk.distribute under mirrorkit."""
    if p.reference:
        return Run(
            fit=(x, y),
            fit_kwargs=dict(
                batch_size=BATCH, shuffle=False, sample_weight=sample_weight, **fit_kwargs
            ),
            validation=(xv, yv) if val_weight is None else (xv, yv, val_weight),
            evaluate=(xv, yv),
            evaluate_kwargs=dict(batch_size=BATCH, sample_weight=val_weight),
            predict=(xv,),
            predict_kwargs=dict(batch_size=BATCH),
        )
    train = (x, y) if sample_weight is None else (x, y, sample_weight)
    val = (xv, yv) if val_weight is None else (xv, yv, val_weight)
    class_weight = fit_kwargs.pop("distribute_class_weight", None)
    validation = p.distribute(val, global_batch_size=BATCH, for_eval=True)
    return Run(
        fit=(
            p.distribute(train, global_batch_size=BATCH, shuffle=False, class_weight=class_weight),
        ),
        fit_kwargs=fit_kwargs,
        validation=validation,
        evaluate=(validation,),
        predict=(p.distribute(xv, global_batch_size=BATCH, for_eval=True),),
    )


def numpy_xy(p, workdir):
    return _numpy_run(p, *train_arrays(), *val_arrays())


def numpy_sample_weight(p, workdir):
    x, y = train_arrays()
    xv, yv = val_arrays()
    return _numpy_run(p, x, y, xv, yv, weights_for(len(x), 5), weights_for(len(xv), 6))


def numpy_remainder(p, workdir):
    """70 examples: mirrorkit drops the last 6 in training (said); one device given the first 64."""
    x, y = train_arrays(70)
    if p.reference:
        x, y = x[:64], y[:64]
    return _numpy_run(p, x, y, *val_arrays())


def _dict_arrays(n, seed):
    rng = np.random.default_rng(seed)
    x = {
        "a": rng.normal(size=(n, 3)).astype("float32"),
        "b": rng.normal(size=(n, 2)).astype("float32"),
    }
    y = {
        "out_a": rng.integers(0, CLASSES, size=(n,)).astype("int32"),
        "out_b": rng.normal(size=(n, 1)).astype("float32"),
    }
    return x, y


def dict_features_labels(p, workdir):
    return _numpy_run(p, *_dict_arrays(64, 1), *_dict_arrays(32, 2))


def dict_uneven_last_eval_batch(p, workdir):
    """35 validation examples: the last batch of 3 splits 2 + 1 over 2 replicas."""
    return _numpy_run(p, *_dict_arrays(64, 1), *_dict_arrays(35, 2))


def class_weight_distribute(p, workdir):
    """One device: fit(x, y, class_weight=); mirrorkit: mk.distribute(..., class_weight=)."""
    cw = {0: 0.5, 1: 2.0, 2: 1.25}
    if p.reference:
        return _numpy_run(p, *train_arrays(), *val_arrays(), class_weight=cw)
    return _numpy_run(p, *train_arrays(), *val_arrays(), distribute_class_weight=cw)


def class_weight_fit(p, workdir):
    """One device: fit(x, y, class_weight=); mirrorkit: fit(mk.distribute(...), class_weight=)."""
    return _numpy_run(p, *train_arrays(), *val_arrays(), class_weight={0: 0.5, 1: 2.0, 2: 1.25})


def numpy_validation_split(p, workdir):
    """NumPy straight to fit(validation_split=) on a model built with mk.build."""
    x, y = train_arrays(80)  # 60 train (16, 16, 16, 12) + 20 validation
    return Run(
        fit=(x, y),
        fit_kwargs=dict(batch_size=BATCH, shuffle=False, validation_split=0.25),
        evaluate=(x, y),
        evaluate_kwargs=dict(batch_size=BATCH),
        predict=(x,),
        predict_kwargs=dict(batch_size=BATCH),
    )


def _datasets(n_train=64, n_val=35):
    import tensorflow as tf

    return (
        tf.data.Dataset.from_tensor_slices(train_arrays(n_train)),
        tf.data.Dataset.from_tensor_slices(val_arrays(n_val)),
    )


def _dataset_run(p, train_one, train_mk, val_one, val_mk, **fit_kwargs):
    """Datasets: one device's to fit as they are; mirrorkit's through mk.distribute."""
    if p.reference:
        train, val = train_one, val_one
    else:
        train, val = train_mk, val_mk
    return Run(
        fit=(train,),
        fit_kwargs=fit_kwargs,
        validation=val,
        evaluate=(val,),
        predict=(val,),
    )


def tf_data_unbatched(p, workdir):
    train, val = _datasets()
    return _dataset_run(
        p,
        train.batch(BATCH),
        p.reference or p.distribute(train, global_batch_size=BATCH, shuffle=False),
        val.batch(BATCH),
        p.reference or p.distribute(val, global_batch_size=BATCH, for_eval=True),
    )


def tf_data_batched(p, workdir):
    """70 examples in batches of 16, the last of 6 (even over 2): kept, in training too."""
    train, val = _datasets(70)
    return _dataset_run(
        p,
        train.batch(BATCH),
        p.reference or p.distribute(train.batch(BATCH)),
        val.batch(BATCH),
        p.reference or p.distribute(val.batch(BATCH), global_batch_size=BATCH, for_eval=True),
    )


def tf_data_rebatched(p, workdir):
    """Batched by 8, given global_batch_size=16: unbatched and batched again (said)."""
    train, val = _datasets()
    return _dataset_run(
        p,
        train.batch(BATCH),
        p.reference or p.distribute(train.batch(8), global_batch_size=BATCH, shuffle=False),
        val.batch(BATCH),
        p.reference or p.distribute(val.batch(8), global_batch_size=BATCH, for_eval=True),
    )


def tf_data_uneven_last_batch(p, workdir):
    """69 examples by 16: the last batch of 5 does not split over 2 replicas, so training drops
    it (said); the one-device run is given the same 64. Evaluation keeps its uneven last batch."""
    train, val = _datasets(69)
    return _dataset_run(
        p,
        train.take(64).batch(BATCH),
        p.reference or p.distribute(train.batch(BATCH)),
        val.batch(BATCH),
        p.reference or p.distribute(val.batch(BATCH), for_eval=True),
    )


def tf_data_drop_remainder(p, workdir):
    train, val = _datasets(70)
    train = train.batch(BATCH, drop_remainder=True)
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val.batch(BATCH),
        p.reference or p.distribute(val.batch(BATCH), for_eval=True),
    )


def tf_data_unknown_length(p, workdir):
    """A .filter: 72 examples, 8 filtered out, so 64 in batches of 16; the length is unknown."""
    import tensorflow as tf

    x, y = train_arrays(72)
    keep = np.arange(72) % 9 != 0
    train = (
        tf.data.Dataset.from_tensor_slices((x, y, keep))
        .filter(lambda x, y, keep: keep)
        .map(lambda x, y, keep: (x, y))
        .batch(BATCH)
    )
    _, val = _datasets()
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val.batch(BATCH),
        p.reference or p.distribute(val.batch(BATCH), for_eval=True),
    )


def tf_data_cache(p, workdir):
    train, val = _datasets(70)
    train, val = train.batch(BATCH).cache(), val.batch(BATCH).cache()
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val,
        p.reference or p.distribute(val, for_eval=True),
    )


def tf_data_repeat_steps(p, workdir):
    """.repeat() and steps_per_epoch=3: each epoch takes 3 of the 4 batches, continuing."""
    train, val = _datasets()
    train = train.repeat().batch(BATCH)
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val.batch(BATCH),
        p.reference or p.distribute(val.batch(BATCH), for_eval=True),
        steps_per_epoch=3,
    )


def image_directory(p, workdir):
    """image_dataset_from_directory(validation_split=0.25, subset="both"), its own seeded shuffle:
    20 training images (batches 8, 8, 4), 6 for validation."""
    import keras

    train, val = keras.utils.image_dataset_from_directory(
        os.path.join(workdir, "images"),
        validation_split=0.25,
        subset="both",
        seed=SEED,
        image_size=IMAGE_SIZE,
        batch_size=8,
    )
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val,
        p.reference or p.distribute(val, for_eval=True),
    )


def text_directory(p, workdir):
    """text_dataset_from_directory (16 training, 4 validation files), TextVectorization mapped
    over the dataset as keras.io does, before mk.distribute."""
    import keras

    train, val = keras.utils.text_dataset_from_directory(
        os.path.join(workdir, "texts"),
        validation_split=0.2,
        subset="both",
        seed=SEED,
        batch_size=8,
    )
    vectorize = keras.layers.TextVectorization(max_tokens=24, output_sequence_length=6)
    vectorize.adapt(train.map(lambda text, label: text))
    train = train.map(lambda text, label: (vectorize(text), label))
    val = val.map(lambda text, label: (vectorize(text), label))
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val,
        p.reference or p.distribute(val, for_eval=True),
    )


def _series():
    rng = np.random.default_rng(4)
    return np.cumsum(rng.normal(size=(130, 3)), axis=0).astype("float32") / 10


def timeseries(p, workdir):
    """timeseries_dataset_from_array: 80 training windows (5 batches of 16), 36 for validation."""
    import keras

    data = _series()
    kwargs = dict(sequence_length=5, batch_size=BATCH, shuffle=False)
    train = keras.utils.timeseries_dataset_from_array(
        data[:84], data[5:89, 0], end_index=None, **kwargs
    )
    val = keras.utils.timeseries_dataset_from_array(data[89:129], data[94:, 0], **kwargs)
    return _dataset_run(
        p,
        train,
        p.reference or p.distribute(train),
        val,
        p.reference or p.distribute(val, for_eval=True),
    )


def _batches(x, y, batch):
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]


def _py_dataset(x, y):
    import keras

    class Batches(keras.utils.PyDataset):
        def __init__(self):
            super().__init__()
            self.items = _batches(x, y, BATCH)

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            return self.items[i]

    return Batches()


def py_dataset(p, workdir):
    """keras.utils.PyDataset: to fit directly on both (mk.distribute refuses it, naming this)."""
    train = _py_dataset(*train_arrays())
    val = _py_dataset(*val_arrays())
    return Run(fit=(train,), validation=val, evaluate=(val,), predict=(val,))


def py_dataset_to_distribute(p, workdir):
    return Run(
        fit=(p.reference or p.distribute(_py_dataset(*train_arrays()), global_batch_size=BATCH),)
    )


def _forever(x, y):
    def batches():
        while True:
            yield from _batches(x, y, BATCH)

    return batches()


def generator(p, workdir):
    """A Python generator of batches, cycling: fit(gen, steps_per_epoch=4) on one device;
    under mirrorkit a generator of examples wrapped in tf.data.Dataset.from_generator, as
    mk.distribute's error says, with steps_per_epoch=4. Validation data are arrays: on one
    device, Keras 3.15.1 reads a generator's validation batches one epoch shifted (epoch 2's
    val_loss is not evaluate's on the same batches), so there is nothing to compare; evaluate
    and predict read generators (finite, in a from_generator dataset under mirrorkit)."""
    x, y = train_arrays()
    xv, yv = val_arrays()
    if p.reference:
        return Run(
            fit=(_forever(x, y),),
            fit_kwargs=dict(steps_per_epoch=4, validation_batch_size=BATCH),
            validation=(xv, yv),
            evaluate=(_forever(xv, yv),),
            evaluate_kwargs=dict(steps=3),
            predict=(_forever(xv, yv),),
            predict_kwargs=dict(steps=3),
        )
    import tensorflow as tf

    def examples(x, y, repeat):
        def gen():
            while True:
                yield from zip(x, y, strict=True)
                if not repeat:
                    return

        spec = (tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.int32))
        return tf.data.Dataset.from_generator(gen, output_signature=spec)

    validation = p.distribute((xv, yv), global_batch_size=BATCH, for_eval=True)
    return Run(
        fit=(p.distribute(examples(x, y, True), global_batch_size=BATCH, shuffle=False),),
        fit_kwargs=dict(steps_per_epoch=4),
        validation=validation,
        evaluate=(p.distribute(examples(xv, yv, False), global_batch_size=BATCH, for_eval=True),),
        predict=(validation,),
    )


def generator_fit_directly(p, workdir):
    """The one-device generator code unchanged, on a model built with mk.build."""
    return generator(Placement("one_device"), workdir)


def generator_to_distribute(p, workdir):
    x, y = train_arrays()
    return Run(fit=(p.reference or p.distribute(_forever(x, y), global_batch_size=BATCH),))


def validation_split_distributed(p, workdir):
    """fit(mk.distribute(...), validation_split=): Keras refuses a split of a dataset."""
    x, y = train_arrays()
    return Run(
        fit=(p.reference or p.distribute((x, y), global_batch_size=BATCH, shuffle=False),),
        fit_kwargs=dict(validation_split=0.25),
    )


def _strings(n, seed):
    rng = np.random.default_rng(seed)
    words = rng.choice(WORDS, size=(n, 1))  # some outside the lookup's vocabulary
    sentences = np.array(
        [[" ".join(rng.choice(WORDS, size=int(rng.integers(2, 6))))] for _ in range(n)]
    )
    y = rng.integers(0, CLASSES, size=(n,)).astype("int32")
    return {"word": words, "sentence": sentences}, y


def string_features(p, workdir):
    """NumPy string arrays: Keras's fit refuses them on one device ("Invalid dtype: str..."),
    so one device reads them through tf.data; mk.distribute takes the arrays."""
    import tensorflow as tf

    train, val = _strings(64, 1), _strings(35, 2)
    if p.reference:
        train = tf.data.Dataset.from_tensor_slices(train).batch(BATCH)
        val = tf.data.Dataset.from_tensor_slices(val).batch(BATCH)
        return _dataset_run(p, train, None, val, None)
    validation = p.distribute(val, global_batch_size=BATCH, for_eval=True)
    return Run(
        fit=(p.distribute(train, global_batch_size=BATCH, shuffle=False),),
        validation=validation,
        evaluate=(validation,),
        predict=(p.distribute(val[0], global_batch_size=BATCH, for_eval=True),),
    )


def _string_model():
    return string_model(_strings(64, 1)[0]["sentence"])


CASES = {
    case.name: case
    for case in (
        Case("numpy_xy", classifier, numpy_xy),
        Case("numpy_sample_weight", weighted_classifier, numpy_sample_weight),
        Case("numpy_remainder", classifier, numpy_remainder, notices=("uses 64 of 70",)),
        Case("dict_features_labels", two_outputs, dict_features_labels),
        Case("dict_uneven_last_eval_batch", two_outputs, dict_uneven_last_eval_batch),
        Case("class_weight_distribute", classifier, class_weight_distribute),
        Case("class_weight_fit", classifier, class_weight_fit),
        Case("numpy_validation_split", classifier, numpy_validation_split),
        Case("string_features", _string_model, string_features),
        Case("tf_data_unbatched", classifier, tf_data_unbatched),
        Case("tf_data_batched", classifier, tf_data_batched, notices=("keeps its batches",)),
        Case("tf_data_rebatched", classifier, tf_data_rebatched, notices=("batches it again",)),
        Case(
            "tf_data_uneven_last_batch",
            classifier,
            tf_data_uneven_last_batch,
            notices=("uses 64 of 69", "does not split evenly"),
        ),
        Case("tf_data_drop_remainder", classifier, tf_data_drop_remainder),
        Case(
            "tf_data_unknown_length",
            classifier,
            tf_data_unknown_length,
            notices=("number of batches in data is unknown",),
        ),
        Case("tf_data_cache", classifier, tf_data_cache),
        Case(
            "tf_data_repeat_steps",
            classifier,
            tf_data_repeat_steps,
            unsaid=("number of batches in data is unknown",),  # it is infinite, and steps given
        ),
        Case("image_directory", image_model, image_directory),
        Case("text_directory", sequence_model, text_directory),
        Case("timeseries", timeseries_model, timeseries),
        Case("py_dataset", classifier, py_dataset),
        Case("generator", classifier, generator, notices=("number of batches in data is unknown",)),
        Case("generator_fit_directly", classifier, generator_fit_directly),
        Case(
            "py_dataset_to_distribute",
            classifier,
            py_dataset_to_distribute,
            error=("PyDataset goes to fit() directly",),
        ),
        Case(
            "generator_to_distribute",
            classifier,
            generator_to_distribute,
            error=("tf.data.Dataset.from_generator",),
        ),
        Case(
            "validation_split_distributed",
            classifier,
            validation_split_distributed,
            error=("validation_split", "mk.distribute"),
        ),
    )
}


# ---------------------------------------------------------------- running


def _numbers(value):
    """Keras's results as plain NumPy: arrays, dicts and lists of them."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_numbers(v) for v in value]
    return np.asarray(value)


def run_case(case: Case, p: Placement, workdir: str) -> dict:
    """Runs one case on placement p; its numbers, or its error, and the notices said."""
    import keras

    if p.reference and case.error:
        return {"skipped": "a kind mirrorkit refuses; one device has nothing to compare"}
    if not p.reference:
        from mirrorkit import notices

        notices._said.clear()  # each case says its own once-notices
    keras.utils.set_random_seed(SEED)
    said = io.StringIO()
    result: dict[str, Any] = {}
    start = time.perf_counter()
    with contextlib.redirect_stderr(said):
        try:
            model = p.build(case.model_fn)
            run = case.inputs(p, workdir)
            clock = time.perf_counter()
            history = model.fit(
                *run.fit, validation_data=run.validation, epochs=EPOCHS, verbose=0, **run.fit_kwargs
            )
            result["fit_seconds"] = time.perf_counter() - clock
            result["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
            result["weights"] = [w.copy() for w in model.get_weights()]
            result["iterations"] = int(model.optimizer.iterations.numpy())
            if run.evaluate:
                result["evaluate"] = _numbers(
                    model.evaluate(
                        *run.evaluate, verbose=0, return_dict=True, **run.evaluate_kwargs
                    )
                )
            if run.predict:
                result["predict"] = _numbers(
                    model.predict(*run.predict, verbose=0, **run.predict_kwargs)
                )
        except Exception as error:  # noqa: BLE001 - the error is the result
            result["error"] = f"{type(error).__name__}: {error}"
            result["traceback"] = traceback.format_exc()
    result["seconds"] = time.perf_counter() - start
    lines = said.getvalue().splitlines()
    result["notices"] = [line for line in lines if line.startswith("mirrorkit:")]
    result["stderr"] = lines[-40:]
    return result


def run_all(workdir: str, placement: str, names: tuple[str, ...] | None = None) -> dict:
    """The cases `names` (all when None) on one placement, in this (fresh) process.

    Returns case name -> `run_case`'s result. ``CONFORMANCE_CASES=a,b`` narrows any run (to
    look at a few cases by hand).
    """
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    if placement == "one_device":
        p = Placement(placement)
    else:
        import mirrorkit as mk

        strategy = mk.strategy(cpu_replicas=2) if placement == "replicas" else mk.strategy()
        assert strategy.num_replicas_in_sync == 2, strategy
        p = Placement(placement, strategy)
    names = list(CASES) if names is None else list(names)
    only = os.environ.get("CONFORMANCE_CASES")
    if only:
        names = [name for name in names if name in only.split(",")]
    return {name: run_case(CASES[name], p, workdir) for name in names}
