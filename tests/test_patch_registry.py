"""Every patch mirrorkit makes is declared: ``compat.describe()`` lists it, ``disable()`` undoes it.

A fresh process (so nothing is patched yet) records every function and class attribute of the
Keras and TensorFlow modules it has loaded, trains 2 replicas with ``ThroughputCallback``,
``NaNGuard`` and ``mk.resumable``, and, in the last batch, finds what changed on its own: the
process-wide attributes against the record, and the attributes of the model, the optimizer,
the callbacks and the strategy that hold something of mirrorkit's. Every change must be a row
of ``describe()``; after ``disable()`` nothing must be left.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import json, os, sys, tempfile
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy as np, tensorflow as tf

def functions_and_classes():
    """(module, class or None, attribute) -> value, for what Keras and TensorFlow define."""
    found = {}
    for name, module in list(sys.modules.items()):
        if module is None or not name.split(".")[0] in ("keras", "tensorflow"):
            continue
        for attr, value in list(vars(module).items()):
            if callable(value) and not isinstance(value, type):
                found[(name, None, attr)] = value
            elif isinstance(value, type) and value.__module__ == name:
                for member, inner in list(vars(value).items()):
                    if callable(inner) or isinstance(inner, (property, staticmethod, classmethod)):
                        found[(name, value.__qualname__, member)] = inner
    return found

before = functions_and_classes()
modules_before = {key[0] for key in before}
import mirrorkit as mk
from mirrorkit import compat

def changed_process_wide():
    now = functions_and_classes()
    return sorted(
        {
            ".".join(k for k in key if k)
            for key in set(before) | {k for k in now if k[0] in modules_before}
            if before.get(key) is not now.get(key)
        }
    )

def resolve(target):
    """'a.b.Class.attr' -> 'module.Class.attr' where the class is defined."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest module already imported: no import
        owner = sys.modules.get(".".join(parts[:cut]))
        if owner is None:
            continue
        for part in parts[cut:-1]:
            owner = getattr(owner, part)
        if isinstance(owner, type):
            return f"{owner.__module__}.{owner.__qualname__}.{parts[-1]}"
        return f"{owner.__name__}.{parts[-1]}"
    return target

def mirrorkits(value):
    value = getattr(value, "__func__", value)
    module = getattr(value, "__module__", None) or type(value).__module__
    return (module or "").startswith("mirrorkit")

strategy = mk.strategy(cpu_replicas=2)
def make():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model
model = mk.build(make, strategy)
resumable = mk.resumable(tempfile.mkdtemp())
result = {}

