"""Per-replica throughput, step times and stragglers: `mk.ThroughputCallback`."""
