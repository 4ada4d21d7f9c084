"""The demo's data: the bundled UCI digits, or a tfds image data set prepared on disk.

Nothing here downloads: the digits ship inside the package
(``mirrorkit/demo/data/digits.npz``, CC BY 4.0, source and licence in
``mirrorkit/demo/data/README.md``), and a tfds data set must already be
prepared in its data directory.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import numpy as np

#: The bundled data set's name for ``--dataset``.
DIGITS = "digits"
#: Examples of the digits held out for the test accuracy.
DIGITS_TEST_FRACTION = 0.2

_DIGITS_PATH = os.path.join(os.path.dirname(__file__), "data", "digits.npz")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 UCI handwritten digits that ship with mirrorkit.

    Returns:
        ``(images, labels)``: uint8 arrays of shape (1797, 8, 8) with pixel
        values 0..16, and (1797,) with the digit 0..9.

    Example:
    ```python
    from mirrorkit.demo.data import load_digits

    images, labels = load_digits()
    print(images.shape, labels[:10])  # (1797, 8, 8) [0 1 2 3 4 5 6 7 8 9]
    ```
    """
    with np.load(_DIGITS_PATH) as data:
        return data["images"], data["labels"]


def split_digits(
    seed: int = 0, test_fraction: float = DIGITS_TEST_FRACTION
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """A fixed train/test split of the digits, the same for every `seed` on every machine.

    Each digit class is split in the same proportion (stratified), so the test
    set has about 36 examples of every digit.

    Args:
        seed: the permutation's seed; the demo uses 0.
        test_fraction: the share of each class held out for testing.

    Returns:
        ``((x_train, y_train), (x_test, y_test))`` with images of shape
        (n, 8, 8, 1), uint8.
    """
    images, labels = load_digits()
    rng = np.random.default_rng(seed)
    test = np.zeros(len(labels), dtype=bool)
    for digit in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == digit))
        test[members[: round(len(members) * test_fraction)]] = True
    images = images[..., np.newaxis]
    train_idx = rng.permutation(np.flatnonzero(~test))
    test_idx = np.flatnonzero(test)
    return (images[train_idx], labels[train_idx]), (images[test_idx], labels[test_idx])


@dataclasses.dataclass(frozen=True)
class ImageSet:
    """What the demo needs to know about a tfds image data set.

    Attributes:
        name: the tfds name.
        data_dir: where it is prepared.
        image_shape: (height, width, channels).
        num_classes: how many labels.
        train_split: the split to train on.
        test_split: the split to measure accuracy on.
        num_train: examples in the training split.
    """

    name: str
    data_dir: str | None
    image_shape: tuple[int, int, int]
    num_classes: int
    train_split: str
    test_split: str
    num_train: int


def open_tfds(name: str, data_dir: str | None) -> ImageSet:
    """Opens a tfds image classification data set that is already prepared on disk.

    Args:
        name: the tfds name, e.g. ``"mnist"`` (a config as ``"name/config"``).
        data_dir: tfds's data directory; tfds's default (``~/tensorflow_datasets``
            or ``TFDS_DATA_DIR``) when None.

    Returns:
        An `ImageSet`. It trains on ``train`` and tests on ``test`` when the
        data set has both, else on the first 80% and last 20% of ``train``.

    Raises:
        FileNotFoundError: the data set is not prepared there (nothing is
            downloaded); the message says how to prepare it.
        ValueError: tfds knows no such data set, or it has no fixed-size
            ``image`` and class ``label`` features.
    """
    import tensorflow_datasets as tfds

    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError:
        raise ValueError(
            f"--dataset {name!r}: tensorflow-datasets knows no data set of that name, and none "
            f"is prepared under {_where(data_dir)}. Use a tfds name "
            "(https://www.tensorflow.org/datasets/catalog) or the bundled 'digits'."
        ) from None
    splits = builder.info.splits
    if not splits:
        raise FileNotFoundError(
            f"--dataset {name!r} is not prepared in {builder.data_dir!r}, and mirrorkit demo "
            "never downloads. Prepare it once where the network allows:\n"
            f'  python -c "import tensorflow_datasets as tfds; tfds.builder({name!r}, '
            f'data_dir=DIR).download_and_prepare()"\n'
            "then run mirrorkit demo --dataset NAME --data-dir DIR (or leave out --dataset for "
            "the bundled digits)."
        )
    features = builder.info.features
    image, label = _feature(features, "image"), _feature(features, "label")
    shape = tuple(getattr(image, "shape", ()) or ())
    num_classes = getattr(label, "num_classes", None)
    if len(shape) != 3 or None in shape or not num_classes:
        raise ValueError(
            f"--dataset {name!r} is not an image classification data set of fixed-size images: "
            f"the demo needs an 'image' feature of shape (height, width, channels) and a class "
            f"'label'; its features are {features}"
        )
    if "train" not in splits:
        raise ValueError(f"--dataset {name!r} has no 'train' split; its splits are {list(splits)}")
    train, test = ("train", "test") if "test" in splits else ("train[:80%]", "train[80%:]")
    return ImageSet(
        name=name,
        data_dir=data_dir,
        image_shape=tuple(int(d) for d in shape),
        num_classes=int(num_classes),
        train_split=train,
        test_split=test,
        num_train=int(splits[train].num_examples),
    )


def _feature(features: Any, key: str) -> Any:
    try:
        return features[key]
    except (KeyError, TypeError):
        return None


def _where(data_dir: str | None) -> str:
    return repr(data_dir) if data_dir else "tfds's default data directory"
