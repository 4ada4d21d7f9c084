"""A private network namespace for the workers of a local launch (Linux).

TensorFlow's worker gRPC server has no authentication and listens on every
interface whatever TF_CONFIG says (tensorflow/tensorflow#11689), so the port of
a local multi-worker job would run graphs for anyone who reaches it. Inside a
new network namespace there is only a loopback interface: the workers reach
each other on 127.0.0.1 and nothing outside the job reaches them. A root
process creates the namespace directly; another user gets one inside a new
user namespace (``unshare -rn``), where the kernel allows it.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import socket
import struct
import subprocess
import sys

_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1


def enter() -> None:
    """Moves this (single-threaded) process into a new network namespace with loopback up.

    Raises:
        OSError: the kernel refused (no permission, or not Linux).
    """
    if not sys.platform.startswith("linux"):
        raise OSError("network namespaces need Linux")
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNET if uid == 0 else _CLONE_NEWNET | _CLONE_NEWUSER
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")
    if uid != 0:
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"{uid} {uid} 1")
        _write("/proc/self/gid_map", f"{gid} {gid} 1")
    _loopback_up()


@functools.lru_cache(maxsize=1)
def check() -> str | None:
    """Returns None when a private network namespace can be made here, else why not."""
    probe = subprocess.run(
        [sys.executable, "-c", "from mirrorkit.launcher import netns; netns.enter()"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if probe.returncode == 0:
        return None
    lines = probe.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {probe.returncode}"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | _IFF_UP))
