"""`mirrorkit launch` and `mk.launch` with real workers."""

import dataclasses
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from _quoted import assert_quoted_in, quoted_block

import mirrorkit as mk
from mirrorkit.launcher.processes import WorkerError

pytestmark = pytest.mark.multiprocess
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args, timeout=240, env=None):
    return subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=env,  # the whole environment, when given
    )


def test_multiworker_quickstart_runs_under_launch(tmp_path):
    logs = tmp_path / "logs"
    done = _launch("-n", "2", "--log-dir", str(logs), "examples/multiworker_quickstart.py")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sums = re.findall(r"\[w(\d)\] worker (\d): weight checksum (\S+)", done.stdout)
    assert sorted((w, i) for w, i, _ in sums) == [("0", "0"), ("1", "1")]
    assert sums[0][2] == sums[1][2]  # the same weights on both workers
    assert "[w0] final: loss" in done.stdout and "[w1] final" not in done.stdout
    # What docs/multi-worker.md quotes of `mirrorkit launch -n 2` (its plan on stderr first).
    quote = quoted_block("multi-worker.md", "The launcher first prints its plan on stderr")
    from mirrorkit.launcher import netns

    if netns.check() is not None:  # the page quotes a machine where the workers get one
        lines = [x for x in quote.lines if "private network namespace" not in x]
        quote = dataclasses.replace(quote, lines=lines)
    assert_quoted_in(quote, done.stderr + done.stdout)
    # --log-dir: one unprefixed log per worker.
    assert sorted(os.listdir(logs)) == ["worker-0.log", "worker-1.log"]
    for i in (0, 1):
        text = (logs / f"worker-{i}.log").read_text()
        assert f"worker {i}: weight checksum {sums[0][2]}" in text and "[w" not in text


FAILING_SCRIPT = """
import os, sys
open(os.path.join(sys.argv[1], str(os.getpid())), "w").close()
import keras, numpy as np
import mirrorkit as mk

class FailAtStep3(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if batch == 3 and mk.describe().worker_index == 1:
            raise RuntimeError("worker 1 breaks at step 3")

strategy = mk.strategy()
with strategy.scope():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
x = np.ones((4096, 4), "float32")
model.fit(x, x[:, :1], batch_size=8, epochs=50, verbose=0, callbacks=[FailAtStep3()])
"""


def test_a_failing_worker_stops_the_launch(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(textwrap.dedent(FAILING_SCRIPT))
    pids = tmp_path / "pids"
    pids.mkdir()
    start = time.monotonic()
    done = _launch("-n", "2", str(script), str(pids), timeout=120)
    elapsed = time.monotonic() - start
    assert done.returncode != 0
    # Worker 0 waits in a collective for its dead peer until the launcher stops it: it never
    # fails by itself (no traceback of its own), and the launch ends long before the timeout
    # (a generous bound: two TensorFlow start-ups on a loaded 2-core machine take most of it).
    assert "[w0] Traceback" not in done.stdout
    assert elapsed < 100
    assert "RuntimeError: worker 1 breaks at step 3" in done.stdout
    assert "worker 1 failed with exit code 1" in done.stderr
    quote = quoted_block("multi-worker.md", "A failed worker is named with its exit code")
    assert_quoted_in(quote, done.stderr)
    assert len(os.listdir(pids)) == 2
    for pid in os.listdir(pids):
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)


DEAF_PEER_SCRIPT = """
import json, os, signal, sys, time
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
if index == 1:
    time.sleep(1)  # worker 0 is deaf by now
    open(os.path.join(sys.argv[1], "failed_at"), "w").write(repr(time.time()))
    sys.exit(1)
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as TensorFlow's preemption notifier does
time.sleep(60)
"""


