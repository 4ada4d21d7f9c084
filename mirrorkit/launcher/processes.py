"""Run a Python function in N fresh processes, stream their output, collect results.

The process mechanism under every launch (`local_job.run_job` plans the job
and calls it) and under the suite's fresh single processes: each
process is a new interpreter (never a fork, so TensorFlow starts clean and can
take a new device configuration), the function travels with `cloudpickle`
(functions defined in a notebook or ``__main__`` included), every output line
is prefixed with its worker, and the first failure stops the rest.
"""

from __future__ import annotations

import collections
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, BinaryIO, TextIO

import cloudpickle

from mirrorkit.environment_variables import PYTHONPATH, PYTHONUNBUFFERED, TF_CPP_MIN_LOG_LEVEL
from mirrorkit.launcher import allocator, pinning, relay, tf_noise

#: Output lines of each worker kept for the error message of a failed worker.
TAIL_LINES = 60

#: How long a worker has to exit after SIGTERM before it is killed.
TERMINATE_GRACE_S = 5.0

#: The same once another worker has failed. Its peers wait in a collective that can no longer
#: complete, and TensorFlow's preemption notifier swallows their SIGTERM; left running, each
#: raises an error of its own when the dead peer's heartbeats time out (10 s), which would
#: bury the failing worker's traceback under theirs.
PEER_FAILED_GRACE_S = 1.0


class WorkerError(RuntimeError):
    """A worker process failed; carries its index, exit code and traceback.

    Attributes:
        worker: the index of the first worker that failed.
        exit_code: its exit code (negative: killed by that signal).
        worker_traceback: the traceback it printed, if it raised.
    """

    def __init__(self, worker: int, exit_code: int, worker_traceback: str = ""):
        self.worker = worker
        self.exit_code = exit_code
        self.worker_traceback = worker_traceback
        detail = f"\n\nWorker {worker}'s traceback:\n{worker_traceback}" if worker_traceback else ""
        super().__init__(f"worker {worker} failed with exit code {exit_code}{detail}")


def run_function(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    *,
    num_processes: int = 1,
    env: Callable[[int], Mapping[str, str]] | None = None,
    timeout_s: float | None = None,
    stream: TextIO | None = None,
    prefix: str = "w",
    cpus: Sequence[Sequence[int]] | None = None,
    private_network: bool = False,
    reach: Sequence[int] = (),
) -> list[Any]:
    """Calls ``fn(*args)`` once in each of N fresh Python processes.

    Args:
        fn: the function; defined anywhere, a notebook cell included.
        args: positional arguments, the same for every process.
        num_processes: how many processes to start.
        env: ``env(i)`` returns extra environment variables for process i.
        timeout_s: stop every process and raise `TimeoutError` after this long.
        stream: where output lines go (``[w0] ...``); `sys.stdout` when None.
        prefix: the label before each process's index in output lines.
        cpus: ``cpus[i]`` are the only CPUs process i may run on.
        private_network: run the processes in one new network namespace.
        reach: as `run_commands`'s.

    Returns:
        Each process's return value, in process order.

    Raises:
        WorkerError: the first process that failed, with its traceback; the
            others are stopped first.
        TimeoutError: the processes did not finish in ``timeout_s``.

    Example:
    ```python
    from mirrorkit.launcher.processes import run_function

    def replicas():
        import mirrorkit as mk
        return mk.strategy(cpu_replicas=2).num_replicas_in_sync

    assert run_function(replicas) == [2]
    ```
    """
    with tempfile.TemporaryDirectory(prefix="mirrorkit-") as workdir:
        payload = os.path.join(workdir, "payload.pkl")
        with open(payload, "wb") as f:
            cloudpickle.dump((fn, tuple(args)), f)
        results = [os.path.join(workdir, f"result-{i}.pkl") for i in range(num_processes)]
        commands = [
            [sys.executable, "-m", "mirrorkit.launcher._child", payload, results[i]]
            for i in range(num_processes)
        ]
        try:
            run_commands(
                commands,
                env=env,
                timeout_s=timeout_s,
                stream=stream,
                prefix=prefix,
                cpus=cpus,
                private_network=private_network,
                reach=reach,
            )
        except WorkerError as err:
            raise WorkerError(
                err.worker, err.exit_code, _read_error(results[err.worker]) or err.worker_traceback
            ) from None
        return [_read_value(path, i) for i, path in enumerate(results)]


