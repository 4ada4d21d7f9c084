"""One local job: the single function that starts a job's worker processes on this machine.

`run_job` is what `mirrorkit launch` (a script or module per worker),
`mk.launch` (a function), `mirrorkit bench`'s sweeps and the test suite's
multi-worker helper all call. It plans the job once:

- each worker's ``TF_CONFIG``: free loopback ports, or the caller's layout
  (the hosts of a multi-host launch);
- its CPUs and matching TensorFlow thread pools (`pinning`);
- the memory allocator settings (`allocator`);
- a private network namespace (`netns`), and the services on this machine its
  workers reach (`relay`: ``--reach``, KerasTuner's oracle);

says each decision once, in the words of its caller (a flag for the command
line, an argument for Python), and hands the processes to `processes`, which
forwards every output line with its worker's prefix and stops every worker at
the first failure.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

from mirrorkit import notices
from mirrorkit.cluster import tf_config
from mirrorkit.environment_variables import (
    KERASTUNER_ORACLE_IP,
    KERASTUNER_ORACLE_PORT,
    KERASTUNER_TUNER_ID,
)
from mirrorkit.launcher import allocator, hosts, netns, pinning, processes, relay, tf_noise
from mirrorkit.launcher.ports import local_addresses


@dataclasses.dataclass(frozen=True)
class Wording:
    """How launch notices name the settings that change them: flags or arguments.

    Attributes:
        no_pin: what turns CPU pinning off.
        shared_network: what runs the workers in this machine's network.
        reach: what lets the workers reach a service on this machine.
    """

    no_pin: str
    shared_network: str
    reach: str


#: `mirrorkit launch`'s flags.
FLAGS = Wording(no_pin="--no-pin", shared_network="--shared-network", reach="--reach")
#: `mk.launch`'s arguments.
ARGUMENTS = Wording(no_pin="pin_cpus=False", shared_network="private_network=False", reach="reach=")


def run_job(
    target: Callable[..., Any] | Sequence[str],
    num_workers: int,
    args: Sequence[Any] = (),
    *,
    layout: hosts.Layout | None = None,
    pin: bool | Sequence[Sequence[int]] = True,
    private_network: bool = True,
    reach: Sequence[str] = (),
    env: Callable[[int], Mapping[str, str]] | None = None,
    timeout_s: float | None = None,
    stream: TextIO | None = None,
    log_dir: str | None = None,
    tf_startup_logs: bool = False,
    wording: Wording | None = ARGUMENTS,
) -> list[Any]:
    """Runs the local workers of one job and waits for them.

    Args:
        target: a function (called as ``target(*args)`` in each worker, a
            fresh interpreter) or a command (``[python, script, ...]``), the
            same for every worker.
        num_workers: how many workers run on this machine.
        args: positional arguments for a function `target`.
        layout: the whole job when it spans hosts (`hosts.Layout`); None means
            `num_workers` workers on loopback with free ports.
        pin: True gives each worker its own CPUs and thread pools of that
            size where there are enough CPUs (said once); False leaves them
            unpinned; a list gives worker i exactly the CPUs ``pin[i]``.
        private_network: run the workers in a private network namespace where
            the platform allows it (a warning says when it does not).
        reach: ``HOST:PORT`` of services on this machine's loopback that the
            workers in a private network reach at the same address; KerasTuner's
            oracle (``KERASTUNER_ORACLE_IP``/``_PORT`` on loopback) is added.
        env: ``env(i)`` gives worker i extra environment variables; they win
            over the ones planned here (a test writing its own TF_CONFIG).
        timeout_s: stop every worker and raise `TimeoutError` after this long.
        stream: where worker output goes (``[wN] ...``); `sys.stdout` when None.
        log_dir: also write worker i's output to ``log_dir/worker-i.log``
            (a command `target` only).
        tf_startup_logs: keep TensorFlow's C++ start-up lines (see `tf_noise`).
        wording: how notices name the settings (`FLAGS` or `ARGUMENTS`); None
            plans silently (the benchmark, the tests).

    Returns:
        Each worker's return value for a function `target`, in worker order;
        an empty list for a command.

    Raises:
        mirrorkit.launcher.processes.WorkerError: a worker failed; the others
            were stopped and the error holds its traceback or last lines.
        TimeoutError: the workers did not finish in `timeout_s`.

    Example:
    ```python
    from mirrorkit.launcher.local_job import run_job

    def rank():
        import mirrorkit as mk
        return mk.describe(mk.strategy()).worker_index

    assert run_job(rank, 2) == [0, 1]
    ```
    """
    if log_dir is not None and callable(target):
        raise ValueError(
            "log_dir= writes the output of a command's workers; a function's workers stream "
            "theirs only. Pass a command, or leave log_dir out."
        )
    if layout is None:
        addresses = tuple(local_addresses(num_workers))
        layout = hosts.Layout(addresses, 0, num_workers, False)
    if layout.local_workers != num_workers:
        raise ValueError(
            f"num_workers={num_workers} but the layout runs {layout.local_workers} worker(s) here"
        )
    cpus = plan_cpus(num_workers, pin, wording, first=layout.first_rank)
    if allocator.malloc_env():
        _say_once(allocator.describe(), wording)
    ports = plan_reach(reach, wording)  # before anything starts: a bad address is an error
    private = plan_network(layout, private_network, wording)

    def worker_env(i: int) -> dict[str, str]:
        planned = tf_config.worker_env(layout.addresses, layout.first_rank + i)
        return {**planned, **(env(i) if env else {})}

    with tf_noise.keeping(tf_startup_logs):  # the supervisor reads it, see tf_noise
        if callable(target):
            return processes.run_function(
                target,
                args,
                num_processes=num_workers,
                env=worker_env,
                timeout_s=timeout_s,
                stream=stream,
                cpus=cpus,
                private_network=private,
                reach=ports if private else (),
            )
        processes.run_commands(
            [list(target)] * num_workers,
            first=layout.first_rank,
            env=worker_env,
            timeout_s=timeout_s,
            stream=stream,
            log_dir=log_dir,
            cpus=cpus,
            private_network=private,
            reach=ports if private else (),
        )
        return []


def plan_cpus(
    num_workers: int,
    pin: bool | Sequence[Sequence[int]],
    wording: Wording | None = ARGUMENTS,
    first: int = 0,
) -> list[list[int]] | None:
    """Each local worker's CPUs when pinning is wanted and possible; says what it did.

    Args:
        num_workers: local workers.
        pin: True, False, or each worker's CPUs (used as given, said nothing).
        wording: how the notice names the switch; None says nothing.
        first: the job-wide rank of the first local worker, for the notice.
    """
    if pin is False or pin is None:
        return None
    if pin is not True:
        return [list(cpus) for cpus in pin]
    groups = pinning.split_cpus(num_workers)
    if groups is None:
        cpus = pinning.available_cpus()
        why = "CPU affinity is not supported here" if cpus is None else f"only {len(cpus)} CPUs"
        _say_once(f"not pinning: {num_workers} workers but {why}", wording)
        return None
    switch = (wording or ARGUMENTS).no_pin
    _say_once(
        f"pinning each worker to its own CPUs ({pinning.describe(groups, first)}) with TensorFlow "
        f"thread pools of that size; {switch} turns this off",
        wording,
    )
    return groups


def plan_network(job: hosts.Layout, wanted: bool, wording: Wording | None = ARGUMENTS) -> bool:
    """Whether the workers get a private network namespace; warns when they cannot.

    Args:
        job: the job's layout (a multi-host job never gets one).
        wanted: whether the caller asked for one.
        wording: how the warning names the switch; None says nothing.
    """
    warning = (
        "TensorFlow's worker servers have no authentication and listen on every interface "
        "(tensorflow#11689): anyone who can reach this machine's ports can run code in the "
        "workers. Run only on a trusted network or behind a firewall."
    )
    if job.multi_host:
        _say_once(f"WARNING: multi-host job. {warning}", wording)
        return False
    if not wanted:
        _say_once(f"WARNING: {(wording or ARGUMENTS).shared_network}. {warning}", wording)
        return False
    reason = netns.check()
    if reason is not None:
        _say_once(
            f"WARNING: could not make a private network namespace ({reason}). {warning}", wording
        )
        return False
    _say_once(
        "workers run in a private network namespace: unreachable from outside this job", wording
    )
    return True


def plan_reach(
    reach: Sequence[str], wording: Wording | None = ARGUMENTS, env: Mapping[str, str] | None = None
) -> list[int]:
    """The ports on this machine's loopback that workers in a private network reach.

    Args:
        reach: ``HOST:PORT`` addresses (``--reach`` or ``reach=``).
        wording: how the notice names the setting; None says nothing.
        env: the environment the workers inherit (`os.environ` when None): a
            KerasTuner worker's oracle on loopback is reached without asking.

    Raises:
        ValueError: an address that is not ``HOST:PORT`` on this machine's loopback.
    """
    env = os.environ if env is None else env
    ports = [relay.parse_reach(address) for address in reach]
    oracle = env.get(KERASTUNER_ORACLE_IP), env.get(KERASTUNER_ORACLE_PORT)
    if all(oracle) and "chief" not in env.get(KERASTUNER_TUNER_ID, "chief"):
        address = f"{oracle[0]}:{oracle[1]}"
        try:
            port = relay.parse_reach(address)
        except ValueError:
            pass  # an oracle on another machine: that is the network's to reach
        else:
            if port not in ports:
                ports.append(port)
                _say_once(f"KerasTuner's oracle at {address} is reached from the workers", wording)
    if ports:
        _say_once(
            "workers reach this machine's "
            + ", ".join(f"127.0.0.1:{p}" for p in ports)
            + f" at the same address ({(wording or ARGUMENTS).reach})",
            wording,
        )
    return list(dict.fromkeys(ports))


def say(message: str, level: int = logging.INFO) -> None:
    """Gives a launch notice (``mirrorkit: ...`` on stderr by default; `mirrorkit.notices`).

    Not the chief's alone: every node's launcher reports its own workers.
    """
    notices.say(message, level)


def _say_once(message: str, wording: Wording | None) -> None:
    """Says a launch notice the first time this process gives it; nothing without `wording`.

    A notebook's second `mk.launch` with the same settings stays quiet; a
    notice whose text changed (other CPUs, another worker count) is said again.
    """
    if wording is not None and notices.first_time(message):
        say(message, logging.WARNING if message.startswith("WARNING") else logging.INFO)