def test_the_peers_of_a_failed_worker_are_killed_without_the_full_sigterm_grace(tmp_path):
    # A peer of a failed worker waits in a collective that can no longer complete and ignores
    # SIGTERM; within TensorFlow's 10 s heartbeat timeout it would raise an error of its own.
    script = tmp_path / "deaf.py"
    script.write_text(textwrap.dedent(DEAF_PEER_SCRIPT))
    done = _launch("-n", "2", "--no-pin", str(script), str(tmp_path), timeout=120)
    ended = time.time()
    assert done.returncode != 0
    assert "worker 1 failed with exit code 1" in done.stderr, done.stderr
    from mirrorkit.launcher import processes

    waited = ended - float((tmp_path / "failed_at").read_text())
    assert waited < processes.TERMINATE_GRACE_S, waited


KILLED_SCRIPT = """
import json, os, signal, time
if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's OOM killer ends a worker
time.sleep(60)
"""


def test_a_worker_killed_by_a_signal_is_named_with_it(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(KILLED_SCRIPT))
    done = _launch("-n", "2", "--no-pin", str(script), timeout=120)
    assert done.returncode != 0
    quote = quoted_block("failures.md", "the worker's traceback is in its output above:")
    assert_quoted_in(quote, done.stderr)


def _replicas_and_rank():
    import mirrorkit as mk

    strategy = mk.strategy()
    return strategy.num_replicas_in_sync, mk.describe().worker_index, mk.is_chief()


def _raise_on_worker_one():
    import mirrorkit as mk

    if not mk.is_chief():
        raise KeyError("missing on worker 1")
    import time

    time.sleep(60)


def test_mk_launch_raises_with_the_failing_workers_traceback_and_a_cell_run_again_runs_anew():
    with pytest.raises(WorkerError) as err:
        mk.launch(_raise_on_worker_one, num_workers=2, timeout_s=60)
    assert err.value.worker == 1
    assert "KeyError: 'missing on worker 1'" in str(err.value)
    # the notebook's cell run again (docs: notebook/#running-a-cell-again): a fresh job, whose
    # chief's value comes back
    assert mk.launch(_replicas_and_rank, num_workers=2, timeout_s=120) == (2, 0, True)


REPORT_CPUS = """
import json, os, sys
with open(os.path.join(sys.argv[1], os.environ["MIRRORKIT_WORKER"]), "w") as f:
    json.dump([sorted(os.sched_getaffinity(0)), os.environ.get("TF_NUM_INTRAOP_THREADS")], f)
"""


