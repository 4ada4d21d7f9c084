"""The `mirrorkit` command: one module per subcommand.

`cli` is the entry point; `info`, `launch`, `bench`, `demo` and `plan` each own
one subcommand's flags and what it prints.
"""
