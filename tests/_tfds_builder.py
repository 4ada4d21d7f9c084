"""A tiny image dataset in tfds format, built on disk by the tests (no network)."""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

NUM_TRAIN = 300
NUM_TEST = 100
NUM_FILES = 4


class TinyImages(tfds.core.GeneratorBasedBuilder):
    """8x8 RGB images with a label and an id per example."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(8, 8, 3)),
                    "label": tfds.features.ClassLabel(num_classes=10),
                    "id": np.int64,
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(0, NUM_TRAIN),
            "test": self._generate_examples(10_000, NUM_TEST),
        }

    def _generate_examples(self, first, count):
        rng = np.random.default_rng(first)
        for i in range(first, first + count):
            image = rng.integers(0, 256, size=(8, 8, 3), dtype=np.uint8)
            yield i, {"image": image, "label": i % 10, "id": i}


def prepare(data_dir: str) -> TinyImages:
    tfds.disable_progress_bar()
    builder = TinyImages(data_dir=data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=NUM_FILES))
    return builder


def ids_per_file(builder: TinyImages, split: str) -> list[set[int]]:
    """The ids stored in each file of `split`, in tfds's file order."""
    import tensorflow as tf

    files = []
    for instruction in builder.info.splits[split].file_instructions:
        records = tf.data.TFRecordDataset(instruction.filename)
        files.append({int(builder.info.features.deserialize_example(r)["id"]) for r in records})
    return files