class Look(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch != 1 or result:
            return
        objects = {
            "model": model, "optimizer": model.optimizer, "resumable": resumable,
            "extended": strategy.extended,
        }
        def on_objects(but=()):
            return sorted(
                f"{label}.{attr}" for label, obj in objects.items()
                for attr, value in vars(obj).items()
                if (mirrorkits(value) or attr.startswith("_mirrorkit")) and attr not in but
            )
        rows = compat.describe()
        result["rows"] = rows
        result["process_wide"] = changed_process_wide()
        result["described"] = sorted(
            {resolve(row["target"]) for row in rows if " of the instance " not in row["target"]}
        )
        # an object holds its patches in one attribute (patching.instance.HELD), gone after
        result["on_objects"] = on_objects(but=("_mirrorkit_patches",))
        compat.disable()
        result["after_process_wide"] = changed_process_wide()
        result["after_on_objects"] = on_objects()
        result["after_rows"] = compat.describe()

x = np.ones((64, 4), "float32")
y = np.zeros((64, 2), "float32")
model.fit(
    x, y, batch_size=16, epochs=1, verbose=0,
    callbacks=[mk.ThroughputCallback(verbose=0), mk.callbacks.NaNGuard(), resumable, Look()],
)
json.dump(result, open(sys.argv[1], "w"))
'''


@pytest.mark.slow
def test_describe_lists_every_patch_of_a_fit_and_disable_removes_them_all(tmp_path):
    out = tmp_path / "result.json"
    # as on the chief under `mirrorkit launch`: mk.resumable records its progress too
    progress = {"MIRRORKIT_PROGRESS": str(tmp_path / "progress.json")}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **progress},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    names = [row["name"] for row in result["rows"]]
    # What changed process-wide is exactly what describe() lists as process-wide.
    assert result["process_wide"] == result["described"], names
    # The single objects' patches: each attribute that holds something of mirrorkit's is a row.
    instance_rows = [row for row in result["rows"] if " of the instance " in row["target"]]
    described_attrs = sorted(
        {row["target"].split(" of ")[0].rsplit(".", 1)[1] for row in instance_rows}
    )
    found_attrs = sorted({entry.split(".", 1)[1] for entry in result["on_objects"]})
    assert found_attrs == described_attrs, (result["on_objects"], instance_rows)
    # What the callbacks need: the step chain, NaNGuard's loss record, the backup's pair and
    # its progress record around the callback's own hooks.
    for expected in (
        "step_hooks.train_function",
        "nan_guard.compute_loss",
        "backup_pair_save",
        "backup.progress_on_epoch_begin",
    ):
        assert expected in names, names
    assert "gradient_hooks.all_reduce" in names, names
    assert any(name.startswith("input_clock.") for name in names), names
    # disable() leaves nothing: no attribute differs, none holds mirrorkit's, describe() is empty.
    assert result["after_process_wide"] == [], result["after_process_wide"]
    assert result["after_on_objects"] == [], result["after_on_objects"]
    assert result["after_rows"] == [], result["after_rows"]


class _Holder:
    """Stands for a Keras object: any object with a __dict__ that can be referenced weakly."""

    def method(self):
        return "class"


def test_a_patch_of_one_object_is_listed_and_its_original_comes_back():
    from mirrorkit.patching import instance

    holder = _Holder()
    patch = instance.set_on(holder, "method", lambda: "patched", name="t.m", reason="a test")
    assert holder.method() == "patched" and instance.patched(holder, "method") is patch
    assert patch in instance.in_place()
    instance.restore(patch)
    assert "method" not in vars(holder) and holder.method() == "class"
    assert patch not in instance.in_place()


def test_wraps_of_one_object_compose_by_place_and_call_the_class_as_it_is_then():
    """Two wraps of one method, in either order, compose by place; below them is the class's
    method as the class holds it when called (a class-wide repair applied later included)."""
    from mirrorkit.patching import instance

    def tag(label):
        return lambda below: lambda: f"{label}({below()})"

    for order in (("outer", "inner"), ("inner", "outer")):
        holder = _Holder()
        places = {"inner": 0, "outer": 1}
        patches = {
            label: instance.wrap(
                holder,
                "method",
                tag(label),
                name=f"t.{label}",
                reason="a test",
                place=places[label],
            )  # fmt: skip
            for label in order
        }
        assert holder.method() == "outer(inner(class))", order
        original = _Holder.method
        _Holder.method = lambda self: "repaired"  # a class-wide repair, after the wraps
        try:
            assert holder.method() == "outer(inner(repaired))", order
        finally:
            _Holder.method = original
        instance.restore(patches["inner"])  # the other stays
        assert holder.method() == "outer(class)" and instance.patched(holder, "method")
        instance.restore(patches["outer"])
        assert "method" not in vars(holder) and holder.method() == "class"
    holder = _Holder()
    instance.wrap(holder, "method", tag("a"), name="t.a", reason="a test")
    with pytest.raises(ValueError, match="at the same place 0"):
        instance.wrap(holder, "method", tag("b"), name="t.b", reason="a test")
    with pytest.raises(ValueError, match="is wrapped"):
        instance.set_on(holder, "method", None, name="t.c", reason="a test")
    instance.restore_on(holder, "method")
    assert vars(holder) == {}


def test_what_keras_set_in_between_becomes_the_original():
    """A re-trace replaces the patched train function: the next patch restores Keras's new one."""
    from mirrorkit.patching import instance

    holder = _Holder()
    holder.step = "first"
    instance.set_on(holder, "step", "chained", name="t.step", reason="a test")
    holder.step = "traced again"  # what Keras does on a re-trace
    assert instance.patched(holder, "step") is None  # no longer in place: not listed
    instance.set_on(holder, "step", "chained again", name="t.step", reason="a test")
    instance.restore_on(holder, "step")
    assert holder.step == "traced again"


def test_remove_all_restores_the_last_first_and_tells_the_owner():
    from mirrorkit.patching import instance

    holder, told = _Holder(), []
    instance.set_on(holder, "a", 1, name="t.a", reason="a test", on_removed=told.append)
    instance.set_on(holder, "a", 2, name="t.a2", reason="a test")  # keeps the first original
    instance.set_on(holder, "b", 3, name="t.b", reason="a test")
    assert [p.name for p in instance.in_place() if p.owner() is holder] == ["t.a2", "t.b"]
    instance.remove_all()
    assert vars(holder) == {} and instance.in_place() == []
    assert told == [holder]


def test_state_kept_beside_an_object_goes_with_it():
    import gc

    from mirrorkit.patching import attached

    holder = _Holder()
    attached.attach(holder, "t.seen", True)
    assert attached.attached(holder, "t.seen") is True and vars(holder) == {}
    attached.detach(holder, "t.seen")
    assert attached.attached(holder, "t.seen", "none") == "none"
    attached.attach(holder, "t.seen", True)
    entries = len(attached._STATE)
    del holder
    gc.collect()
    assert len(attached._STATE) == entries - 1


@pytest.mark.slow
def test_a_model_trained_with_the_step_and_gradient_hooks_is_freed():
    """The patches of a model and its optimizer do not keep them alive once the user drops them.

    Each patch holds the original it replaced (the model's train function refers to the model),
    so it lives on the object it patches, never in a module-level list.
    """
    import gc
    import weakref

    import numpy as np

    import mirrorkit as mk

    strategy = mk.strategy(cpu_replicas=2)

    def train():
        model = mk.build(_small_model, strategy)
        callbacks = [mk.ThroughputCallback(verbose=0), mk.callbacks.NaNGuard()]
        model.fit(np.ones((32, 4)), np.zeros((32, 2)), batch_size=8, verbose=0, callbacks=callbacks)
        return weakref.ref(model), weakref.ref(model.optimizer)

    model, optimizer = train()
    gc.collect()
    assert model() is None and optimizer() is None


def _small_model():
    import keras

    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model


class _Trainer:
    """Stands for a Keras class whose method two repairs replace."""

    def make(self):
        return ["keras"]


def _toy_repair(name: str, place: int):
    """A repair of `_Trainer.make` that puts its name before what the one it wraps makes."""
    from mirrorkit.patching.repair import Repair

    def replacement(original):
        def make(self):
            return [name, *original(self)]

        make.__wrapped__ = original
        return make

    return Repair(
        name=name,
        upstream="a test",
        module=__name__,
        target="_Trainer.make",
        replacement=replacement,
        applies_to=lambda strategy: True,
        place=place,
    )


@pytest.mark.parametrize("first", ["inner", "outer"])
def test_two_repairs_of_one_internal_wrap_each_other_by_place_whatever_order_they_come_and_go(
    first,
):
    """One owner composes the repairs of one attribute by `Repair.place`: the one with the
    higher place is what is called, whichever was applied first or is removed first."""
    inner, outer = _toy_repair("inner", 0), _toy_repair("outer", 1)
    keras_own = vars(_Trainer)["make"]
    coming = [inner, outer] if first == "inner" else [outer, inner]
    try:
        for repair in coming:
            assert repair.apply()
        assert _Trainer().make() == ["outer", "inner", "keras"]
        assert vars(_Trainer)["make"] is outer.installed
        assert outer.original is inner.original is keras_own
        coming[0].remove()  # the first applied comes off first: the other stays, alone
        assert _Trainer().make() == [coming[1].name, "keras"]
        coming[0].apply()
        assert _Trainer().make() == ["outer", "inner", "keras"]
        coming[1].remove()
        assert _Trainer().make() == [coming[0].name, "keras"]
        coming[0].remove()
        assert vars(_Trainer)["make"] is keras_own
    finally:
        inner.remove()
        outer.remove()


def test_a_repair_of_an_internal_something_else_replaced_says_so():
    """A replacement that is not a repair, on top of one: changing the repairs under it would
    drop it, so the repair raises instead; two repairs that declare one place raise too."""
    inner, outer, clash = _toy_repair("inner", 0), _toy_repair("outer", 1), _toy_repair("c", 0)
    keras_own = vars(_Trainer)["make"]
    inner.apply()
    try:
        with pytest.raises(ValueError, match=r"declare places \[0, 0\]"):
            clash.apply()
        assert not clash.active and _Trainer().make() == ["inner", "keras"]
        someone_elses = vars(_Trainer)["make"]
        _Trainer.make = lambda self: ["user", *someone_elses(self)]
        with pytest.raises(RuntimeError, match="'outer' repair .* cannot change while"):
            outer.apply()
        assert not outer.active and _Trainer().make() == ["user", "inner", "keras"]
        _Trainer.make = someone_elses
    finally:
        inner.remove()
    assert vars(_Trainer)["make"] is keras_own


def test_repairs_of_the_same_internal_declare_their_order():
    """Every internal that two of mirrorkit's repairs replace: each declares its own place."""
    import collections

    from mirrorkit.patching import catalogue
    from mirrorkit.scale import fit_notices
    from mirrorkit.training import step_chain

    every = catalogue.repairs()
    assert any(fit_notices.REPAIR is one for one in every)
    assert any(step_chain.REPAIR is one for one in every)
    by_internal = collections.defaultdict(dict)
    for one in every:
        by_internal[(one.module, one.target)][one.name] = one
    shared = {target: ones for target, ones in by_internal.items() if len(ones) > 1}
    assert shared, "no two repairs share an internal: this test checks nothing"
    for (_module, target), ones in shared.items():
        places = [one.place for one in ones.values()]
        assert len(set(places)) == len(places), (target, {n: o.place for n, o in ones.items()})