def _cpus_seen(tmp_path, env, *flags):
    script = tmp_path / "cpus.py"
    script.write_text(REPORT_CPUS)
    out = tmp_path / ("out" + "".join(flags))
    out.mkdir()
    done = _launch("-n", "2", *flags, str(script), str(out), timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    return done.stderr, [json.loads((out / str(i)).read_text()) for i in range(2)]


def test_launch_pins_each_worker_to_its_own_cpus(tmp_path, without_suite_threads):
    """The launcher's own thread settings: the suite's (tests/conftest.py) are taken out."""
    machine = sorted(os.sched_getaffinity(0))
    said, seen = _cpus_seen(tmp_path, without_suite_threads)
    if len(machine) >= 2:
        (cpus0, threads0), (cpus1, threads1) = seen
        assert cpus0 and cpus1 and not set(cpus0) & set(cpus1)
        assert sorted(cpus0 + cpus1) == machine
        assert (threads0, threads1) == (str(len(cpus0)), str(len(cpus1)))
        assert said.count("pinning each worker to its own CPUs") == 1
    else:
        assert "not pinning: 2 workers but only 1 CPUs" in said
    said, seen = _cpus_seen(tmp_path, without_suite_threads, "--no-pin")
    assert [cpus for cpus, _ in seen] == [machine, machine]
    assert "pinning" not in said


REPORT_MALLOC = """
import json, os, sys
from mirrorkit.launcher.allocator import MALLOC_ENV
with open(os.path.join(sys.argv[1], os.environ["MIRRORKIT_WORKER"]), "w") as f:
    json.dump({name: os.environ.get(name) for name in MALLOC_ENV}, f)
"""


@pytest.mark.skipif(sys.platform != "linux", reason="glibc malloc settings are Linux-only")
def test_workers_keep_freed_memory_unless_the_user_chose_malloc_settings(tmp_path):
    from mirrorkit.launcher.allocator import MALLOC_ENV

    script = tmp_path / "malloc.py"
    script.write_text(REPORT_MALLOC)
    for name, user_env in (("ours", {}), ("theirs", {"MALLOC_TOP_PAD_": "0"})):
        out = tmp_path / name
        out.mkdir()
        env = _without(MALLOC_ENV, user_env)
        done = _launch("-n", "2", str(script), str(out), timeout=60, env=env)
        assert done.returncode == 0, done.stderr
        seen = [json.loads((out / str(i)).read_text()) for i in range(2)]
        if user_env:  # the user's choice passes through, and nothing is added to it
            expected = {key: user_env.get(key) for key in MALLOC_ENV}
            assert "keep freed memory" not in done.stderr
        else:
            expected = MALLOC_ENV
            assert done.stderr.count("workers keep freed memory for reuse") == 1
        assert seen == [expected, expected]


def _without(names, env):
    """This process's environment without `names`, plus `env`."""
    return {**{k: v for k, v in os.environ.items() if k not in names}, **env}


HOLD_SERVER = """
import os, sys, time
import mirrorkit as mk
mk.strategy()  # starts this worker's TensorFlow gRPC server
with open(os.path.join(sys.argv[1], os.environ["MIRRORKIT_WORKER"]), "w") as f:
    f.write(os.environ["TF_CONFIG"])
deadline = time.time() + 90
while not os.path.exists(os.path.join(sys.argv[1], "done")) and time.time() < deadline:
    time.sleep(0.2)
"""


def _listening_ports():
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                local, state = row.split()[1], row.split()[3]
                if state == "0A":  # LISTEN
                    ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _worker_ports_reachable_from_outside(tmp_path, *flags):
    """Starts 2 workers that hold their servers open; checks their ports from this process."""
    script = tmp_path / "hold.py"
    script.write_text(HOLD_SERVER)
    out = tmp_path / ("out" + "".join(flags))
    out.mkdir()
    job = subprocess.Popen(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", *flags, str(script), str(out)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while len([p for p in os.listdir(out) if p != "done"]) < 2:
            assert job.poll() is None and time.monotonic() < deadline, "workers did not start"
            time.sleep(0.2)
        config = json.loads((out / "0").read_text())
        ports = {int(a.rsplit(":", 1)[1]) for a in config["cluster"]["worker"]}
        listening = ports & _listening_ports()
        connectable = set()
        for port in ports:
            with socket.socket() as sock:
                sock.settimeout(2)
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    connectable.add(port)
        return listening, connectable
    finally:
        (out / "done").touch()
        _, said = job.communicate(timeout=60)
        assert job.returncode == 0, said


def test_local_workers_are_unreachable_from_outside_the_job(tmp_path):
    from mirrorkit.launcher import netns

    if netns.check() is None:
        assert _worker_ports_reachable_from_outside(tmp_path) == (set(), set())
    # The same check sees the servers when they share this machine's network.
    listening, connectable = _worker_ports_reachable_from_outside(tmp_path, "--shared-network")
    assert len(listening) == 2 and len(connectable) == 2


def test_launch_warns_when_no_private_network_is_possible(monkeypatch, capfd):
    from mirrorkit.launcher import hosts, local_job, netns

    monkeypatch.setattr(netns, "check", lambda: "unshare: Operation not permitted")
    job = hosts.Layout(("127.0.0.1:1", "127.0.0.1:2"), 0, 2, False)
    assert local_job.plan_network(job, True) is False
    said = capfd.readouterr().err
    assert "WARNING: could not make a private network namespace (unshare: Operation" in said
    assert "no authentication and listen on every interface" in said
    quote = quoted_block("multi-worker.md", "Where that is impossible, the launcher warns")
    assert_quoted_in(quote, said)


def test_two_hosts_on_loopback_train_together(tmp_path):
    from mirrorkit.launcher.ports import free_ports

    port_a, port_b = free_ports(2)
    hosts = f"127.0.0.1:{port_a},127.0.0.2:{port_b}"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mirrorkit",
                "launch",
                "-n",
                "1",
                "--nnodes",
                "2",
                "--node-rank",
                str(rank),
                "--hosts",
                hosts,
                "examples/multiworker_quickstart.py",
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=240) for node in nodes]
    for node, (out, err) in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, out[-2000:] + err[-2000:]
        assert "WARNING: multi-host job" in err
    sums = [re.search(r"worker (\d): weight checksum (\S+)", out).groups() for out, _ in outputs]
    assert [rank for rank, _ in sums] == ["0", "1"] and sums[0][1] == sums[1][1]


