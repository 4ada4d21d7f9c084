"""`ThroughputReport`: what a `ThroughputCallback` measured, per epoch."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from mirrorkit.throughput import turned_table
from mirrorkit.throughput.stragglers import straggler_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: Columns of the text and HTML tables: (key, heading, format).
#: Verdicts that name a fix; every other epoch is summed up in one line.
_ACTIONABLE = (
    "input-bound",
    "host-bound",
    "epoch-overhead",
    "communication-bound",
    "dispatch-bound",
)
_COLUMNS = (
    ("epoch", "epoch", "{:d}"),
    ("examples_per_sec", "examples/s", "{:,.1f}"),
    ("epoch_examples_per_sec", "end to end/s", "{:,.1f}"),
    ("examples_per_sec_per_replica", "per replica", "{:,.1f}"),
    ("examples_per_sec_per_worker", "per worker", "{:,.1f}"),
    ("step_time_median_s", "step median ms", "ms"),
    ("step_time_p90_s", "step p90 ms", "ms"),
    ("step_time_max_s", "step max ms", "ms"),
    ("epoch_time_s", "epoch s", "{:.2f}"),
    ("scaling_efficiency", "efficiency", "{:.3f}"),
    ("slowest_worker", "slowest worker", "{}"),
    ("slowest_replica", "slowest replica", "{}"),
    ("compute_share", "compute share", "{:.2f}"),
    ("communication_share", "all-reduce share", "{:.2f}"),
    ("input_wait_share", "input wait", "{:.2f}"),
    ("host_share", "host", "{:.2f}"),
    ("straggler", "straggler", "{}"),
)


@dataclasses.dataclass
class EpochThroughput:
    """Throughput figures of one epoch (warm-up steps excluded).

    Attributes:
        epoch: the epoch number, from 1.
        steps: steps measured.
        examples_per_sec: global examples per second.
        examples_per_sec_per_replica: the same per replica.
        examples_per_sec_per_worker: the same per worker.
        step_time_median_s: median wall time of a step.
        step_time_p90_s: 90th percentile of the step time.
        step_time_max_s: slowest step.
        epoch_time_s: the epoch's wall time, warm-up included.
        epoch_examples_per_sec: the epoch end to end: every training example
            it took (warm-up steps included) over `epoch_time_s`, which also
            holds tracing, iterator start-up, validation and epoch-end
            callbacks. `examples_per_sec` is the steady state of its steps.
        epoch_overhead_share: the share of `epoch_time_s` that its steps at
            the steady rate do not explain: ``1 - epoch_examples_per_sec /
            examples_per_sec``.
        worker_compute_median_s: each worker's median time from the start of
            a step until its gradients were ready for the all-reduce (its own
            work, without waiting for the others), in worker order.
        slowest_worker: the worker with the largest compute median.
        spread: slowest / fastest worker compute median.
        straggler: the worker whose compute median exceeds the median of the
            others' by more than the straggler factor, else None.
        replica_compute_median_s: each replica's median time from the start
            of a step until its gradients were ready (its forward and backward
            pass), in global replica order (worker 0's replicas first); empty
            with one replica.
        replica_all_reduce_median_s: each replica's median time from its
            gradients ready to the all-reduce's end: the transfer, and a
            faster replica's wait for the slowest.
        replica_update_median_s: each replica's median time from the
            all-reduce's end to the end of its step (the optimizer's update).
        replica_examples_per_sec: each replica's own rate: its part of the
            global batch over its compute and update time, the rate it would
            reach if it never waited for the others.
        slowest_replica: the replica with the largest compute median (None
            with one replica a worker: the worker figures say it).
        replica_spread: slowest / fastest replica compute median.
        slow_replica: the replica whose compute median exceeds the median of
            the others' by more than the straggler factor and gap, else None.
        compute_share: the slowest replica's compute median over the median
            step time: the share of a step that is the forward and backward
            pass.
        communication_share: the shortest all-reduce median of any replica over
            the median step time (the replica that reaches the all-reduce last
            waits for nobody: the transfer alone).
        update_share: the slowest replica's update median over the median
            step time.
        replica_wait_share: the rest of the longest replica's step (its
            compute, all-reduce and update) over the median step time: the
            replicas start their steps, or reach the all-reduce, apart. The
            compute, communication, update, wait, input-wait and host shares
            add up to about a step.
        dispatch_share: what they leave of a step: the strategy's own work
            (starting each replica's step, reducing the logs).
        scaling_efficiency: per-replica examples/s over the single-replica
            baseline, when a baseline was given.
        input_wait_share: the share of step time spent waiting for the
            input batch, measured per step (see `input_clock`); in a
            multi-worker job the largest of the workers' shares.
        worker_input_wait_share: each worker's own input-wait share, in
            worker order (multi-worker jobs): its wait for its own batch,
            never the wait for the other workers.
        host_share: the share of step time spent outside Keras's compiled
            train function (callbacks, logging, Python between steps); in a
            multi-worker job the largest of the workers' shares.
        worker_host_share: each worker's host share, in worker order.
        verdict: one line: input-, communication- or compute-bound, and
            the fix to try (see `bottleneck`).
    """

    epoch: int
    steps: int
    examples_per_sec: float
    examples_per_sec_per_replica: float
    examples_per_sec_per_worker: float
    step_time_median_s: float
    step_time_p90_s: float
    step_time_max_s: float
    epoch_time_s: float
    epoch_examples_per_sec: float | None = None
    epoch_overhead_share: float | None = None
    worker_compute_median_s: list[float] = dataclasses.field(default_factory=list)
    slowest_worker: int | None = None
    spread: float | None = None
    straggler: int | None = None
    replica_compute_median_s: list[float] = dataclasses.field(default_factory=list)
    replica_all_reduce_median_s: list[float] = dataclasses.field(default_factory=list)
    replica_update_median_s: list[float] = dataclasses.field(default_factory=list)
    replica_examples_per_sec: list[float] = dataclasses.field(default_factory=list)
    slowest_replica: int | None = None
    replica_spread: float | None = None
    slow_replica: int | None = None
    compute_share: float | None = None
    communication_share: float | None = None
    update_share: float | None = None
    replica_wait_share: float | None = None
    dispatch_share: float | None = None
    scaling_efficiency: float | None = None
    input_wait_share: float | None = None
    worker_input_wait_share: list[float] = dataclasses.field(default_factory=list)
    host_share: float | None = None
    worker_host_share: list[float] = dataclasses.field(default_factory=list)
    verdict: str | None = None


@dataclasses.dataclass
class ThroughputReport:
    """Everything a `ThroughputCallback` measured in one ``fit``.

    Attributes:
        num_replicas: replicas in sync.
        num_workers: workers in the job.
        global_batch_size: examples per step.
        baseline_examples_per_sec: single-replica examples/s, if given.
        straggler_factor: a straggler's compute median exceeds the others'
            by more than this factor ...
        straggler_min_gap_s: ... and by at least this many seconds.
        epochs: one `EpochThroughput` per epoch.
    """

    num_replicas: int
    num_workers: int
    global_batch_size: int | None
    baseline_examples_per_sec: float | None = None
    straggler_factor: float | None = None
    straggler_min_gap_s: float | None = None
    epochs: list[EpochThroughput] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """The report as plain JSON-ready data."""
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The report as JSON text."""
        return json.dumps(self.to_dict(), indent=2)

    def _rows(self) -> list[list[str]]:
        rows = []
        for epoch in self.epochs:
            row = []
            for key, _, fmt in _COLUMNS:
                value = getattr(epoch, key)
                if value is None:
                    row.append("-")
                elif fmt == "ms":
                    row.append(f"{value * 1000:.1f}")
                else:
                    row.append(fmt.format(value))
            rows.append(row)
        return rows

    def _columns(self) -> list[int]:
        """Indices of the columns worth showing (multi-worker and baseline ones only if used)."""
        keep = []
        for i, (key, _, _) in enumerate(_COLUMNS):
            if key in ("slowest_worker", "straggler") and self.num_workers < 2:
                continue
            if key in ("slowest_replica", "compute_share", "communication_share") and not any(
                getattr(e, key) is not None for e in self.epochs
            ):
                continue
            if key == "scaling_efficiency" and self.baseline_examples_per_sec is None:
                continue
            keep.append(i)
        return keep

    def __str__(self) -> str:
        """The report as text: a figure per row, an epoch per column, then the verdicts.

        At most `turned_table.TEXT_EPOCHS` epochs are columns (the first and the last ones,
        and a line names those left out), so that the report fits 80 columns.
        """
        return turned_table.text(self._title(), *self._turned(), self._verdict_lines())

    def _title(self) -> str:
        return (
            f"Throughput: {self.num_replicas} replicas on {self.num_workers} worker(s), "
            f"global batch {self.global_batch_size}"
        )

    def _turned(self) -> tuple[list[int], list[tuple[str, list[str]]]]:
        """The epochs, and each figure shown with its value per epoch."""
        keep = [i for i in self._columns() if _COLUMNS[i][0] != "epoch"]
        rows = self._rows()
        figures = [(_COLUMNS[i][1], [row[i] for row in rows]) for i in keep]
        return [epoch.epoch for epoch in self.epochs], figures

    def _verdict_lines(self) -> list[str]:
        """A line per epoch with a bottleneck to fix; the calm epochs in one line."""
        judged = [e for e in self.epochs if e.verdict]
        bound = [e for e in judged if e.verdict.startswith(_ACTIONABLE)]
        calm = [e for e in judged if e not in bound]
        lines = []
        for run in _runs_of_one_kind(bound):  # consecutive epochs with the same bottleneck
            if len(run) == 1:
                lines.append(f"epoch {run[0].epoch}: {run[0].verdict}")
            else:
                lines.append(
                    f"epochs {run[0].epoch}-{run[-1].epoch} ({len(run)} epochs): "
                    f"{_kind(run[-1].verdict)}; epoch {run[-1].epoch}: {run[-1].verdict}"
                )
        lines += [
            f"epoch {e.epoch}: straggler: {self._straggler(e)}"
            for e in self.epochs
            if e.straggler is not None and e.worker_compute_median_s
        ]
        lines += [
            f"epoch {e.epoch}: slow replica: {self._slow_replica(e)}"
            for e in self.epochs
            if e.slow_replica is not None and e.replica_compute_median_s
        ]
        if len(calm) == 1:
            lines.append(f"epoch {calm[0].epoch}: {calm[0].verdict}")
        elif calm:
            lines.append(
                f"epochs {calm[0].epoch}-{calm[-1].epoch} ({len(calm)} epochs): no bottleneck "
                f"to fix; epoch {calm[-1].epoch}: {calm[-1].verdict}"
            )
        return lines

    def _straggler(self, epoch: EpochThroughput) -> str:
        return straggler_text(
            epoch.worker_compute_median_s,
            epoch.straggler,
            self.straggler_factor,
            self.straggler_min_gap_s,
        )

    def _slow_replica(self, epoch: EpochThroughput) -> str:
        return straggler_text(
            epoch.replica_compute_median_s,
            epoch.slow_replica,
            self.straggler_factor,
            self.straggler_min_gap_s,
            unit="replica",
        )

    def _repr_html_(self) -> str:
        """For notebooks: a figure per row, an epoch per column, then the verdict lines."""
        return turned_table.html(self._title(), *self._turned(), self._verdict_lines())

    def plot(self, path: str | None = None) -> Figure:
        """Plots examples/s and step times per epoch with matplotlib.

        Args:
            path: also save the figure there (PNG, SVG, ... by extension).

        Returns:
            The matplotlib ``Figure``.
        """
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        epochs = [e.epoch for e in self.epochs]
        replicas = [e for e in self.epochs if e.replica_compute_median_s]
        panels = 3 if replicas else 2
        figure, axes_row = plt.subplots(1, panels, figsize=(5 * panels, 3.5))
        rate, steps = axes_row[0], axes_row[1]
        rate.plot(epochs, [e.examples_per_sec for e in self.epochs], marker="o", label="global")
        rate.plot(
            epochs,
            [e.examples_per_sec_per_replica for e in self.epochs],
            marker="o",
            label="per replica",
        )
        rate.set(xlabel="epoch", ylabel="examples/s", title="Throughput")
        rate.legend()
        for key, label in (("step_time_median_s", "median"), ("step_time_p90_s", "p90")):
            steps.plot(
                epochs, [getattr(e, key) * 1000 for e in self.epochs], marker="o", label=label
            )
        steps.set(xlabel="epoch", ylabel="ms", title="Step time")
        steps.legend()
        if replicas:  # each replica's own work and its all-reduce, in the last epoch measured
            last, per_replica = replicas[-1], axes_row[2]
            index = list(range(len(last.replica_compute_median_s)))
            compute = [v * 1000 for v in last.replica_compute_median_s]
            reduce = [v * 1000 for v in last.replica_all_reduce_median_s]
            per_replica.bar(index, compute, label="compute")
            per_replica.bar(index, reduce, bottom=compute, label="all-reduce (and wait)")
            per_replica.set(xlabel="replica", ylabel="ms", title=f"Per replica, epoch {last.epoch}")
            per_replica.set_xticks(index)  # one tick a replica: no -0.25 or 0.5
            tallest = max((c + r for c, r in zip(compute, reduce, strict=True)), default=0.0)
            per_replica.set_ylim(0, tallest * 1.35 or 1.0)  # room for the legend above the bars
            per_replica.legend(loc="upper center", ncol=2)
        for axes in axes_row[:2]:  # whole epochs only: no 1.5 between epoch 1 and 2
            axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        figure.tight_layout()
        if path is not None:
            figure.savefig(path)
        return figure


def _kind(verdict: str) -> str:
    """A verdict's kind: the words before its first colon ("input-bound", "epoch-overhead")."""
    return verdict.split(":", 1)[0]


def _runs_of_one_kind(epochs: list[EpochThroughput]) -> list[list[EpochThroughput]]:
    """`epochs` cut into runs of consecutive epochs whose verdicts are of one kind."""
    runs: list[list[EpochThroughput]] = []
    for epoch in epochs:
        last = runs[-1][-1] if runs else None
        if last and last.epoch + 1 == epoch.epoch and _kind(last.verdict) == _kind(epoch.verdict):
            runs[-1].append(epoch)
        else:
            runs.append([epoch])
    return runs


def summary_line(figures: EpochThroughput, report: ThroughputReport) -> str:
    """The line the callback prints at each epoch's end: rates, step times, verdict."""
    line = (
        f"epoch {figures.epoch}: {figures.examples_per_sec:,.1f} examples/s "
        f"({figures.examples_per_sec_per_replica:,.1f} per replica x {report.num_replicas}), "
        f"step {figures.step_time_median_s * 1000:.1f} ms median, "
        f"{figures.step_time_p90_s * 1000:.1f} ms p90"
    )
    if figures.epoch_examples_per_sec is not None:
        line += f"; {figures.epoch_examples_per_sec:,.1f} examples/s end to end"
    if figures.scaling_efficiency is not None:
        line += f", scaling efficiency {figures.scaling_efficiency:.2f}"
    if figures.slowest_replica is not None and figures.compute_share is not None:
        line += (
            f"; slowest replica {figures.slowest_replica} (spread {figures.replica_spread:.2f}x)"
            f" computes {figures.compute_share:.0%} of a step, all-reduces "
            f"{figures.communication_share:.0%}"
        )
        if figures.slow_replica is not None:
            said = straggler_text(
                figures.replica_compute_median_s,
                figures.slow_replica,
                report.straggler_factor,
                report.straggler_min_gap_s,
                unit="replica",
            )
            line += f"; SLOW REPLICA: {said}"
    if figures.worker_compute_median_s:
        line += (
            f"; slowest worker {figures.slowest_worker} (spread {figures.spread:.2f}x), "
            f"computing {figures.compute_share:.0%} of a step"
        )
        if figures.straggler is not None:
            said = straggler_text(
                figures.worker_compute_median_s,
                figures.straggler,
                report.straggler_factor,
                report.straggler_min_gap_s,
            )
            line += f"; STRAGGLER: {said}"
    if figures.verdict:
        line += f"\n  {figures.verdict}"
    return line