def run_commands(
    commands: Sequence[Sequence[str]],
    *,
    env: Callable[[int], Mapping[str, str]] | None = None,
    timeout_s: float | None = None,
    stream: TextIO | None = None,
    prefix: str = "w",
    log_dir: str | None = None,
    cpus: Sequence[Sequence[int]] | None = None,
    private_network: bool = False,
    first: int = 0,
    reach: Sequence[int] = (),
) -> None:
    """Runs one command per worker, streams prefixed output, fails fast.

    Every worker is killed if this process dies (Linux), so none outlives
    its launcher.

    Args:
        commands: ``commands[i]`` is worker i's argument vector.
        env: ``env(i)`` returns extra environment variables for worker i.
        timeout_s: stop every worker and raise `TimeoutError` after this long.
        stream: where output lines go; `sys.stdout` when None.
        prefix: the label before each worker's index in output lines.
        log_dir: also write worker i's output, unprefixed, to
            ``log_dir/worker-N.log``, N = `first` + i.
        cpus: ``cpus[i]`` are the only CPUs worker i may run on, with
            TensorFlow's thread pools sized to match (see `pinning`).
        private_network: run every worker inside one new network namespace
            (see `netns`), so their servers are unreachable from outside.
        first: the job-wide rank of worker 0 here, which output prefixes and
            log names count from (a host's or Slurm node's first worker).
        reach: ports on this machine's 127.0.0.1 that workers in a private
            network reach at the same address (`relay`).

    Raises:
        WorkerError: the first worker that exited non-zero (its last output
            lines attached); every other worker was stopped first.
        TimeoutError: the workers did not finish in ``timeout_s``.
    """
    envs = [_worker_env(env, cpus, i) for i in range(len(commands))]
    commands = [_pinned(command, cpus[i] if cpus else None) for i, command in enumerate(commands)]
    if private_network:
        _run_in_private_network(commands, envs, timeout_s, stream, prefix, log_dir, first, reach)
        return
    procs = []
    logs = _open_logs(log_dir, len(commands), first)
    try:
        for command, extra_env in zip(commands, envs, strict=True):
            procs.append(_start(command, extra_env))
        failed, tails = _supervise(procs, stream or sys.stdout, prefix, timeout_s, logs, first)
    except BaseException:
        stop(procs)
        raise
    finally:
        for log in logs:
            log.close()
    if failed is not None:
        raise WorkerError(failed, procs[failed].returncode, "\n".join(tails[failed]))


def _worker_env(
    env: Callable[[int], Mapping[str, str]] | None, cpus: Sequence[Sequence[int]] | None, i: int
) -> dict[str, str]:
    extra = dict(env(i)) if env else {}
    for name, value in allocator.malloc_env().items():
        extra.setdefault(name, value)
    if cpus:
        for name, value in pinning.thread_env(len(cpus[i])).items():
            if name not in os.environ:  # the user's own thread settings win
                extra.setdefault(name, value)
    return extra


def _pinned(command: Sequence[str], cpus: Sequence[int] | None) -> list[str]:
    """Wraps `command` so it dies with this process and, given `cpus`, runs only on them."""
    pin = ["--cpus", ",".join(map(str, cpus))] if cpus else []
    return [sys.executable, "-m", "mirrorkit.launcher._exec", *pin, "--", *command]


def _open_logs(log_dir: str | None, count: int, first: int = 0) -> list[BinaryIO]:
    if log_dir is None:
        return []
    os.makedirs(log_dir, exist_ok=True)
    return [open(os.path.join(log_dir, f"worker-{first + i}.log"), "wb") for i in range(count)]


def _run_in_private_network(
    commands: list[list[str]],
    envs: list[dict[str, str]],
    timeout_s: float | None,
    stream: TextIO | None,
    prefix: str,
    log_dir: str | None,
    first: int = 0,
    reach: Sequence[int] = (),
) -> None:
    """Runs `run_commands` in a sandbox process that owns a new network namespace."""
    services = relay.Relay(reach)
    with tempfile.TemporaryDirectory(prefix="mirrorkit-") as workdir:
        spec = os.path.join(workdir, "spec.json")
        result = os.path.join(workdir, "result.json")
        with open(spec, "w") as f:
            json.dump(
                {
                    "commands": commands,
                    "envs": envs,
                    "timeout_s": timeout_s,
                    "prefix": prefix,
                    "log_dir": log_dir and os.path.abspath(log_dir),
                    "first": first,
                    "reach": list(reach),
                    "relay_fd": services.channel_fd,
                },
                f,
            )
        sandbox = [sys.executable, "-m", "mirrorkit.launcher._sandbox", spec, result]
        procs = [_start(_pinned(sandbox, None), {}, pass_fds=services.pass_fds)]
        services.start()
        try:
            _supervise(procs, stream or sys.stdout, None, None, [])
        except BaseException:
            stop(procs, grace_s=TERMINATE_GRACE_S + 5)  # the sandbox stops its workers first
            raise
        finally:
            services.close()
        try:
            with open(result) as f:
                outcome = json.load(f)
        except (OSError, ValueError):
            raise WorkerError(-1, procs[0].returncode, "the launch sandbox failed") from None
    if outcome["status"] == "failed":
        raise WorkerError(outcome["worker"], outcome["exit_code"], outcome["tail"])
    if outcome["status"] == "timeout":
        raise TimeoutError(outcome["message"])
    if outcome["status"] == "interrupted":
        raise KeyboardInterrupt


