"""Repair: the workers of one multi-worker job train the same KerasTuner trial, or say why not.

Upstream: KerasTuner 1.4, ``keras_tuner.src.engine.base_tuner.BaseTuner.search``;
docs: compat/#kerastuner-trials-across-workers. In distributed tuning
(``KERASTUNER_ORACLE_IP``/``_PORT``/``_TUNER_ID``), every worker of a job asks the
oracle for a trial under the job's one tuner ID, and the oracle hands the trial
running under that ID to each; only the job's chief reports and ends trials. A
worker that asks before the chief has ended the last trial is handed that
finished trial again, while the chief starts the next one: the two build
different models, and their collectives fail or hang. Without a chief oracle,
each worker runs an oracle of its own, and a tuner without a fixed ``seed``
draws different hyperparameters on each worker, with the same result.

The replacements, on a tuner whose ``distribution_strategy`` spans workers:

- ``keras_tuner_ask_together`` (``pre_create_trial``): the workers wait for each
  other before asking for a trial, so the chief has ended the last one first;
- ``keras_tuner_same_trial`` (``on_trial_begin``): the workers compare the trial
  they were handed (its ID and hyperparameter values) and, when they differ,
  every worker raises a `RuntimeError` that names each worker's trial and the
  likely cause, instead of training different models.

Both exchange one small all-reduce of the same shape, so a worker asking while
another begins a trial is told, not left waiting. keras-tuner is not a
dependency of mirrorkit: the repairs apply once ``keras_tuner`` is imported, before or
after ``mk.strategy()`` (`mirrorkit.compat.apply_when_imported`).
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from typing import Any

from mirrorkit.cluster import workers
from mirrorkit.patching.repair import Repair

_BASE_TUNER = "keras_tuner.src.engine.base_tuner"
_UPSTREAM = "KerasTuner 1.4 BaseTuner.search: workers of one job may get different trials"
#: What a worker is doing when it exchanges with the others.
_ASKING, _BEGINNING = 1.0, 2.0


def _multi_worker_strategy(tuner: Any) -> Any:
    strategy = getattr(tuner, "distribution_strategy", None)
    return strategy if strategy is not None and workers.is_multi_worker(strategy) else None


def _trial_numbers(trial: Any) -> tuple[float, float]:
    """The trial's ID as a number (-1 when not numeric) and a 48-bit digest of ID and values."""
    values = json.dumps(trial.hyperparameters.values, sort_keys=True, default=str)
    digest = hashlib.sha256(f"{trial.trial_id}|{values}".encode()).hexdigest()
    number = float(trial.trial_id) if str(trial.trial_id).isdigit() else -1.0
    return number, float(int(digest[:12], 16))


def _exchange(strategy: Any, row: list[float], trial: Any = None) -> None:
    """Every worker's `row` (what it does, trial number, digest); raises when they differ."""
    same_trial(workers.gather(strategy, row), trial)


def same_trial(table: Any, trial: Any = None) -> None:
    """Raises unless every worker's row of `table` (what it does, trial, digest) is the same.

    Args:
        table: one row per worker, as `workers.gather` returns them: ``[doing, trial number,
            digest of the hyperparameter values]``.
        trial: this worker's KerasTuner trial, named in the message.

    Raises:
        RuntimeError: the workers are not training the same trial; the message names each one's.
    """
    if len({tuple(r) for r in table}) == 1:
        return
    said = []
    for rank, (doing, number, _) in enumerate(table):
        if doing == _ASKING:
            said.append(f"worker {rank} is asking the oracle for a new trial")
        else:
            said.append(f"worker {rank} got trial {int(number)}")
    mine = ""
    if trial is not None:
        mine = f" (this worker's trial: {trial.trial_id}, {trial.hyperparameters.values})"
    raise RuntimeError(
        "the workers of one multi-worker job must train the same KerasTuner trial, but "
        + "; ".join(said)
        + f"{mine}. Give every worker of the job the same KERASTUNER_TUNER_ID (each job its "
        "own), and a tuner without a chief oracle a fixed seed= other than 0 (docs: tuning/)."
    )


def _ask_together(original):
    @functools.wraps(original)
    def pre_create_trial(self):
        original(self)
        strategy = _multi_worker_strategy(self)
        if strategy is not None:  # the chief has ended the last trial before anyone asks
            _exchange(strategy, [_ASKING, 0.0, 0.0])

    return pre_create_trial


def _same_trial(original):
    @functools.wraps(original)
    def on_trial_begin(self, trial):
        strategy = _multi_worker_strategy(self)
        if strategy is not None:
            _exchange(strategy, [_BEGINNING, *_trial_numbers(trial)], trial)
        return original(self, trial)

    return on_trial_begin


def _imported() -> bool:
    return "keras_tuner" in sys.modules


#: The failure's account on the Keras repairs page (docs: compat/), and the tests of
#: this module's repairs (docs: development/#repairs-and-tests is made from them).
_ACCOUNT = "kerastuner-trials-across-workers"
_TESTS = (
    "tests/test_keras_tuner.py::test_a_two_worker_launch_tunes_as_one_device_against_a_chief_oracle",
    "tests/test_keras_tuner.py::test_workers_handed_different_trials_stop_naming_each_workers_trial",
)

REPAIRS = (
    Repair(
        name="keras_tuner_ask_together",
        upstream=_UPSTREAM,
        module=_BASE_TUNER,
        target="BaseTuner.pre_create_trial",
        replacement=_ask_together,
        applies_to=workers.is_multi_worker,
        needed=_imported,
        account=_ACCOUNT,
        # its canary: the oracle hands a tuner ID its trial again until the chief ends it
        tests=(
            *_TESTS,
            "tests/test_keras_tuner.py::"
            "test_an_oracle_hands_a_tuner_id_its_trial_again_until_the_chief_ends_it_upstream",
        ),
    ),
    Repair(
        name="keras_tuner_same_trial",
        upstream=_UPSTREAM,
        module=_BASE_TUNER,
        target="BaseTuner.on_trial_begin",
        replacement=_same_trial,
        applies_to=workers.is_multi_worker,
        needed=_imported,
        account=_ACCOUNT,
        # its canary: workers' own oracles without a fixed seed draw different trials
        tests=(
            *_TESTS,
            "tests/test_keras_tuner.py::test_oracles_without_a_fixed_seed_draw_different_trials_upstream",
        ),
    ),
)
