"""Read a tensorflow-datasets split so each worker reads its own files."""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf


@dataclasses.dataclass(frozen=True)
class TfdsSplit:
    """A prepared tfds split and how its files fall to input pipelines.

    Attributes:
        builder: the tfds builder (already prepared on disk).
        split: the split expression, e.g. ``"train"`` or ``"train[:80%]"``.
        num_examples: examples in the split.
        file_lengths: examples per file instruction, in tfds's file order.
        as_supervised: read ``(input, label)`` tuples instead of dicts.
    """

    builder: Any
    split: str
    num_examples: int
    file_lengths: tuple[int, ...]
    as_supervised: bool

    @property
    def num_files(self) -> int:
        """How many files (file instructions) the split reads."""
        return len(self.file_lengths)

    def examples_per_pipeline(self, num_pipelines: int) -> list[int]:
        """Examples each input pipeline reads when files are sharded among them.

        tfds gives pipeline i the file instructions i, i + n, i + 2n, ...
        (``tfds.ReadConfig(input_context=...)``).
        """
        return [sum(self.file_lengths[i::num_pipelines]) for i in range(num_pipelines)]

    def read(
        self,
        input_context: tf.distribute.InputContext | None,
        shuffle_files: bool,
        seed: int | None,
    ) -> tf.data.Dataset:
        """This pipeline's examples: its own files when `input_context` is given, else all."""
        import tensorflow_datasets as tfds

        config = tfds.ReadConfig(
            input_context=input_context,
            shuffle_seed=seed,
            try_autocache=False,
        )
        return self.builder.as_dataset(
            split=self.split,
            shuffle_files=shuffle_files,
            read_config=config,
            as_supervised=self.as_supervised,
        )


def open_split(
    data: Any, split: str | None, data_dir: str | None, as_supervised: bool
) -> TfdsSplit:
    """Opens a tfds dataset by name or builder, on disk only (nothing is downloaded).

    Raises:
        ValueError: no split given, or the split does not exist; the message
            lists the splits that do.
        FileNotFoundError: the dataset is not prepared in `data_dir`.
    """
    import tensorflow_datasets as tfds

    builder = tfds.builder(data, data_dir=data_dir) if isinstance(data, str) else data
    available = sorted(builder.info.splits.keys())
    if not available:
        where = (
            f"data_dir={data_dir!r} (searched as {builder.data_dir!r}); check that path, or run "
            "builder.download_and_prepare() into it once (where the network allows)"
            if data_dir is not None and isinstance(data, str)
            else f"{builder.data_dir!r}; run builder.download_and_prepare() once (where the "
            "network allows), or pass data_dir= where it is prepared"
        )
        raise FileNotFoundError(f"tfds dataset {builder.name!r} is not prepared in {where}")
    if split is None:
        raise ValueError(
            f"mk.distribute needs split= for tfds dataset {builder.name!r}; it has "
            f"{', '.join(available)}"
        )
    try:
        info = builder.info.splits[split]
    except (KeyError, ValueError) as err:
        raise ValueError(
            f"tfds dataset {builder.name!r} has no split {split!r} ({err}); its splits are "
            f"{', '.join(available)}"
        ) from None
    lengths = tuple(int(fi.take) for fi in info.file_instructions)
    return TfdsSplit(builder, split, int(info.num_examples), lengths, as_supervised)


def is_tfds(data: Any) -> bool:
    """Whether `data` names a tfds dataset (a string) or is a tfds builder."""
    if isinstance(data, str):
        return True
    return any(
        cls.__name__ == "DatasetBuilder" and cls.__module__.startswith("tensorflow_datasets")
        for cls in type(data).__mro__
    )
