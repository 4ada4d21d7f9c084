"""Free loopback ports for worker gRPC servers: asked of the kernel, never fixed."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Returns `count` distinct ports that are free on `host` right now.

    The sockets are held until all ports are chosen, so the ports differ from
    each other; between this call and the workers binding them another
    program could take one, in which case TensorFlow's server fails to start
    and the launch fails with that worker's error (never a silent hang).

    Args:
        count: how many ports.
        host: the address to probe.

    Returns:
        A list of port numbers.

    Example:
    ```python
    from mirrorkit.launcher.ports import free_ports

    assert len(set(free_ports(3))) == 3
    ```
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def local_addresses(num_workers: int, host: str = "127.0.0.1") -> list[str]:
    """Returns `num_workers` loopback addresses with free ports."""
    return [f"{host}:{port}" for port in free_ports(num_workers, host)]
