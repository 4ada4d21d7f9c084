"""Services on this machine for workers in the private network: `--reach` and KerasTuner's oracle.

Real launches (`mirrorkit launch -n 2`, two worker processes in the namespace)
against a real TCP service on this machine's 127.0.0.1; the workers' script
needs no TensorFlow, so each launch takes a few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest
from _quoted import assert_quoted_in, quoted_block

from mirrorkit.launcher import local_job, netns

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r"""
import json, os, socket, sys
port, out = int(sys.argv[1]), sys.argv[2]
rank = os.environ["MIRRORKIT_WORKER"]
try:
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(f"hello from {rank}\n".encode())
        answer = sock.makefile().readline().strip()
except OSError as err:
    answer = f"error: {type(err).__name__}"
with open(os.path.join(out, rank), "w") as f:
    json.dump(answer, f)
"""

private_network = pytest.mark.skipif(
    netns.check() is not None, reason="no private network namespace here"
)


class EchoService:
    """A line-echo TCP service on this machine's 127.0.0.1 (answers ``echo: LINE``)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self.connections += 1
            with conn:
                line = conn.makefile().readline()
                conn.sendall(f"echo: {line}".encode())

    def close(self):
        self.server.close()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(tmp_path, port, *flags, env=None):
    script = tmp_path / "reach_service.py"
    script.write_text(SCRIPT)
    out = tmp_path / ("out" + "".join(f.strip("-") for f in flags if f.startswith("-")))
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "mirrorkit", "launch", "-n", "2", *flags, str(script)]
        + [str(port), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = {name: json.loads((out / name).read_text()) for name in os.listdir(out)}
    return answers, done.stderr


@private_network
def test_workers_reach_a_service_on_this_machine_with_reach_and_not_without(tmp_path):
    service = EchoService()
    try:
        answers, said = _launch(tmp_path, service.port)
        assert answers == {"0": "error: ConnectionRefusedError", "1": answers["1"]}
        assert answers["1"] == "error: ConnectionRefusedError"
        address = f"127.0.0.1:{service.port}"
        answers, said = _launch(tmp_path, service.port, "--reach", address)
        assert answers == {"0": "echo: hello from 0", "1": "echo: hello from 1"}
        assert service.connections == 2
        assert f"workers reach this machine's {address} at the same address (--reach)" in said
        assert_quoted_in(quoted_block("multi-worker.md", "The launcher says so:"), said)
    finally:
        service.close()


@private_network
def test_a_keras_tuner_workers_oracle_on_this_machine_is_reached_without_asking(tmp_path):
    service = EchoService()  # stands in for the oracle: any TCP service on its port
    oracle = {
        "KERASTUNER_TUNER_ID": "tuner0",
        "KERASTUNER_ORACLE_IP": "127.0.0.1",
        "KERASTUNER_ORACLE_PORT": str(service.port),
    }
    try:
        answers, said = _launch(tmp_path, service.port, env=oracle)
        assert answers == {"0": "echo: hello from 0", "1": "echo: hello from 1"}
        assert f"KerasTuner's oracle at 127.0.0.1:{service.port} is reached" in said
        assert_quoted_in(quoted_block("tuning.md", "What you will see from the launch:"), said)
    finally:
        service.close()


@private_network
def test_a_refused_connection_is_said_once_and_the_worker_sees_the_connection_end(tmp_path):
    port = _free_port()  # nothing listens there on this machine
    answers, said = _launch(tmp_path, port, "--reach", f"localhost:{port}")
    # Connected inside, then ended by the relay: an end of stream, or a reset when the relay
    # closed with the worker's line still unread (which of the two is a race). Never a hang.
    assert set(answers) == {"0", "1"}
    assert set(answers.values()) <= {"", "error: ConnectionResetError"}, answers
    assert said.count(f"a worker's connection to 127.0.0.1:{port} (reach) failed") == 1


def test_reach_addresses_are_checked_and_the_oracle_is_added_only_for_a_tuner_worker():
    plan = local_job.plan_reach
    assert plan(["127.0.0.1:8000", "localhost:8000", "[::1]:9000"], None, env={}) == [8000, 9000]
    for bad, says in [
        ("8000", "is not HOST:PORT"),
        ("127.0.0.1:http", "is not HOST:PORT"),
        ("127.0.0.1:70000", "is not HOST:PORT"),
        ("10.1.2.3:8000", "10.1.2.3 is not this machine's loopback"),
        ("example.com:8000", "--shared-network"),
    ]:
        with pytest.raises(ValueError, match=says):
            plan([bad], None, env={})
    oracle = {"KERASTUNER_ORACLE_IP": "127.0.0.1", "KERASTUNER_ORACLE_PORT": "8000"}
    assert plan([], None, env={**oracle, "KERASTUNER_TUNER_ID": "tuner0"}) == [8000]
    assert plan([], None, env={**oracle, "KERASTUNER_TUNER_ID": "chief"}) == []  # it serves
    elsewhere = {**oracle, "KERASTUNER_ORACLE_IP": "10.1.2.3", "KERASTUNER_TUNER_ID": "tuner0"}
    assert plan([], None, env=elsewhere) == []  # another machine: the network's to reach
