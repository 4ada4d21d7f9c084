"""`mirrorkit bench`: throughput, scaling efficiency and all-reduce bandwidth on your hardware."""
