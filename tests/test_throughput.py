"""`mk.ThroughputCallback` and `ThroughputReport`.

The single-process tests read time from an injected clock that advances by
exactly `STEP_S` per training step, so their figures are exact whatever the
load on the machine. The multi-worker tests run on real time and assert on
behaviour with bounds wide enough for a loaded 2-core machine.
"""

import functools
import json
import types

import keras
import pytest
import tensorflow as tf
from _models import tiny_model
from _quoted import Quote, assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit.throughput import bottleneck
from mirrorkit.throughput import callback as callback_module
from mirrorkit.throughput import report as report_module
from mirrorkit.throughput.callback import find_straggler

GLOBAL_BATCH = 32
STEP_S = 0.05  # one training step, on the injected clock


class _StepClock(keras.callbacks.Callback):
    """A clock for the callback under test: it moves `STEP_S` per step, and only then."""

    def __init__(self):
        super().__init__()
        self.now = 1000.0

    def perf_counter(self):
        return self.now

    def on_train_batch_end(self, batch, logs=None):  # runs before the callback under test
        self.now += STEP_S


@pytest.fixture
def clock(monkeypatch):
    ticks = _StepClock()
    fake_time = types.SimpleNamespace(perf_counter=ticks.perf_counter)
    monkeypatch.setattr(callback_module, "time", fake_time)
    return ticks


def _batches(steps):
    """`steps` global batches of GLOBAL_BATCH examples."""

    def make(ids):
        x = tf.tile(tf.cast(ids, tf.float32)[:, None], [1, 4]) / (steps * GLOBAL_BATCH)
        return x, x[:, :1]

    batches = tf.data.Dataset.range(steps * GLOBAL_BATCH).batch(GLOBAL_BATCH, drop_remainder=True)
    return batches.map(make)


_model = functools.partial(tiny_model, 4)


