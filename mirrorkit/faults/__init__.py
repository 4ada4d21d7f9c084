"""Fault tolerance beyond start-up and hangs: restarting a failed job.

`mirrorkit.startup` bounds the wait for peers, `mirrorkit.watchdog` ends a step
that never completes; `mirrorkit.faults.restart` relaunches a whole job whose
worker failed, for `mirrorkit launch --max-restarts N`.
"""
