"""Shared fixtures.

The pytest process itself fixes 4 logical CPU devices before any test runs, so
in-process tests may ask for ``cpu_replicas`` 1, 2 or 4. A test that needs a
fresh TensorFlow (another device count, a worker, a check of what
initialisation does) runs its code through `fresh`, in a new interpreter.
"""

from __future__ import annotations

import functools
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
#: One thread inside each TensorFlow op, in this process and every process a test starts
#: (inherited), as `mirrorkit launch` gives each pinned worker of a 2-worker job on 2 cores
#: (`mirrorkit.launcher.pinning.thread_env`). The suite runs 2-5 TensorFlow processes at once
#: on the 2-core machine, and each one's default pool (a thread per core) spun for work: the
#: conformance matrix took 19 % less CPU with one (docs/development.md). Tests of the
#: launcher's own thread settings remove it (`without_suite_threads`).
SUITE_THREADS = {"TF_NUM_INTRAOP_THREADS": "1"}
for _name, _value in SUITE_THREADS.items():
    os.environ.setdefault(_name, _value)


import pytest  # noqa: E402

from mirrorkit.launcher.processes import run_function  # noqa: E402

IN_PROCESS_CPUS = 4


@pytest.fixture
def without_suite_threads() -> dict[str, str]:
    """This environment without the suite's `SUITE_THREADS` (where the user set none)."""
    return {k: v for k, v in os.environ.items() if SUITE_THREADS.get(k) != v}


def pytest_configure(config):
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(IN_PROCESS_CPUS)]
    )
    tf.config.list_logical_devices()  # fixes them: later requests take a subset or fail


#: Markers by cost (pyproject.toml lists them); each implies ``slow``, the umbrella that
#: ``-m "not slow"`` leaves out while you work.
COSTLY = ("multiprocess", "upstream", "gpu")


#: Session fixtures costly enough (fresh processes, a 2-worker job) that every module using
#: one runs on the same pytest-xdist worker, so each is computed once per run.
SHARED_SESSION_FIXTURES = ("one_device_runs", "two_worker_job")


@pytest.hookimpl(tryfirst=True)  # before pytest's own hook deselects by -m
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(item.get_closest_marker(name) for name in COSTLY):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unused without xdist
def pytest_xdist_make_scheduler(config, log):
    """Each test module on one pytest-xdist worker (``-n 3`` in pyproject's addopts).

    A module's tests share its module-scoped fixtures (a fresh process, a job), so they
    run together, on one worker; the modules that use a costly session fixture
    (`SHARED_SESSION_FIXTURES`) share one unit, so each is computed once per run.
    (xdist's own ``--dist loadgroup`` marks no longer reach its scheduler on pytest 9.2.)

    With 3 or more workers the last one is the waiting lane: it runs only the modules
    marked ``waits`` (``pytestmark``: most of their time is a timeout, a sleep or another
    engine's daemons, not this machine's CPU), and the others run everything else, so a
    wait no longer leaves one of the two cores idle. With fewer workers every worker runs
    any module.
    """
    from xdist.scheduler import LoadScopeScheduling

    changed = _changed_xdist_internals(LoadScopeScheduling)
    if changed:
        import warnings

        import xdist

        warnings.warn(
            f"pytest-xdist {xdist.__version__} changed {', '.join(changed)}, which the suite's "
            "module scheduler (tests/conftest.py, pytest_xdist_make_scheduler) overrides; it is "
            "off, and the modules run in xdist's own --dist loadscope order: the same tests, "
            "slower (the waiting lane is gone). Update the scheduler for this xdist.",
            stacklevel=1,
        )
        return None  # xdist's own scheduler for --dist loadscope

    class ModulesTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "shared-session-fixtures" if _uses_shared_fixture(path) else path

        def _assign_work_unit(self, node) -> None:
            nodes = self.nodes
            if len(nodes) < 3:
                scope = next(iter(self.workqueue), None)
            else:
                lane = node is max(nodes, key=lambda n: int(n.gateway.id[2:]))
                scope = next((s for s in self.workqueue if _waits(s) == lane), None)
            if scope is None:  # nothing left for this lane: the worker ends with its queue
                node.shutdown()
                return
            self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return ModulesTogether(config, log)