def _fit(clock, callback, epochs=2, steps=12, replicas=2):
    strategy = mk.strategy(cpu_replicas=replicas)
    model = mk.build(_model, strategy)
    data = mk.distribute(_batches(steps), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    return model.fit(data, epochs=epochs, verbose=0, callbacks=[clock, callback])


def test_measured_rate_is_the_rate_of_the_clock(clock):
    callback = mk.ThroughputCallback(warmup_steps=2, verbose=0)
    history = _fit(clock, callback)
    true_rate = GLOBAL_BATCH / STEP_S  # one global batch per STEP_S
    for epoch in callback.report.epochs:
        assert epoch.examples_per_sec == pytest.approx(true_rate, rel=1e-9)
        assert epoch.examples_per_sec_per_replica == pytest.approx(true_rate / 2, rel=1e-9)
        assert epoch.step_time_median_s == pytest.approx(STEP_S, rel=1e-9)
        assert epoch.step_time_p90_s == pytest.approx(STEP_S, rel=1e-9)
        assert epoch.epoch_time_s == pytest.approx(12 * STEP_S, rel=1e-9)
        assert epoch.epoch_examples_per_sec == pytest.approx(true_rate, rel=1e-9)
        assert epoch.epoch_overhead_share == pytest.approx(0.0, abs=1e-9)
    # Warm-up: epoch 1 leaves out the first call and 2 warm-up steps, epoch 2 only its first call.
    assert [e.steps for e in callback.report.epochs] == [12 - 2, 12 - 1]
    assert history.history["examples_per_sec"] == [
        e.examples_per_sec for e in callback.report.epochs
    ]
    assert len(history.history["examples_per_sec_per_replica"]) == 2
    assert callback.report.global_batch_size == GLOBAL_BATCH  # read from Keras's loss tracker


def test_a_slow_step_moves_the_tail_not_the_median(clock):
    class OneSlowStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 7:
                clock.now += 10 * STEP_S

    callback = mk.ThroughputCallback(warmup_steps=2, verbose=0)
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    data = mk.distribute(_batches(12), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    model.fit(data, epochs=1, verbose=0, callbacks=[clock, OneSlowStep(), callback])
    (epoch,) = callback.report.epochs
    assert epoch.step_time_median_s == pytest.approx(STEP_S)
    assert epoch.step_time_max_s == pytest.approx(11 * STEP_S)
    assert epoch.examples_per_sec == pytest.approx(GLOBAL_BATCH * 10 / (20 * STEP_S))


def test_an_epoch_overhead_shows_end_to_end_and_in_the_verdict(clock, capfd):
    class SlowEpochStart(keras.callbacks.Callback):  # after the epoch clock starts
        def on_epoch_begin(self, epoch, logs=None):
            clock.now += 10 * STEP_S

    callback = mk.ThroughputCallback(warmup_steps=2)  # prints each epoch's line
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    data = mk.distribute(_batches(12), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    model.fit(data, epochs=2, verbose=0, callbacks=[clock, callback, SlowEpochStart()])
    first, second = callback.report.epochs
    assert second.examples_per_sec == pytest.approx(GLOBAL_BATCH / STEP_S)  # the steady steps
    assert second.epoch_examples_per_sec == pytest.approx(12 * GLOBAL_BATCH / (22 * STEP_S))
    assert second.epoch_overhead_share == pytest.approx(10 / 22)
    assert first.epoch_overhead_share == pytest.approx(10 / 22)
    # The injected clock stands still inside the train function, so these steps read as
    # host-bound, which the verdict puts first; the overhead verdict on real steps:
    assert second.verdict.startswith("host-bound")
    assert "end to end/s" in str(callback.report)
    # time that passes in a callback at each batch's end: the page's host-bound example
    quote = quoted_block("throughput.md", "A callback that sleeps 20 ms in `on_train_batch_end`")
    assert_quoted_in(quote, capfd.readouterr().out, figures_vary=True)
    assert bottleneck.verdict(0.05, None, host_share=0.1, epoch_overhead_share=10 / 22) == (
        "epoch-overhead: 45% of the epoch is outside its steady steps (iterator start-up, "
        "validation, epoch-end callbacks); train more steps per epoch (steps_per_epoch with "
        ".repeat()) or validate less often (validation_freq)"
    )
    assert bottleneck.verdict(0.05, None, host_share=0.1, epoch_overhead_share=0.2).startswith(
        "not input-bound"
    )


def test_time_outside_the_steady_steps_is_epoch_overhead(clock, capfd):
    """Steps whose time is inside Keras's compiled train function, and a pause at each epoch's
    start: epoch-overhead, from the second epoch of the fit on."""
    from mirrorkit.training import step_hooks

    def step(call_next, *args, **kwargs):  # inside the throughput timer (order 20)
        clock.now += STEP_S
        return call_next(*args, **kwargs)

    class SlowEpochStart(keras.callbacks.Callback):  # after the epoch clock starts
        def on_epoch_begin(self, epoch, logs=None):
            clock.now += 10 * STEP_S

    callback = mk.ThroughputCallback(warmup_steps=2)  # prints each epoch's line
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    step_hooks.register(model, step_hooks.StepHook("test.step", step, stage="call", order=90))
    data = mk.distribute(_batches(12), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    model.fit(data, epochs=2, verbose=0, callbacks=[callback, SlowEpochStart()])
    first, second = callback.report.epochs
    assert second.host_share == pytest.approx(0.0, abs=1e-9)
    assert second.epoch_overhead_share == pytest.approx(10 / 22)
    assert not first.verdict.startswith("epoch-overhead")  # a fit's first epoch traces
    assert second.verdict.startswith("epoch-overhead: 45% of the epoch is outside its steady")
    quote = quoted_block("throughput.md", "A validation set eight times the size")
    assert_quoted_in(quote, capfd.readouterr().out, figures_vary=True)


def test_a_notebooks_report_has_a_figure_per_row_and_at_most_four_epochs_as_columns():
    """The report fits a notebook's cell: turned, the first and the last 3 epochs of 12."""
    import re

    from mirrorkit.throughput.report import EpochThroughput, ThroughputReport
    from mirrorkit.throughput.turned_table import HTML_EPOCHS

    report = ThroughputReport(2, 1, 32)
    report.epochs = [
        EpochThroughput(n, 10, 100.0 * n, 50.0, 100.0, 0.1, 0.1, 0.1, 1.0) for n in range(1, 13)
    ]
    page = report._repr_html_()
    headers = re.findall(r"<th>([^<]*)</th>", page)
    assert HTML_EPOCHS == 4
    assert headers == ["", "epoch 1", *(f"epoch {n}" for n in range(10, 13))], headers
    first_row = re.search(r"<tbody><tr>(.*?)</tr>", page)[1]
    assert re.findall(r"<td>([^<]*)</td>", first_row) == [
        "examples/s", "100.0", "1,000.0", "1,100.0", "1,200.0"
    ]  # fmt: skip
    assert "epochs 2-9 are left out here: report.to_dict() has every epoch" in page
    report.epochs = report.epochs[:3]
    assert "left out" not in report._repr_html_()


def test_the_text_report_is_turned_and_fits_80_columns():
    """print(report): a figure per row, the first and the last 4 of 12 epochs as columns."""
    from mirrorkit.throughput.report import EpochThroughput, ThroughputReport
    from mirrorkit.throughput.turned_table import TEXT_EPOCHS

    report = ThroughputReport(2, 1, 32)
    report.epochs = [
        EpochThroughput(n, 10, 1000.0 * n, 500.0, 1000.0, 0.1, 0.1, 0.1, 1.0) for n in range(1, 13)
    ]
    lines = str(report).splitlines()
    assert TEXT_EPOCHS == 5 and max(len(line) for line in lines) <= 80, str(report)
    assert lines[1].split() == ["epoch", "1", "epoch", "9", "epoch", "10", "epoch", "11"] + [
        "epoch", "12"
    ]  # fmt: skip
    assert lines[2].split() == ["examples/s", "1,000.0", "9,000.0", "10,000.0", "11,000.0"] + [
        "12,000.0"
    ]  # fmt: skip
    assert "epochs 2-8 are left out here: report.to_dict() has every epoch" in lines
    report.epochs = report.epochs[:5]
    assert "left out" not in str(report) and str(report).splitlines()[1].count("epoch") == 5


def test_repeated_bottlenecks_are_one_line_and_others_keep_theirs():
    from mirrorkit.throughput.report import EpochThroughput, ThroughputReport

    def epoch(n, verdict):
        return EpochThroughput(n, 10, 1.0, 0.5, 1.0, 0.1, 0.1, 0.1, 1.0, verdict=verdict)

    overhead = "epoch-overhead: {}% of the epoch is outside its steady steps"
    report = ThroughputReport(2, 1, 32)
    report.epochs = [
        epoch(1, "not input-bound: 3% of each step waits for data"),
        *(epoch(n, overhead.format(40 + n)) for n in (2, 3, 4)),
        epoch(5, "input-bound: 30% of each step waits for data"),
        epoch(6, overhead.format(50)),
    ]
    assert report._verdict_lines() == [
        f"epochs 2-4 (3 epochs): epoch-overhead; epoch 4: {overhead.format(44)}",
        "epoch 5: input-bound: 30% of each step waits for data",
        f"epoch 6: {overhead.format(50)}",
        "epoch 1: not input-bound: 3% of each step waits for data",
    ]


def test_outputs_parse_and_show_the_figures(tmp_path, capfd, clock):
    json_path = tmp_path / "throughput.json"
    callback = mk.ThroughputCallback(
        warmup_steps=2,
        log_every=5,
        json_path=str(json_path),
        tensorboard_dir=str(tmp_path / "tb"),
        baseline=GLOBAL_BATCH / STEP_S,
    )
    _fit(clock, callback, epochs=1)
    said = capfd.readouterr().out
    assert "step 10:" in said and "epoch 1:" in said and "scaling efficiency" in said
    saved = json.loads(json_path.read_text())
    assert saved["num_replicas"] == 2 and len(saved["epochs"]) == 1
    # 2 replicas, each at half the single-replica baseline's rate.
    assert saved["epochs"][0]["scaling_efficiency"] == pytest.approx(0.5, rel=1e-9)
    text = str(callback.report)
    title, header, *rest = text.splitlines()  # one epoch: one column, then its verdicts
    assert title.startswith("Throughput: 2 replicas on 1 worker(s), global batch 32")
    assert header.split() == ["epoch", "1"]
    labels = [line.split("  ")[0] for line in rest if not line.startswith("epoch 1: ")]
    assert "examples/s" in labels and "efficiency" in labels, labels
    verdicts = [line for line in rest if line.startswith("epoch 1: ")]
    assert verdicts and rest[-len(verdicts) :] == verdicts
    from html.parser import HTMLParser

    cells = []

    class Cells(HTMLParser):
        def handle_data(self, data):
            cells.append(data)

    Cells().feed(callback.report._repr_html_())
    # a notebook's cell: a figure per row, an epoch per column
    assert cells[1:4] == ["epoch 1", "examples/s", cells[3]] and "efficiency" in cells
    assert verdicts and all(line in cells for line in verdicts)  # the verdicts show there too
    assert list((tmp_path / "tb").iterdir())  # TensorBoard event file
    figure = callback.report.plot(str(tmp_path / "throughput.png"))
    assert (tmp_path / "throughput.png").stat().st_size > 0 and figure is not None


def test_baseline_from_a_bench_json_file(tmp_path):
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps({"results": [{"replicas": 1, "workers": 1, "examples_per_sec_per_replica": 80}]})
    )
    assert mk.ThroughputCallback(baseline=str(path)).baseline == 80
    path.write_text(json.dumps({"results": []}))
    with pytest.raises(ValueError, match="no single-replica result"):
        mk.ThroughputCallback(baseline=str(path))


def test_bad_arguments_are_errors():
    with pytest.raises(ValueError, match="log_every must be a positive integer"):
        mk.ThroughputCallback(log_every=0)
    with pytest.raises(ValueError, match="straggler_factor must be above 1"):
        mk.ThroughputCallback(straggler_factor=0.9)
    with pytest.raises(ValueError, match="baseline must be a positive"):
        mk.ThroughputCallback(baseline=-1.0)
    with pytest.raises(ValueError, match="straggler_min_gap_s must be a non-negative number"):
        mk.ThroughputCallback(straggler_min_gap_s=-0.01)


def test_find_straggler():
    assert find_straggler([0.1, 0.1, 0.5], 1.2) == 2
    assert find_straggler([0.1, 0.115], 1.2) is None
    assert find_straggler([0.2, 0.1], 1.5) == 0


def test_a_straggler_must_also_be_slower_by_the_gap():
    # 5 ms against 2 ms is 2.5x: the ratio alone flags it, the 10 ms gap does not.
    assert find_straggler([0.002, 0.005], 1.2, min_gap_s=0) == 1
    assert find_straggler([0.002, 0.005], 1.2) is None
    assert find_straggler([0.002, 0.005], 1.2, min_gap_s=0.003) == 1  # gap reached exactly
    assert find_straggler([0.02, 0.2, 0.021], 1.2) == 1
    assert find_straggler([0.1, 0.115], 1.1) == 1  # 15 ms over a 1.15x ratio
    assert find_straggler([0.1, 0.115], 1.1, min_gap_s=0.02) is None


def test_the_callback_applies_the_gap_and_the_report_says_the_rule():
    import numpy as np

    from mirrorkit.throughput.report import ThroughputReport

    callback = mk.ThroughputCallback(verbose=0, straggler_factor=1.5, straggler_min_gap_s=0.01)
    callback.report = ThroughputReport(2, 2, 16, None, 1.5, 0.01)
    callback._epoch_start = 0.0
    times = np.full(5, 0.25)
    tiny = callback._figures(1, times, [0.002, 0.005])  # the notebook's medians: 2.5x, 3 ms
    assert tiny.straggler is None and tiny.spread == pytest.approx(2.5)
    slow = callback._figures(2, times, [0.02, 0.2])
    assert slow.straggler == 1
    callback.report.epochs = [tiny, slow]
    text = str(callback.report)
    assert text.splitlines()[-1] == (  # after the table: the one straggler, and the rule
        "epoch 2: straggler: worker 1 works 200.0 ms a step, the others 20.0 ms (10.00x) "
        "(flagged when over 1.5x and 10 ms slower)"
    ), text
    assert "epoch 1: straggler" not in text
    line = report_module.summary_line(slow, callback.report)
    said = "; STRAGGLER: worker 1 works 200.0 ms a step, the others 20.0 ms (10.00x) (flagged when "
    assert said in line
    assert "STRAGGLER" not in report_module.summary_line(tiny, callback.report)


def test_the_input_clock_is_in_place_only_during_fit():
    """evaluate and predict set the model but never end training: nothing stays patched."""
    strategy = mk.strategy(cpu_replicas=2)
    model = mk.build(_model, strategy)
    data = mk.distribute(_batches(2), strategy, global_batch_size=GLOBAL_BATCH, shuffle=False)
    callback = mk.ThroughputCallback(verbose=0)
    seen = []
    during = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(mk.compat.active())
    )
    model.evaluate(data, verbose=0, callbacks=[callback])
    model.predict(data, verbose=0, callbacks=[callback])
    assert not [name for name in mk.compat.active() if name.startswith("input_clock.")]
    model.fit(data, epochs=1, verbose=0, callbacks=[callback, during])
    assert any(name.startswith("input_clock.") for name in seen[0])
    assert not [name for name in mk.compat.active() if name.startswith("input_clock.")]


def test_tensorboard_dir_without_tensorboard_is_a_clear_error(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "tensorboard", None)
    with pytest.raises(ImportError, match="pip install tensorboard"):
        mk.ThroughputCallback(tensorboard_dir="logs")


#: Real seconds of work per step: every worker's, and the slowed worker's.
WORK_S, SLOW_S = 0.02, 0.2
#: A worker is flagged when its median exceeds the others' by this factor. With the same
#: 20 ms of work on each worker, flagging one needs a 10 ms difference of medians; the slowed
#: worker is 10x slower.
STRAGGLER_FACTOR = 1.5


def fit_with_one_slow_worker(slow_worker):
    """One epoch on this job's workers; worker `slow_worker` (rank) works SLOW_S per step."""
    import time

    import keras
    import numpy as np
    import tensorflow as tf

    import mirrorkit as mk
    from mirrorkit.cluster import cluster_info

    # Before mk.strategy(), read the rank from TF_CONFIG: TensorFlow must not start yet.
    rank = cluster_info.from_environment().worker_index
    delay = SLOW_S if rank == slow_worker else WORK_S

    class Work(keras.layers.Layer):
        def call(self, x):
            def pause(value):
                time.sleep(delay)
                return value

            return tf.ensure_shape(tf.numpy_function(pause, [x], x.dtype, stateful=True), x.shape)

    strategy = mk.strategy()

    def make():
        model = keras.Sequential([keras.Input((4,)), Work(), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        return model

    model = mk.build(make, strategy)
    x = np.ones((16 * 20, 4), "float32")
    callback = mk.ThroughputCallback(warmup_steps=3, verbose=1, straggler_factor=STRAGGLER_FACTOR)
    data = mk.distribute((x, x[:, :1]), strategy, global_batch_size=16, shuffle=False)
    model.fit(data, epochs=1, verbose=0, callbacks=[callback])
    mk.print(callback.report)  # the chief's
    return callback.report.to_dict()


def check_straggler_reports(reports, slow_worker):
    """What every worker's report must say when `slow_worker` (or none) was slowed."""
    for report in reports:  # every worker reaches the same verdict
        (epoch,) = report["epochs"]
        medians = epoch["worker_compute_median_s"]
        assert len(medians) == 2
        assert min(medians) >= WORK_S  # every worker's work is measured, none is left at 0
        assert epoch["straggler"] == slow_worker
        assert 0 < epoch["compute_share"] <= 1.1
    if slow_worker is not None:
        medians = reports[0]["epochs"][0]["worker_compute_median_s"]
        assert medians[slow_worker] >= SLOW_S > medians[1 - slow_worker]
        assert reports[0]["epochs"][0]["slowest_worker"] == slow_worker
        # The slowed worker's 200 ms dominate every step; the other worker spends them waiting.
        for report in reports:
            assert report["epochs"][0]["compute_share"] > 0.5


#: The lines of the page's 2-worker report (epoch 1 calm, worker 1 slowed in epoch 2) that a
#: one-epoch job prints: the calm epoch's line and its column of the table; the slowed epoch's
#: line, its verdict (a step that computing fills: the calm epoch's verdict on the page reads
#: the same), its column and its straggler line. The report's last line sums up two epochs,
#: which these jobs lack. Per job: (lines before the table, the table's column, lines after).
PAGES_REPORT_LINES = {None: ((0, 4), 0, ()), 1: ((1, 2, 3, 4), 1, (20,))}
PAGES_TABLE = range(5, 20)  # the header, then a figure per row


def _pages_report_lines(quote, slow_worker):
    """The page's report as a one-epoch job prints it: `PAGES_REPORT_LINES`, one column."""
    import re

    before, column, after = PAGES_REPORT_LINES[slow_worker]
    table = []
    for i in PAGES_TABLE:
        prefix, rest = quote.lines[i][:5], quote.lines[i][5:]  # "[w0] ", then the row
        label, *values = re.split(r"\s{2,}", rest)
        table.append(f"{prefix}{label}  {values[column]}".replace("[w0]   ", "[w0] "))
    return [quote.lines[i] for i in before] + table + [quote.lines[i] for i in after]


@pytest.mark.multiprocess
@pytest.mark.parametrize("slow_worker", [1, None])
def test_straggler_is_flagged_only_when_one_worker_is_slow(slow_worker, capfd):
    from _multiworker import run_workers

    reports = run_workers(fit_with_one_slow_worker, slow_worker, n=2)
    check_straggler_reports(reports, slow_worker)
    quote = quoted_block("throughput.md", "so it shows as the straggler:")
    lines = _pages_report_lines(quote, slow_worker)
    assert_quoted_in(Quote(lines, quote.where), capfd.readouterr().out, figures_vary=True)


def test_the_pages_json_sample_has_the_fields_of_the_report():
    """docs/throughput.md's `throughput.json` sample: the report's fields, in its order (a field
    added to or renamed in `EpochThroughput` or `ThroughputReport` fails here until the page
    shows a run of today's report)."""
    import dataclasses
    import pathlib

    page = pathlib.Path(__file__).resolve().parent.parent / "docs" / "throughput.md"
    text = page.read_text().split("Here is the start of `throughput.json`", 1)[1]
    sample = text.split("```json\n", 1)[1].split("```", 1)[0].replace("    ...\n", "")
    sample = json.loads(sample.replace("},\n  ]", "}\n  ]"))  # the ... after the first epoch
    top = [f.name for f in dataclasses.fields(report_module.ThroughputReport)]
    assert list(sample) == top
    epoch = [f.name for f in dataclasses.fields(report_module.EpochThroughput)]
    assert list(sample["epochs"][0]) == epoch
