"""The job this process belongs to: TF_CONFIG, Slurm and the platforms; workers; chief.

`cluster_info` answers "who am I in the job" (task count, type, rank, chief
first) from TF_CONFIG or a Slurm step (`slurm`), with what Kubeflow, Vertex AI
and SageMaker write beside it (`platforms`); `tf_config` writes each worker's
TF_CONFIG; `workers` gives a strategy's worker count and rank; `chief` keeps
side effects on the chief; `legacy_keras` handles ``TF_USE_LEGACY_KERAS``.
No module here imports TensorFlow at import time.
"""
