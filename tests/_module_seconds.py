"""Seconds per test module from a run's ``--durations=0`` report: the order xdist hands them out.

``tests/conftest.py``'s scheduler hands the modules to its two processes longest first, so that
no long module starts last while the other process has nothing left to do (xdist's own order,
by number of tests, left modules of one or two long tests for the end). The numbers only
order the work; a module missing from the file counts as the median. To measure them again::

    python -m pytest -q -p no:cacheprovider --durations=0 > run.txt
    python tests/_module_seconds.py run.txt > tests/module_seconds.json
"""

from __future__ import annotations

import collections
import json
import re
import sys

_LINE = re.compile(r"^\s*([\d.]+)s (?:setup|call|teardown)\s+(tests/[^:\s]+)::")


def module_seconds(report: str) -> dict[str, float]:
    """Each module's summed setup, call and teardown seconds in a ``--durations=0`` report."""
    seconds: dict[str, float] = collections.defaultdict(float)
    for line in report.splitlines():
        match = _LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
    return {path: round(s, 1) for path, s in sorted(seconds.items(), key=lambda kv: -kv[1])}


if __name__ == "__main__":
    with open(sys.argv[1]) as report:
        print(json.dumps(module_seconds(report.read()), indent=1))
