"""Fault tolerance: start-up, hung steps, restart, preemption.

- `peer_wait` (with its watcher process `_peer_wait_watcher`): a multi-worker
  strategy never waits silently forever for its peers;
- `step_timeout`: a training step that never completes ends the worker;
- `restart`: `mirrorkit launch --max-restarts N` relaunches a whole job whose
  worker failed, N times at each failing step, saying where and what is redone;
- `backup` and `backup_pair`: `mk.resumable(dir)`, Keras's `BackupAndRestore`
  set up for that;
- `resume_point`: where a failed job was, read by the launcher;
- `preemption_checkpoint`: `mk.PreemptionCheckpoint`, a checkpoint at one step
  boundary on SIGTERM, resumed at that step on any number of workers;
- `preemption_relay`: the launcher's side of a preemption.
"""