def _start(
    command: Sequence[str], extra_env: Mapping[str, str], pass_fds: Sequence[int] = ()
) -> subprocess.Popen:
    env = dict(os.environ)
    env.update(extra_env)
    env.setdefault(TF_CPP_MIN_LOG_LEVEL, "2")
    env[PYTHONUNBUFFERED] = "1"
    # The child sees the same modules as the caller (tests, a notebook's cwd).
    paths = [p or os.getcwd() for p in sys.path]
    env[PYTHONPATH] = os.pathsep.join(dict.fromkeys(paths))
    return subprocess.Popen(
        list(command),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        pass_fds=tuple(pass_fds),
    )


def _supervise(
    procs: list[subprocess.Popen],
    stream: TextIO,
    prefix: str | None,
    timeout_s: float | None,
    logs: Sequence[BinaryIO],
    first: int = 0,
) -> tuple[int | None, list[collections.deque]]:
    """Streams output until all exit; returns the first failed index and output tails.

    A `prefix` of None passes lines through unlabelled (they already are); labels count
    from `first`.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    drop_tf_noise = not tf_noise.keep_startup_lines()
    selector = selectors.DefaultSelector()
    for i, proc in enumerate(procs):
        selector.register(proc.stdout, selectors.EVENT_READ, i)
    partial = [b""] * len(procs)
    tails = [collections.deque(maxlen=TAIL_LINES) for _ in procs]
    open_pipes = len(procs)
    failed = None
    while open_pipes or any(p.poll() is None for p in procs):
        if deadline is not None and time.monotonic() > deadline:
            running = [i for i, p in enumerate(procs) if p.poll() is None]
            stop(procs)
            raise TimeoutError(
                f"workers did not finish within {timeout_s:g} s: {_still_running(running, procs)} "
                "still running; all were stopped"
            )
        for key, _ in selector.select(timeout=0.2) if open_pipes else []:
            i = key.data
            chunk = os.read(key.fileobj.fileno(), 65536)
            if not chunk:
                selector.unregister(key.fileobj)
                open_pipes -= 1
                chunk = b"\n" if partial[i] else b""
            lines = (partial[i] + chunk).split(b"\n")
            partial[i] = lines.pop()
            for line in lines:
                _forward(line, i, stream, prefix, logs, tails[i], drop_tf_noise, first)
            stream.flush()
            for log in logs:
                log.flush()
        if not open_pipes:
            time.sleep(0.05)
        if failed is None:
            for i, proc in enumerate(procs):
                if proc.poll() not in (None, 0):
                    failed = i
                    stop(procs, grace_s=PEER_FAILED_GRACE_S)
                    break
    selector.close()
    return failed, tails


def _forward(
    line: bytes,
    i: int,
    stream: TextIO,
    prefix: str | None,
    logs: Sequence[BinaryIO],
    tail: collections.deque,
    drop_tf_noise: bool,
    first: int = 0,
) -> None:
    """Forwards one output line of worker `i`: the one place every worker line passes.

    The line goes to worker i's log file as it is; TensorFlow's known start-up
    lines stop there (see `tf_noise`); every other line is kept for the error
    of a failing worker and written to `stream` with its ``[wN]`` prefix.
    """
    text = line.decode(errors="replace")
    if logs:
        logs[i].write(line + b"\n")
    if drop_tf_noise and tf_noise.is_startup_line(text):
        return
    tail.append(text)
    stream.write(text + "\n" if prefix is None else f"[{prefix}{first + i}] {text}\n")


def _still_running(running: list[int], procs: Sequence[subprocess.Popen]) -> str:
    done = [i for i in range(len(procs)) if i not in running]
    text = f"worker(s) {', '.join(map(str, running))} of {len(procs)} were"
    if done:
        text += f" (worker(s) {', '.join(map(str, done))} had finished)"
    return text


def stop(procs: Sequence[subprocess.Popen], grace_s: float = TERMINATE_GRACE_S) -> None:
    """SIGTERM every live process group, then SIGKILL what is left after `grace_s`."""
    for proc in procs:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read_value(path: str, index: int) -> Any:
    with open(path, "rb") as f:
        status, value = cloudpickle.load(f)
    if status != "ok":
        raise WorkerError(index, 1, value)
    return value


def _read_error(path: str) -> str:
    try:
        with open(path, "rb") as f:
            status, value = cloudpickle.load(f)
    except (OSError, EOFError, cloudpickle.pickle.UnpicklingError):
        return ""
    return value if status == "error" else ""
