"""Which worker (or replica) is a straggler, and how the report says it.

A worker is a straggler when its median own-work time per step (see
`StepClock`) exceeds the median of the other workers' by more than a factor
and by at least a number of seconds: a ratio alone would flag 5 ms against
2 ms, which slows no job down. The same rule finds a slow replica among the
replicas of one host (a GPU on a narrow PCIe link, a throttled one).
"""

from __future__ import annotations

import numpy as np

#: A straggler must also be this many seconds a step slower than the others' median.
STRAGGLER_MIN_GAP_S = 0.01


def find_straggler(
    medians: list[float], factor: float, min_gap_s: float = STRAGGLER_MIN_GAP_S
) -> int | None:
    """The worker slower than the others' median by more than `factor` and `min_gap_s`.

    Flagged when its median exceeds the median of the others' by more than
    `factor` and by at least `min_gap_s` seconds. The ratio is compared as
    the summary line shows it, to two decimals, so a worker shown at exactly
    ``1.20x`` is not flagged by a factor of 1.2. The gap keeps tiny medians
    from flagging a worker: 5 ms against 2 ms is 2.5x, but 3 ms a step slows
    no job down.

    Args:
        medians: every worker's median own-work seconds per step.
        factor: how many times the others' median the slowest must exceed.
        min_gap_s: how many seconds above the others' median it must also be.

    Example:
    ```python
    from mirrorkit.throughput.stragglers import find_straggler

    assert find_straggler([0.10, 0.11, 0.30], 1.2) == 2
    assert find_straggler([0.10, 0.11], 1.2) is None
    assert find_straggler([0.002, 0.005], 1.2) is None  # 2.5x, but only 3 ms
    ```
    """
    slowest = int(np.argmax(medians))
    others = [m for i, m in enumerate(medians) if i != slowest]
    if not others:
        return None
    typical = float(np.median(others))
    if round(medians[slowest] / typical, 2) > factor and medians[slowest] - typical >= min_gap_s:
        return slowest
    return None


def straggler_text(
    medians: list[float],
    worker: int,
    factor: float | None,
    min_gap_s: float | None,
    unit: str = "worker",
) -> str:
    """Names the straggler, its time against the others', and the rule that flagged it.

    Args:
        medians: every worker's (or replica's) median own-work seconds per step.
        worker: the straggler.
        factor: the straggler factor it was flagged by, if known.
        min_gap_s: the gap in seconds it was flagged by, if known.
        unit: what `medians` are of: ``"worker"`` or ``"replica"``.

    Example:
    ```python
    from mirrorkit.throughput.stragglers import straggler_text

    straggler_text([0.02, 0.2], 1, 1.5, 0.01)
    # 'worker 1 works 200.0 ms a step, the others 20.0 ms (10.00x) (flagged when over 1.5x and
    #  10 ms slower)'
    ```
    """
    others = float(np.median([m for i, m in enumerate(medians) if i != worker]))
    text = (
        f"{unit} {worker} works {medians[worker] * 1000:.1f} ms a step, the others "
        f"{others * 1000:.1f} ms ({medians[worker] / others:.2f}x)"
    )
    if factor is not None and min_gap_s is not None:
        text += f" (flagged when over {factor:g}x and {min_gap_s * 1000:g} ms slower)"
    return text
