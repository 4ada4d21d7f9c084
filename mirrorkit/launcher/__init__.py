"""Starting worker processes: `mk.launch` for notebooks, `mirrorkit launch` for scripts."""
