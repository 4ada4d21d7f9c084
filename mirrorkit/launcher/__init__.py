"""Starting worker processes: one function, `local_job.run_job`, for every caller.

`mk.launch` (notebooks), `mirrorkit launch` (scripts), `mirrorkit bench` and
the test suite all start their workers through it.
"""
