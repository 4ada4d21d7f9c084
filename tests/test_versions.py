"""The tested TensorFlow/Keras range: one statement, and CI's matrix agrees with it."""

import pathlib
import re
import warnings

import keras
import pytest
import tensorflow as tf
from _quoted import assert_quoted_in, quoted_block

from mirrorkit import compat, notices, versions

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _pins(path: pathlib.Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==(\S+)\s*", line)
        if match:
            pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.mark.parametrize("leg", sorted(versions.MATRIX))
def test_constraint_files_pin_the_matrix_pairs(leg):
    pins = _pins(ROOT / "ci" / f"constraints-{leg}.txt")
    assert (pins["tensorflow"], pins["keras"]) == versions.MATRIX[leg]


def test_constraint_file_pins_the_next_pair():
    pins = _pins(ROOT / "ci" / "constraints-next.txt")
    assert (pins["tf-nightly-cpu"], pins["keras-nightly"]) == versions.NEXT
    script = (ROOT / ".ci" / "run").read_text()
    assert "\nnext_leg\n" in script and "ci/constraints-next.txt" in script


@pytest.mark.parametrize(
    ("tf_version", "keras_version", "is_next"),
    [
        ("2.22.0-dev20260905", "3.16.0.dev2026102704", True),  # tf.__version__'s spelling
        ("2.22.0.dev20260905", "3.16.0.dev2026102704", True),  # the distribution's
        ("2.22.0.dev20260906", "3.16.0.dev2026102704", False),  # another night
        ("2.21.0", "3.15.1", False),
    ],
)
def test_the_next_pair_is_recognised_exactly(monkeypatch, tf_version, keras_version, is_next):
    monkeypatch.setattr(versions, "NEXT", ("2.22.0.dev20260905", "3.16.0.dev2026102704"))
    found = versions.Installed(tf_version, keras_version)
    assert found.is_next is is_next
    assert ("the nightly pair CI's 'next' leg tests" in found.describe()) is is_next


def test_pyproject_floors_are_the_oldest_pair():
    text = (ROOT / "pyproject.toml").read_text()
    floors = dict(re.findall(r'"(tensorflow|keras)>=([0-9.]+)"', text))
    assert (floors["tensorflow"], floors["keras"]) == versions.MATRIX["oldest"]


def test_ci_runs_every_leg():
    script = (ROOT / ".ci" / "run").read_text().splitlines()
    legs = [line.split()[1] for line in script if line.startswith("older_leg ")]
    assert legs == ["oldest", "middle"]
    assert 'make_venv .ci-venv newest -e ".[dev]" || exit 1' in script
    assert set(legs) | {"newest"} == set(versions.MATRIX)


def test_tested_range_spans_the_matrix():
    assert versions.TESTED_TENSORFLOW == ((2, 17), (2, 21))
    assert versions.TESTED_KERAS == ((3, 10), (3, 15))
    assert versions.tested_range() == "TensorFlow 2.17-2.21 with Keras 3.10-3.15"


def test_the_running_pair_is_read_and_inside_the_range():
    found = versions.installed()
    assert (found.tensorflow, found.keras) == (tf.__version__, keras.__version__)
    # Every leg of CI's matrix installs a pair inside the range it states; the next leg the
    # nightly pair it pins.
    assert found.in_tested_range or found.is_next, found.describe()
    assert "inside the tested range" in found.describe() or found.is_next


@pytest.mark.parametrize(
    ("tf_version", "keras_version", "inside", "newer"),
    [
        ("2.17.1", "3.10.0", True, False),
        ("2.21.0", "3.15.1", True, False),
        ("2.16.2", "3.10.0", False, False),
        ("2.21.0", "3.9.2", False, False),
        ("2.22.0", "3.15.1", False, True),
        ("2.21.0", "3.16.0.dev2026", False, True),
        (None, "3.15.1", False, False),
    ],
)
def test_inside_or_outside(tf_version, keras_version, inside, newer):
    found = versions.Installed(tf_version, keras_version)
    assert found.in_tested_range is inside
    assert found.newer_than_tested is newer
    assert ("OUTSIDE" in found.describe()) is not inside


def test_compat_warns_once_for_a_newer_keras(monkeypatch):
    monkeypatch.setattr(notices, "_said", set())
    monkeypatch.setattr(versions, "installed", lambda: versions.Installed("2.21.0", "3.99.0"))
    with pytest.warns(
        UserWarning, match=r"Keras 3\.99\.0 is newer than mirrorkit's tested range"
    ) as warned:
        compat.enable()
    said = "\n".join(str(warning.message) for warning in warned)
    assert_quoted_in(
        quoted_block("compat.md", "only where the Keras internal it replaces exists:"), said
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.enable()  # said once


def test_compat_is_quiet_inside_the_range(monkeypatch):  # and on the next leg's nightly pair
    monkeypatch.setattr(notices, "_said", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compat.enable()
