"""`mirrorkit demo`: the main job, a data-parallel image classifier on real data.

The UCI handwritten digits (1,797 8x8 images, CC BY 4.0, see
``mirrorkit/demo/data/README.md``) ship inside the package, so the demo needs
no network: ``mirrorkit demo`` trains a small convolutional network on
simulated CPU replicas (all GPUs where there are any), prints the topology,
the per-epoch metrics and the throughput report, and then the test accuracy.
``--dataset NAME`` trains on any tfds image data set already prepared on disk.

Modules: `data` (the bundled digits, tfds data sets), `train` (model and
training, run in a fresh process), `command` (the CLI).
"""