#: The private pytest-xdist methods the scheduler overrides, with their parameters.
XDIST_OVERRIDES = {"_split_scope": ["self", "nodeid"], "_assign_work_unit": ["self", "node"]}


def _changed_xdist_internals(scheduling: type) -> list[str]:
    """The overridden xdist methods that are missing or take other parameters."""
    import inspect

    changed = []
    for name, parameters in XDIST_OVERRIDES.items():
        method = getattr(scheduling, name, None)
        if method is None or list(inspect.signature(method).parameters) != parameters:
            changed.append(f"LoadScopeScheduling.{name}")
    return changed


@functools.cache
def _source(path: str) -> str:
    return (pathlib.Path(__file__).parent.parent / path).read_text()


def _uses_shared_fixture(path: str) -> bool:
    return any(fixture in _source(path) for fixture in SHARED_SESSION_FIXTURES)


def _waits(scope: str) -> bool:
    """Whether the unit `scope` (a module's path) is a module marked ``waits``."""
    return scope.endswith(".py") and "pytest.mark.waits" in _source(scope)


class _Fresh:
    """Runs a function in new Python processes and returns their results."""

    def __call__(self, fn, *args, env=None, timeout_s=300):
        """``fn(*args)`` in one fresh process; returns its value."""
        return run_function(fn, args, env=(lambda i: env or {}), timeout_s=timeout_s)[0]

    def many(self, fn, *args, n, env=None, timeout_s=300):
        """``fn(*args)`` in n fresh processes at once; ``env(i)`` per process."""
        return run_function(fn, args, num_processes=n, env=env, timeout_s=timeout_s)


@pytest.fixture(scope="session", autouse=True)
def _stopped_fits_free_their_input():
    """A fit in this process that ends by an exception frees its input iterators at once.

    A stopped epoch's multi-device iterators stay in reference cycles with the exception's
    frames until a full garbage collection; in the suite, that collection then ran inside a
    later test's fit and blocked there, no CPU used, while TensorFlow destroyed them (155 s
    in test_rescale, 147 s of it in one collection, stack in tf.data's iterator destructor;
    97-112 s in earlier runs). Collected at the end of each test they took up to 7 s, right
    after each stop (here) under 2 s per test. Here the finished frames of the traceback
    are cleared (their line numbers stay) and garbage is collected before the exception
    goes on to the test. Outside the suite the stall was not reproduced reliably (a script
    that stops a 4-replica fit and collects 20 s later stalled 21 s on a loaded machine,
    0.5 s on an idle one), so the docs do not claim it.
    """
    import gc
    import traceback

    import keras

    def fit(self, *args, **kwargs):
        try:
            return super(keras.Model, self).fit(*args, **kwargs)
        except BaseException as stopped:
            traceback.clear_frames(stopped.__traceback__)
            gc.collect()
            raise

    assert "fit" not in vars(keras.Model)  # fit is the trainer's, which repairs may wrap
    keras.Model.fit = fit
    yield
    del keras.Model.fit


@pytest.fixture(scope="module", autouse=True)
def _modules_free_their_input():
    """Garbage is collected after each module, while nothing else runs in this process.

    Tests that iterate a distributed dataset part-way (``next(iter(...))``, a loop that
    stops early) leave its multi-device iterators in reference cycles too; destroyed by a
    collection inside a later module's fit they blocked there as above (56 s in
    test_internals after test_doc_examples and test_factory, 67 s in test_distribute).
    """
    import gc

    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _notices_unsaid():
    """Each test starts with no notice said yet, so "said once" checks do not depend on order."""
    from mirrorkit import notices

    said = set(notices._said)
    notices._said.clear()
    yield
    notices._said.clear()
    notices._said.update(said)


