"""Input pipelines distributed per replica: `mk.distribute` and its parts."""
