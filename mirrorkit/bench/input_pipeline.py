"""Does the input pipeline keep up? tfds images through `mk.distribute` vs tensors in memory.

`compare` writes a small image dataset in tensorflow-datasets format to disk
(PNG-encoded 36x36 RGB images, several shard files), then trains the
benchmark CNN on it through ``mk.distribute`` (decode, random 32x32 crop,
random flip) and, alternating epoch by epoch in the same process, the same
model on in-memory tensors of the same shape. The ratio of the two rates says
how much the input pipeline costs.
"""

from __future__ import annotations

import statistics
import tempfile
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

IMAGE_SIDE = 36
CROP_SIDE = 32


class BenchImages(tfds.core.GeneratorBasedBuilder):
    """Random 36x36 RGB images with 10 labels, made locally (no download)."""

    VERSION = tfds.core.Version("1.0.0")
    num_examples = 5120
    # Nothing is downloaded, so there is no checksums file to find next to the code. Without
    # this, tfds looks for one through importlib_resources, which it does not install.
    code_path = None

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            features=tfds.features.FeaturesDict(
                {
                    "image": tfds.features.Image(shape=(IMAGE_SIDE, IMAGE_SIDE, 3)),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("image", "label"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(self.num_examples)}

    def _generate_examples(self, count):
        rng = np.random.default_rng(0)
        for i in range(count):
            image = rng.integers(0, 256, size=(IMAGE_SIDE, IMAGE_SIDE, 3), dtype=np.uint8)
            yield i, {"image": image, "label": i % 10}


def prepare(data_dir: str, num_examples: int = 5120, num_files: int = 8) -> BenchImages:
    """Writes the image dataset into `data_dir` (once) and returns its builder."""
    tfds.disable_progress_bar()
    BenchImages.num_examples = num_examples
    builder = BenchImages(data_dir=data_dir)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(num_shards=num_files))
    return builder


def augment(image: tf.Tensor, label: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Random 32x32 crop and horizontal flip, scaled to [0, 1]."""
    image = tf.image.random_crop(image, (CROP_SIDE, CROP_SIDE, 3))
    image = tf.image.random_flip_left_right(image)
    return tf.cast(image, tf.float32) / 255.0, label


def compare(replicas: int, per_replica_batch: int, repeats: int) -> dict[str, Any]:
    """Examples/s from tfds on disk vs in-memory tensors, A/B by epoch; runs in a fresh process."""
    import mirrorkit as mk
    from mirrorkit.bench import measure, models

    strategy = mk.strategy("one_device") if replicas == 1 else mk.strategy(cpu_replicas=replicas)
    spec = models.get("cnn")
    global_batch = per_replica_batch * strategy.num_replicas_in_sync
    with tempfile.TemporaryDirectory(prefix="mirrorkit-bench-") as data_dir:
        builder = prepare(data_dir)
        steps = builder.info.splits["train"].num_examples // global_batch
        from_disk = mk.distribute(
            builder, strategy, global_batch_size=global_batch, split="train", preprocess=augment
        )
        example = models.synthetic_example(spec)
        in_memory = mk.distribute(  # the same model input, made once and held in memory
            lambda context: tf.data.Dataset.from_tensors(example).repeat(steps * global_batch),
            strategy,
            global_batch_size=global_batch,
        )
        disk_model = mk.build(lambda: models.compiled(spec), strategy)
        memory_model = mk.build(lambda: models.compiled(spec), strategy)
        rates: dict[str, list[float]] = {"tfds": [], "memory": []}
        for round_ in range(repeats + 1):
            for key, model, data in (
                ("memory", memory_model, in_memory),
                ("tfds", disk_model, from_disk),
            ):
                # Two epochs per call; the second one is timed, so the cost of starting fit()
                # is left out while every epoch's own start (iterator, shuffle buffer) counts.
                clock = measure.EpochClock()
                model.fit(data, epochs=2, verbose=0, callbacks=[clock])
                if round_ > 0:
                    rates[key].append(global_batch * steps / clock.epoch_times[1])
    memory, disk = statistics.median(rates["memory"]), statistics.median(rates["tfds"])
    return {
        "replicas": strategy.num_replicas_in_sync,
        "global_batch_size": global_batch,
        "steps_per_epoch": steps,
        "in_memory_examples_per_sec": memory,
        "tfds_examples_per_sec": disk,
        "ratio": disk / memory,
        "rates": rates,
    }