@pytest.fixture
def fresh():
    return _Fresh()


@pytest.fixture
def mirrorkit_command():
    """Runs ``mirrorkit ARGS`` in this process (`commands.cli.main`); returns its exit code.

    For checks that need no fresh TensorFlow (bad arguments, ``info``): a fresh
    ``python -m mirrorkit`` imports TensorFlow again. SIGTERM's handler, which
    ``main`` sets, is put back afterwards.
    """
    import signal

    from mirrorkit.commands import cli

    def run(*argv: str) -> int:
        handler = signal.getsignal(signal.SIGTERM)
        try:
            return cli.main(list(argv))
        finally:
            signal.signal(signal.SIGTERM, handler)

    return run


@pytest.fixture(scope="session")
def one_device_runs():
    """``_training.train_both_optimizers(1)`` in one fresh process, once per session.

    The one-device reference (SGD and Adam: final weights and History) that the
    equivalence, multi-worker and chief-task tests compare against; computed
    once instead of once per module.
    """
    from _training import train_both_optimizers

    return run_function(train_both_optimizers, (1,), timeout_s=300)[0]


@pytest.fixture(scope="session")
def tfds_dir(tmp_path_factory):
    """A prepared `_tfds_builder.TinyImages` on disk: (its data_dir, its builder)."""
    from _tfds_builder import prepare

    directory = tmp_path_factory.mktemp("tfds")
    return str(directory), prepare(str(directory))


@pytest.fixture(scope="session")
def two_worker_job(request):
    """The session's one shared 2-worker job (`_multiworker.SHARED_SCENARIOS`), run once.

    A list of each worker's {scenario: result}; the multi-worker tests that only
    read a healthy job's results (test_multiworker, test_distribute_multiworker,
    test_accumulation) take their part of it instead of starting a job each. Only
    the scenarios of the modules this session runs such a test of are run: CI's
    older legs run test_multiworker alone, without tensorflow_datasets.
    """
    from _multiworker import SHARED_SCENARIOS, shared_job

    modules = {
        item.module.__name__
        for item in request.session.items
        if "two_worker_job" in getattr(item, "fixturenames", ())
    }
    names = [name for name, (module, _) in SHARED_SCENARIOS.items() if module in modules]
    kwargs = {name: {} for name in names}
    if "distribute" in kwargs:
        kwargs["distribute"]["data_dir"] = request.getfixturevalue("tfds_dir")[0]
    return shared_job(kwargs)


def pytest_terminal_summary(terminalreporter):
    """Closes with how many documentation examples ran and how many are marked not runnable,
    and, where upstream canaries ran, which repairs are still needed and which to retire now."""
    from _doc_examples import summary

    line = summary(terminalreporter.stats)
    if line:
        terminalreporter.write_sep("-", "documentation examples (tests/test_doc_examples.py)")
        terminalreporter.write_line(line)
    lines = canary_summary(terminalreporter.stats)
    if lines:
        terminalreporter.write_sep("-", "upstream canaries: the repairs to retire")
        for line in lines:
            terminalreporter.write_line(line)


