"""Does a user's model train the same on N replicas as on one device? `mk.check_equivalence`.

`check` trains the model on one device and on N replicas, each in a fresh process,
and compares; `report` is what it found (`EquivalenceReport`); `suspects` names
what in the model makes the two differ, found by inspection. It sits above
training: it builds and trains whole models with `mk.strategy` and `mk.build`.
"""
