"""`mk.ThroughputCallback`: examples/s per replica and per worker, and stragglers."""

from __future__ import annotations

import os
import time

import keras
import numpy as np
import tensorflow as tf

from mirrorkit import internals
from mirrorkit.cluster import chief
from mirrorkit.cluster import workers as workers_lib
from mirrorkit.number_checks import non_negative_int, positive_int
from mirrorkit.throughput import bottleneck, input_clock, replica_figures, scalars
from mirrorkit.throughput.baseline import read_baseline
from mirrorkit.throughput.report import EpochThroughput, ThroughputReport, summary_line
from mirrorkit.throughput.step_clock import StepClock
from mirrorkit.throughput.stragglers import (  # noqa: F401 (find_straggler: public here too)
    STRAGGLER_MIN_GAP_S,
    find_straggler,
    straggler_text,
)
from mirrorkit.training import step_hooks


class ThroughputCallback(keras.callbacks.Callback):
    """Measures training throughput per replica and per worker, and finds stragglers.

    Step times are the wall time between the ends of consecutive steps (Keras
    already waits for each step to finish, so this adds no device sync).
    Warm-up steps (tracing, first input) are skipped. At each epoch end the
    callback adds ``examples_per_sec`` and ``examples_per_sec_per_replica``
    to the logs (so they land in ``History`` and in every logger) and appends
    an `EpochThroughput` to ``.report``.

    With several replicas (on one host or across workers) each replica also
    times its own work in each step, inside the compiled step, read once an
    epoch: from the step's start until its gradients are ready
    for the all-reduce (its compute), then until the all-reduce ends (the
    transfer, and its wait for the slowest replica), then until the step
    ends (the update). At epoch end the workers exchange their replicas'
    medians with one collective. A replica (or worker) whose compute median
    exceeds the median of the others' by more than `straggler_factor` and by
    at least `straggler_min_gap_s` is flagged as slow. The slowest replica's
    medians over the median step time are the epoch's ``compute_share``,
    ``communication_share`` and ``update_share``: where a step's time goes.

    Input wait is measured per step inside the compiled step (see
    `input_clock`): the time until this worker's own batch is there, never
    the wait for the other workers in a multi-worker ``get_next``. The same
    collective exchanges the workers' input-wait shares, and the verdict
    uses the largest: a job waits for its slowest input pipeline.

    Args:
        log_every: also print a progress line every this many steps (chief,
            verbose 1); None prints only per epoch.
        warmup_steps: steps skipped at the start of training.
        tensorboard_dir: write the figures as TensorBoard scalars here (chief).
        json_path: write the whole report as JSON here after each epoch (chief).
        baseline: single-replica examples/s, as a number or the path of a
            JSON file written by ``mirrorkit bench``; turns per-replica
            throughput into scaling efficiency.
        straggler_factor: how much slower than the others a worker must be.
        straggler_min_gap_s: how many seconds a step slower than the others'
            median a worker must also be to be flagged (a ratio alone flags
            2 ms against 5 ms).
        global_batch_size: examples per step; read from the model's loss
            tracker after the first step when None.
        verbose: 0 silent, 1 one line per epoch (chief only).
        replica_timing: time each replica's compute, all-reduce and update
            inside the step (with several replicas). False leaves the step as
            Keras traced it: no per-replica figures, no slow replica, and a
            verdict from input wait and host work alone.

    Example:
    ```python
    import keras
    import numpy as np
    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def make_model():  # compiled inside the strategy's scope, by mk.build
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make_model, strategy)
    x, y = np.ones((4096, 8), "float32"), np.ones((4096, 1), "float32")
    throughput = mk.ThroughputCallback(warmup_steps=5)
    history = model.fit(mk.distribute((x, y), strategy, global_batch_size=64), epochs=2,
                        callbacks=[throughput])
    print(history.history["examples_per_sec"])
    print(throughput.report)
    ```
    """

    def __init__(
        self,
        log_every: int | None = None,
        warmup_steps: int = 5,
        tensorboard_dir: str | None = None,
        json_path: str | None = None,
        baseline: float | str | None = None,
        straggler_factor: float = 1.2,
        straggler_min_gap_s: float = STRAGGLER_MIN_GAP_S,
        global_batch_size: int | None = None,
        verbose: int = 1,
        replica_timing: bool = True,
    ):
        super().__init__()
        positive_int(log_every, "log_every", or_none=True)
        non_negative_int(warmup_steps, "warmup_steps")
        if straggler_factor <= 1:
            raise ValueError(f"straggler_factor must be above 1; got {straggler_factor!r}")
        if not straggler_min_gap_s >= 0:
            raise ValueError(
                "straggler_min_gap_s must be a non-negative number of seconds; "
                f"got {straggler_min_gap_s!r}"
            )
        if tensorboard_dir is not None:
            scalars.require_tensorboard()
        self.log_every = log_every
        self.warmup_steps = warmup_steps
        self.tensorboard_dir = tensorboard_dir
        self.json_path = json_path
        self.baseline = read_baseline(baseline)
        self.straggler_factor = straggler_factor
        self.straggler_min_gap_s = straggler_min_gap_s
        self.global_batch_size = global_batch_size
        self.verbose = verbose
        self.replica_timing = replica_timing
        self.report = ThroughputReport(
            0, 1, global_batch_size, self.baseline, straggler_factor, straggler_min_gap_s
        )
        self._clock = StepClock()
        self._input_clock = input_clock.InputClock()
        self._writer = None
        self._steps_seen = 0
        self._epoch_steps = 0

    # Keras hooks

    def set_model(self, model: keras.Model) -> None:
        """Instruments the model's step under several replicas (see `StepClock`)."""
        super().set_model(model)
        strategy = model.distribute_strategy
        several = strategy.num_replicas_in_sync > 1 or workers_lib.num_workers(strategy) > 1
        if several and self.replica_timing and not self._clock.installed:
            if not self._clock.install(model):
                chief.say_once(
                    "throughput-no-clock",
                    "ThroughputCallback: the optimizer has no gradient all-reduce to time; "
                    "slow replicas and stragglers cannot be told apart",
                )

    def on_train_begin(self, logs: dict | None = None) -> None:
        """Starts a new report and the input clock (`on_train_end` removes it).

        Installed here, not in `set_model`: `evaluate` and `predict` set the model too and
        never call `on_train_end`, so an input clock installed there stayed in place.
        """
        self._input_clock.install()
        strategy = self.model.distribute_strategy
        self.report = ThroughputReport(
            strategy.num_replicas_in_sync,
            workers_lib.num_workers(self.model.distribute_strategy),
            self.global_batch_size,
            self.baseline,
            self.straggler_factor,
            self.straggler_min_gap_s,
        )
        self._steps_seen = 0
        self._time_train_function()
        if self.tensorboard_dir and chief.is_chief() and self._writer is None:
            self._writer = tf.summary.create_file_writer(self.tensorboard_dir)

    def on_epoch_begin(self, epoch: int, logs: dict | None = None) -> None:
        """Starts the epoch's clock."""
        self._epoch_start = self._last = time.perf_counter()
        self._step_times: list[float] = []
        self._host_times: list[float] = []
        self._inside_s = 0.0
        self._calls = 0
        self._epoch_steps = 0
        self._input_clock.recording = True

    def on_test_begin(self, logs: dict | None = None) -> None:
        """Stops timing input while Keras evaluates (validation inside ``fit``)."""
        self._input_clock.recording = False

    def on_test_end(self, logs: dict | None = None) -> None:
        """Times the train function's input again."""
        self._input_clock.recording = True

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        """Records the step's wall time; prints progress every `log_every` steps."""
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        inside, self._inside_s = self._inside_s, 0.0
        steps = self._steps_per_call()
        self._steps_seen += steps
        self._epoch_steps += steps
        self._calls += 1
        if self.report.global_batch_size is None:
            self.report.global_batch_size = self._batch_from_loss_tracker(steps)
        if self._steps_seen > self.warmup_steps and self._calls > 1:
            self._step_times += [elapsed / steps] * steps
            self._host_times += [max(elapsed - inside, 0.0) / steps] * steps
        if (
            self.log_every
            and self.verbose
            and self._steps_seen % self.log_every < steps
            and self._step_times
        ):
            rate = self._rate(np.array(self._step_times[-self.log_every :]))
            chief.print(
                f"step {self._steps_seen}: {rate:,.1f} examples/s "
                f"({rate / self.report.num_replicas:,.1f} per replica)"
            )

    def on_epoch_end(self, epoch: int, logs: dict | None = None) -> None:
        """Computes the epoch's figures, adds them to `logs`, reports on the chief."""
        times = np.array(self._step_times)
        waits = self._input_clock.read_new()
        own_wait = input_clock.wait_share(waits, times) if self._steps_per_call() == 1 else None
        own_host = float(np.sum(self._host_times) / times.sum()) if times.sum() > 0 else None
        first_of_fit = not self.report.epochs
        medians = None
        if self._clock.installed:  # the warm-up steps of a fit's first epoch are left out
            skip = self.warmup_steps if first_of_fit else 0
            medians = replica_figures.local_medians(self._clock.read_new(), skip)
        medians, worker_waits, worker_hosts = self._gather_worker_figures(
            medians, own_wait, own_host
        )
        if times.size == 0:
            return
        figures = self._figures(epoch + 1, times, [])
        if medians is not None:
            batch = self.report.global_batch_size
            replica_figures.fill(
                figures,
                medians,
                self.report.num_workers,
                batch / self.report.num_replicas if batch else None,
                self.straggler_factor,
                self.straggler_min_gap_s,
            )
        figures.input_wait_share, figures.host_share = own_wait, own_host
        waiting_worker = host_worker = None
        if worker_waits and None not in worker_waits:
            figures.worker_input_wait_share = worker_waits
            waiting_worker = int(np.argmax(worker_waits))
            figures.input_wait_share = worker_waits[waiting_worker]
        if worker_hosts and None not in worker_hosts:
            figures.worker_host_share = worker_hosts
            host_worker = int(np.argmax(worker_hosts))
            figures.host_share = worker_hosts[host_worker]
        figures.dispatch_share = replica_figures.dispatch_share(figures)
        figures.verdict = bottleneck.verdict(
            figures.input_wait_share,
            figures.compute_share,
            waiting_worker,
            communication_share=figures.communication_share,
            replica_wait_share=figures.replica_wait_share,
            dispatch_share=figures.dispatch_share,
            host_share=figures.host_share,
            host_worker=host_worker,
            # The first epoch of each fit (epoch 0, or where a resume starts) traces the step.
            epoch_overhead_share=None if first_of_fit else figures.epoch_overhead_share,
        )
        self.report.epochs.append(figures)
        if logs is not None:
            logs["examples_per_sec"] = figures.examples_per_sec
            logs["examples_per_sec_per_replica"] = figures.examples_per_sec_per_replica
        if not chief.is_chief():
            return
        if self.verbose:
            chief.print(summary_line(figures, self.report))
        if self._writer is not None:
            scalars.write(self._writer, figures)
        if self.json_path:
            directory = os.path.dirname(self.json_path)
            if directory:
                os.makedirs(directory, exist_ok=True)
            with open(self.json_path, "w") as f:
                f.write(self.report.to_json())

    def on_train_end(self, logs: dict | None = None) -> None:
        """Removes the step instrumentation and flushes TensorBoard."""
        step_hooks.remove(self.model, self._timer)
        self._input_clock.uninstall()
        self._clock.uninstall()
        if self._writer is not None:
            self._writer.flush()

    # Figures

    def _figures(
        self, epoch: int, times: np.ndarray, worker_medians: list[float]
    ) -> EpochThroughput:
        report = self.report
        rate = self._rate(times)
        per_replica = rate / report.num_replicas
        figures = EpochThroughput(
            epoch=epoch,
            steps=int(times.size),
            examples_per_sec=rate,
            examples_per_sec_per_replica=per_replica,
            examples_per_sec_per_worker=rate / report.num_workers,
            step_time_median_s=float(np.median(times)),
            step_time_p90_s=float(np.percentile(times, 90)),
            step_time_max_s=float(times.max()),
            epoch_time_s=time.perf_counter() - self._epoch_start,
            scaling_efficiency=None if not self.baseline else per_replica / self.baseline,
        )
        if report.global_batch_size and figures.epoch_time_s > 0 and rate > 0:
            examples = self._epoch_steps * report.global_batch_size
            figures.epoch_examples_per_sec = examples / figures.epoch_time_s
            figures.epoch_overhead_share = max(0.0, 1 - figures.epoch_examples_per_sec / rate)
        if len(worker_medians) > 1 and min(worker_medians) > 0:
            figures.worker_compute_median_s = worker_medians
            figures.slowest_worker = int(np.argmax(worker_medians))
            figures.spread = max(worker_medians) / min(worker_medians)
            figures.straggler = find_straggler(
                worker_medians, self.straggler_factor, self.straggler_min_gap_s
            )
            figures.compute_share = max(worker_medians) / figures.step_time_median_s
        return figures

    def _rate(self, times: np.ndarray) -> float:
        batch = self.report.global_batch_size or 0
        return float(batch * times.size / times.sum()) if times.sum() > 0 else 0.0

    def _steps_per_call(self) -> int:
        return int(getattr(self.model, "steps_per_execution", 1) or 1)

    def _batch_from_loss_tracker(self, steps: int) -> int | None:
        if not hasattr(self.model, "_loss_tracker"):
            internals.warn(
                "keras Trainer._loss_tracker",
                "ThroughputCallback reading the global batch size (pass global_batch_size=)",
            )
            return None
        tracker = self.model._loss_tracker
        count = getattr(tracker, "count", None)
        if tracker is not None and count is None:
            internals.warn(
                "keras Trainer._loss_tracker.count",
                "ThroughputCallback reading the global batch size (pass global_batch_size=)",
                "it has no count",
            )
        if count is None:
            return None
        return int(round(float(keras.ops.convert_to_numpy(count)) / max(self._calls, 1) / steps))

    def _time_train_function(self) -> None:
        """Times each call of Keras's compiled train function: the rest of a step is host work.

        The timer has its place in the model's step chain (`step_hooks.PLACES`):
        around `NaNGuard`'s verdict, inside a resumed epoch's skipped steps, in
        whatever order the callbacks are listed; a re-trace keeps it.
        """

        def timed(call_next, *args, **kwargs):
            start = time.perf_counter()
            try:
                return call_next(*args, **kwargs)
            finally:
                self._inside_s += time.perf_counter() - start

        self._timer = step_hooks.StepHook("throughput.timer", timed)
        step_hooks.register(self.model, self._timer)

    def _gather_worker_figures(
        self, medians: np.ndarray | None, input_wait: float | None, host: float | None
    ) -> tuple[np.ndarray | None, list[float | None], list[float | None]]:
        """Every replica's interval medians, and every worker's input-wait and host shares.

        One collective across workers (none on one worker): each worker sends its own
        replicas' medians (`replica_figures.local_medians`) and its two shares.

        Returns:
            The medians of every replica in global order (shape (replicas, intervals); None
            without a clock), and the workers' input-wait and host shares (empty on one).
        """
        workers = self.report.num_workers
        if workers < 2 or medians is None:
            return medians, [], []
        shares = [-1.0 if v is None else v for v in (input_wait, host)]  # none: -1
        table = workers_lib.gather(self.model.distribute_strategy, [*medians.ravel(), *shares])
        return (
            table[:, :-2].reshape(-1, medians.shape[1]),
            [None if v < 0 else float(v) for v in table[:, -2]],
            [None if v < 0 else float(v) for v in table[:, -1]],
        )
