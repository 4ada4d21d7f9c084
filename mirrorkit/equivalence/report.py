"""`EquivalenceReport`: what `mk.check_equivalence` found, readable in a terminal and a notebook."""

from __future__ import annotations

import dataclasses
import html


@dataclasses.dataclass
class EquivalenceReport:
    """Whether a model trains the same on several replica counts, and why not.

    Attributes:
        passed: every replica count matched the reference within `tolerance`,
            and the reference matched itself when trained twice.
        reference: the replica count the others are compared with.
        replicas: every replica count trained, the reference first.
        steps: optimizer steps trained on each.
        global_batch_size: examples per step, the same for every count.
        tolerance: the largest absolute difference accepted.
        differences: ``differences[n][layer]``: the largest absolute
            difference between layer ``layer``'s weights after training on
            ``n`` replicas and on the reference.
        rerun_difference: the largest difference between two runs of the
            reference from the same weights and batches (non-determinism).
        causes: the recognised causes of a difference, one line each (empty
            when it passed).
        log_differences: ``log_differences[n][name]``: the relative difference
            between the last logged value ``name`` (the loss, each metric)
            on ``n`` replicas and on the reference, for the values that
            differ by more than `tolerance` (empty when every log agrees).
    """

    passed: bool
    reference: int
    replicas: tuple[int, ...]
    steps: int
    global_batch_size: int
    tolerance: float
    differences: dict[int, dict[str, float]]
    rerun_difference: float
    causes: list[str]
    log_differences: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)

    def largest(self, replicas: int) -> float:
        """The largest difference over every layer for one replica count."""
        return max(self.differences[replicas].values(), default=0.0)

    def __str__(self) -> str:
        verdict = "PASSED" if self.passed else "FAILED"
        lines = [
            f"equivalence {verdict}: {self.steps} steps of global batch {self.global_batch_size} "
            f"on {', '.join(map(str, self.replicas))} replica(s), tolerance {self.tolerance:g}",
            f"  reference ({self.reference} replica(s)) trained twice: largest difference "
            f"{self.rerun_difference:.3g}",
        ]
        for n, layers in self.differences.items():
            mark = "ok" if self.largest(n) <= self.tolerance else "DIFFERS"
            lines.append(
                f"  {n} replicas vs {self.reference}: largest {self.largest(n):.3g} {mark}"
            )
            for layer, diff in layers.items():
                flag = "" if diff <= self.tolerance else "  <-"
                lines.append(f"    {layer:<32} {diff:.3g}{flag}")
        for n, logs in self.log_differences.items():
            for name, diff in logs.items():
                lines.append(
                    f"  {n} replicas vs {self.reference}: logged {name!r} differs by "
                    f"{diff:.3g} (relative)  <-"
                )
        if self.causes:
            lines.append("  likely causes:")
            lines.extend(f"  - {cause}" for cause in self.causes)
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        colour = "#1a7f37" if self.passed else "#cf222e"
        head = html.escape(str(self).splitlines()[0])
        rows = []
        for n, layers in self.differences.items():
            for layer, diff in layers.items():
                style = "" if diff <= self.tolerance else f' style="color:{colour}"'
                rows.append(
                    f"<tr><td>{n}</td><td>{html.escape(layer)}</td><td{style}>{diff:.3g}</td></tr>"
                )
        causes = "".join(f"<li>{html.escape(c)}</li>" for c in self.causes)
        return (
            f'<div><b style="color:{colour}">{head}</b>'
            f"<p>reference trained twice: largest difference {self.rerun_difference:.3g}</p>"
            "<table><tr><th>replicas</th><th>layer</th><th>largest difference</th></tr>"
            f"{''.join(rows)}</table>"
            + (f"<p>likely causes:</p><ul>{causes}</ul>" if causes else "")
            + "</div>"
        )