def canary_summary(stats) -> list[str]:
    """What the upstream canaries that ran say: the repairs still needed, and those to retire.

    A canary passes while plain Keras or TensorFlow still has the bug; one that fails no
    longer sees it, so the repairs that name it are to be retired on this release.
    """
    canaries = [
        report
        for key in ("passed", "failed")
        for report in stats.get(key, [])
        if getattr(report, "when", "") == "call" and "upstream" in getattr(report, "keywords", {})
    ]
    if not canaries:
        return []
    import keras
    import tensorflow as tf

    retire: dict[str, str] = {}
    for report in canaries:
        if report.failed:
            for name in repairs_checked_by(report.nodeid):
                retire.setdefault(name, report.nodeid)
    from mirrorkit.patching import catalogue

    checked = {name for r in canaries if r.passed for name in repairs_checked_by(r.nodeid)}
    checked -= set(retire)
    aside = {  # their own reading of Keras's code (or fixed_in) already takes them off here
        name
        for name in checked
        if catalogue.named(name).fixed_upstream or not catalogue.named(name).needed()
    }
    unfit = sorted(name for name in checked - aside if not catalogue.named(name).fits)
    needed = sorted(checked - aside)
    retiring = ", ".join(f"{name} ({canary})" for name, canary in sorted(retire.items()))
    lines = [
        f"{len(canaries)} canaries ran on TensorFlow {tf.__version__} / Keras "
        f"{keras.__version__}: {len(needed)} repairs still needed ({', '.join(needed)})"
    ]
    if unfit:
        lines.append(
            f"still needed, but off on this Keras, which the replacement does not fit yet: "
            f"{', '.join(unfit)}"
        )
    if aside:
        lines.append(f"already stepping aside on this Keras: {', '.join(sorted(aside))}")
    return [*lines, f"retire now: {retiring or 'none'}"]


@pytest.fixture(autouse=True)
def _no_scoped_patch_outlives_its_test():
    """A scoped patch (``compat.SCOPED``) still in place after a test is a leak in mirrorkit:
    a later test in this process, and a user's next call, would run under it. It is removed
    and the test fails."""
    from mirrorkit.patching import repair as _repair

    before = list(_repair.SCOPED)
    yield
    left = [repair for repair in _repair.SCOPED if repair not in before]
    for repair in reversed(left):
        _repair.remove_scoped(repair)
    assert not left, f"still in place after this test: {[repair.name for repair in left]}"


@pytest.fixture
def taken_off():
    """``taken_off(name, ...)``: those repairs of the catalogue off, each alone (the others stay
    in place), until the test ends; a canary calls it after ``mk.strategy()``, which applies
    them again."""
    from mirrorkit.patching import catalogue

    taken = []

    def take(*names):
        for name in names:
            repair = catalogue.named(name)
            if repair.active:
                repair.remove()
                taken.append(repair)

    yield take
    for repair in reversed(taken):
        repair.apply()


def _every_repair() -> list:
    """Every repair mirrorkit defines (its catalogue: mirrorkit.patching.catalogue)."""
    from mirrorkit.patching import catalogue

    return list(catalogue.repairs())


def repairs_checked_by(nodeid: str) -> list[str]:
    """The repairs that name the test `nodeid` among their tests (``Repair.tests``)."""
    exact = [r.name for r in _every_repair() if nodeid in getattr(r, "tests", ())]
    if exact:  # a case of a canary that takes one repair off alone
        return exact
    bare = nodeid.split("[", 1)[0]
    return [r.name for r in _every_repair() if bare in getattr(r, "tests", ())]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """An upstream canary that fails says which repair to retire.

    A canary (``@pytest.mark.upstream``) turns a repair off and checks that plain Keras or
    TensorFlow still fails. When it does not (CI's next leg runs the nightlies' canaries),
    the failure names the repairs that declare the canary, and what to do.
    """
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or not item.get_closest_marker("upstream"):
        return
    import keras
    import tensorflow as tf

    repairs = repairs_checked_by(item.nodeid)
    what = (
        f"the bug that {', '.join(repairs)} repairs"
        if repairs
        else "an upstream bug (no repair names this test among its tests)"
    )
    report.sections.append(
        (
            "upstream canary",
            f"This canary shows {what}; it did not show on TensorFlow {tf.__version__} / Keras "
            f"{keras.__version__}. If that release fixed the bug, retire the repair there: give "
            "it fixed_in (or a needed() that reads Keras's code) and say so on the Keras repairs "
            "page (docs: compat/).",
        )
    )
