"""Fault tolerance beyond start-up and hangs: restart, preemption, rescale.

`mirrorkit.startup` bounds the wait for peers, `mirrorkit.watchdog` ends a step
that never completes. Here:

- `restart`: `mirrorkit launch --max-restarts N` relaunches a whole job whose
  worker failed, N times at each failing step, saying where and what is redone;
- `backup`: `mk.resumable(dir)`, Keras's `BackupAndRestore` set up for that;
- `progress`: where a failed job was, read by the launcher;
- `preemption`: `mk.PreemptionCheckpoint`, a checkpoint at one step boundary on
  SIGTERM, resumed at that step on any number of workers.
"""
