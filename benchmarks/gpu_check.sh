#!/usr/bin/env bash
# mirrorkit on GPUs, in under 8 minutes, into one JSON:
#   mirrorkit info; tests/test_gpu.py (1 vs N GPU replicas, NCCL all-reduce);
#   mirrorkit bench --allreduce and an NCCL all-reduce between GPU replicas;
#   ResNet-50 (weights=None, synthetic images): mirrorkit vs plain Keras + MirroredStrategy;
#   mixed_float16 vs float32.
# Usage: benchmarks/gpu_check.sh [OUT.json]     (default gpu_check.json)
#        benchmarks/gpu_check.sh --smoke [OUT]  (every part on the CPU, tiny sizes)
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=()
if [[ "${1:-}" == "--smoke" ]]; then smoke=(--smoke); shift; fi
out="${1:-gpu_check.json}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
if [[ ${#smoke[@]} -eq 0 ]] && ! command -v nvidia-smi >/dev/null; then
  echo "gpu_check.sh: no nvidia-smi here; this check is for a machine with GPUs (--smoke runs it on the CPU)" >&2
  exit 2
fi
limit=(timeout 480)  # the 8 minutes; the CPU smoke run takes what it takes
if [[ ${#smoke[@]} -gt 0 ]]; then limit=(); fi
exec "${limit[@]}" "${PYTHON:-python}" benchmarks/gpu_check.py "${smoke[@]}" --out "$out"
