"""Choosing and building a strategy: `mk.strategy()` and what it rests on.

`factory` is `mk.strategy()`: it checks its arguments (`arguments`), decides
what ``"auto"`` means here (`topology`), fixes this process's logical devices
(`devices`), builds TensorFlow's own strategy (`kinds`, with the all-reduce of
`allreduce`), and records it as the current one (`current`). A multi-worker strategy's wait
for its peers is bounded (`peer_wait`, with its watcher process
`_peer_wait_watcher`). `tf_logging` keeps TensorFlow's INFO log quiet in
notebooks.
"""