def test_quickstart_example_runs():
    done = subprocess.run(
        [sys.executable, "examples/quickstart.py"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "final: test loss" in done.stdout and "examples/s" in done.stdout


# --- one local-job function for every caller; its notices in the caller's words ---------------


def _notices_of_a_launch(monkeypatch, capsys, start):
    """What a launch says before it starts its workers (none are started here)."""
    from mirrorkit import notices
    from mirrorkit.launcher import pinning, processes

    monkeypatch.setattr(notices, "_said", set())
    monkeypatch.setattr(pinning, "split_cpus", lambda n: [[0], [1]][:n])  # pinning possible
    started = []
    monkeypatch.setattr(processes, "run_function", lambda *a, **k: started.append(k) or [None])
    monkeypatch.setattr(processes, "run_commands", lambda *a, **k: started.append(k))
    start()
    assert len(started) == 1  # the one launch went through run_job to the process layer
    return capsys.readouterr().err


def test_mk_launch_notices_name_its_arguments_not_cli_flags(monkeypatch, capsys):
    said = _notices_of_a_launch(
        monkeypatch, capsys, lambda: mk.launch(print, num_workers=2, private_network=False)
    )
    assert "pin_cpus=False turns this off" in said
    assert "WARNING: private_network=False." in said
    assert "--" not in said  # no command-line flag


def test_cli_launch_notices_name_its_flags(monkeypatch, capsys, tmp_path):
    from mirrorkit.commands import cli, launch

    target = tmp_path / "train.py"
    target.write_text("pass\n")
    args = cli.build_parser().parse_args(["launch", "-n", "2", "--shared-network", str(target)])
    said = _notices_of_a_launch(monkeypatch, capsys, lambda: launch.run(args))
    assert "--no-pin turns this off" in said and "WARNING: --shared-network." in said
    assert "pin_cpus" not in said and "private_network" not in said


def test_run_job_refuses_a_log_dir_for_a_function(tmp_path):
    from mirrorkit.launcher import local_job

    with pytest.raises(ValueError, match="log_dir= writes the output of a command's workers"):
        local_job.run_job(print, 2, log_dir=str(tmp_path))


def test_launch_itself_imports_neither_tensorflow_nor_keras(tmp_path):
    """The launcher process starts workers; importing TensorFlow there cost ~7 s of CPU a launch."""
    script = tmp_path / "noop.py"
    script.write_text("print('worker ran')\n")
    code = (
        "import sys\nfrom mirrorkit.commands.cli import main\n"
        f"status = main(['launch', '-n', '1', {str(script)!r}])\n"
        "print('status', status, 'imported', 'tensorflow' in sys.modules or 'keras' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "worker ran" in done.stdout, done.stdout + done.stderr
    assert "status 0 imported False" in done.stdout, done.stdout + done.stderr
