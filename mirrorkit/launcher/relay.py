"""Services on this machine for workers in a private network namespace (``--reach``).

The workers of a local launch run in a network namespace of their own (`netns`)
whose only interface is its own loopback: 127.0.0.1 there is not this
machine's 127.0.0.1, so a service the user runs here (KerasTuner's oracle, a
tracking server, an object store) is out of their reach. For each port to
reach, the sandbox that owns the namespace opens a listening socket on
127.0.0.1:PORT *inside* it and hands the socket to the launcher (a socket
keeps the namespace it was made in). The launcher, in this machine's network,
accepts the workers' connections on it and connects each one to
127.0.0.1:PORT here, copying bytes both ways. Nothing outside the job can use
the relay: its listening side exists only inside the namespace.

Example:
```python
from mirrorkit.launcher import relay

assert relay.parse_reach("127.0.0.1:8000") == 8000
assert relay.parse_reach("localhost:8000") == 8000
```
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
from collections.abc import Sequence

from mirrorkit import notices

#: Host names that mean this machine's loopback.
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")
_CHUNK = 1 << 16


def parse_reach(text: str) -> int:
    """The port of a ``HOST:PORT`` on this machine's loopback, from ``--reach`` or ``reach=``.

    Args:
        text: ``127.0.0.1:PORT`` or ``localhost:PORT``.

    Returns:
        PORT.

    Raises:
        ValueError: not ``HOST:PORT``, or HOST is not this machine's loopback.
    """
    host, sep, port = str(text).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"reach {text!r} is not HOST:PORT; give the address of a service on this machine, "
            "e.g. 127.0.0.1:8000"
        )
    if not _is_loopback(host):
        raise ValueError(
            f"reach {text!r}: {host} is not this machine's loopback. The workers' private "
            "network reaches services on this machine only (127.0.0.1:PORT); for a service "
            "on another machine, run the workers in this machine's network (--shared-network, "
            "or private_network=False)."
        )
    return int(port)


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_listeners(channel_fd: int, ports: Sequence[int]) -> None:
    """In the sandbox: listens on 127.0.0.1:PORT inside the namespace, for the launcher.

    The listening sockets go to the launcher over `channel_fd` (a Unix socket).

    Raises:
        OSError: a port could not be listened on inside the namespace.
    """
    with socket.socket(fileno=channel_fd) as channel:
        listeners = [socket.create_server(("127.0.0.1", port)) for port in ports]
        socket.send_fds(channel, [b"listeners"], [s.fileno() for s in listeners])
        for listener in listeners:
            listener.close()  # the launcher holds them now


class Relay:
    """In the launcher: relays the workers' connections to services on this machine.

    Args:
        ports: the ports on this machine's 127.0.0.1 the workers reach; none
            makes a relay that does nothing.

    Attributes:
        channel_fd: the descriptor the sandbox receives to send its listeners (None
            without ports).
        pass_fds: what the sandbox's ``subprocess.Popen`` passes on.
    """

    def __init__(self, ports: Sequence[int]):
        self.ports = list(ports)
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        self.channel_fd, self.pass_fds = None, ()
        if self.ports:
            self._ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sockets += [self._ours, theirs]
            self.channel_fd, self.pass_fds = theirs.fileno(), (theirs.fileno(),)

    def start(self) -> None:
        """Once the sandbox started: serves its listeners on threads of this process.

        Closes the launcher's copy of the sandbox's end first, then waits for the
        listeners in a thread.
        """
        if not self.ports:
            return
        self._sockets.pop().close()  # the sandbox's end: it has its own copy
        threading.Thread(target=self._receive, name="mirrorkit-relay", daemon=True).start()

    def close(self) -> None:
        """Stops accepting; connections in flight end with the workers."""
        self._closed.set()
        for sock in self._sockets:
            sock.close()

    def _receive(self) -> None:
        try:
            _, fds, _, _ = socket.recv_fds(self._ours, 64, len(self.ports))
        except OSError:
            return  # the launch ended before the sandbox sent them
        for port, fd in zip(self.ports, fds, strict=False):
            listener = socket.socket(fileno=fd)
            self._sockets.append(listener)
            threading.Thread(
                target=self._accept, args=(listener, port), name=f"relay-{port}", daemon=True
            ).start()

    def _accept(self, listener: socket.socket, port: int) -> None:
        while not self._closed.is_set():
            try:
                inside, _ = listener.accept()
            except OSError:
                return
            try:
                here = socket.create_connection(("127.0.0.1", port))
            except OSError as err:
                inside.close()
                if notices.first_time(f"relay-refused-{port}"):
                    notices.say(
                        f"WARNING: a worker's connection to 127.0.0.1:{port} (reach) failed: "
                        f"{err.strerror}. Start the service on this machine's 127.0.0.1:{port}, "
                        "or check the port.",
                        logging.WARNING,
                    )
                continue
            threading.Thread(target=_connect, args=(inside, here), daemon=True).start()


def _connect(inside: socket.socket, here: socket.socket) -> None:
    """Copies both ways until both sides have ended, then closes both."""
    back = threading.Thread(target=_copy, args=(here, inside), daemon=True)
    back.start()
    _copy(inside, here)
    back.join()
    inside.close()
    here.close()


def _copy(source: socket.socket, sink: socket.socket) -> None:
    """Copies until `source` ends, then ends `sink`'s writing side."""
    try:
        while chunk := source.recv(_CHUNK):
            sink.sendall(chunk)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
