"""Fault tolerance: hung steps, restart, preemption.

(A multi-worker strategy's bounded wait for its peers at start-up is
`mirrorkit.strategies.peer_wait`.)

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
