"""Two "hosts" on one machine for multi-host tests: network namespaces joined by a veth pair.

Each host is a network namespace held open by a small process of the test's
own (never a named ``ip netns``, never an interface in this machine's
namespace): host k gets ``10.200.0.{k+1}/24`` on its end of one veth pair, a
private subnet with no route out, so no packet leaves the machine. `cut`
takes host 1's end of the link down (no RST, no FIN: packets are simply
lost, as when a cable is pulled or a switch port dies); `restore` brings it
back. Closing the pair (or the test process dying, which closes the holders'
stdin) ends the holders and the kernel deletes the namespaces and the veth.

Where namespaces cannot be made (no root, no ``ip``), `Hosts` falls back to
two loopback addresses, 127.0.0.1 and 127.0.0.2, in this machine's network;
there is no link to cut then, so `cut` freezes host 1 instead (SIGSTOP to its
launcher and workers): its peers see the same silence, no connection is
reset, and `restore` thaws it. ``MIRRORKIT_TEST_HOSTS=loopback`` forces the
fallback (to check it on a machine that has namespaces).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

#: Each host's address in the namespace mode.
NETNS_ADDRESSES = ("10.200.0.1", "10.200.0.2")
#: Each host's address in the loopback fallback.
LOOPBACK_ADDRESSES = ("127.0.0.1", "127.0.0.2")
#: The veth end's name inside each host.
LINK = "mk0"

# Holds a new network namespace open until its stdin closes (root only: CLONE_NEWNET).
_HOLDER = """
import ctypes, os, sys
if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:
    sys.exit("unshare(CLONE_NEWNET): " + os.strerror(ctypes.get_errno()))
print("ready", flush=True)
sys.stdin.read()
"""


def _run(argv: Sequence[str]) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


class Hosts:
    """Two hosts, as network namespaces (``mode == "netns"``) or loopback addresses.

    Attributes:
        mode: ``"netns"`` or ``"loopback"``.
        addresses: each host's IP address.
        why_loopback: why namespaces could not be made (loopback mode only).
    """

    def __init__(self) -> None:
        self._holders: list[subprocess.Popen] = []
        self._frozen: list[int] = []
        self.why_loopback = ""
        try:
            self._make_namespaces()
            self.mode, self.addresses = "netns", NETNS_ADDRESSES
        except OSError as err:
            self.close()
            self.mode, self.addresses = "loopback", LOOPBACK_ADDRESSES
            self.why_loopback = str(err)

    def _make_namespaces(self) -> None:
        if os.environ.get("MIRRORKIT_TEST_HOSTS") == "loopback":
            raise OSError("MIRRORKIT_TEST_HOSTS=loopback")
        if os.geteuid() != 0 or not sys.platform.startswith("linux"):
            raise OSError("network namespaces need root on Linux")
        for tool in ("ip", "nsenter"):
            if shutil.which(tool) is None:
                raise OSError(f"no {tool} command (iproute2 / util-linux)")
        for _ in NETNS_ADDRESSES:
            holder = subprocess.Popen(
                [sys.executable, "-c", _HOLDER],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            self._holders.append(holder)
            if holder.stdout.readline().strip() != "ready":
                raise OSError(holder.stderr.read().strip() or "namespace holder failed")
        peer = str(self._holders[1].pid)
        # Made inside host 0 with its peer moved straight into host 1: never in this namespace.
        veth = f"ip link add {LINK} type veth peer name {LINK} netns {peer}"
        _run([*self.enter(0), *veth.split()])
        for host, address in enumerate(NETNS_ADDRESSES):
            _run([*self.enter(host), "ip", "link", "set", "lo", "up"])
            _run([*self.enter(host), "ip", "addr", "add", f"{address}/24", "dev", LINK])
            _run([*self.enter(host), "ip", "link", "set", LINK, "up"])

    def enter(self, host: int) -> list[str]:
        """The command prefix that runs a command inside `host` (empty on loopback)."""
        if not self._holders:
            return []
        return ["nsenter", "-t", str(self._holders[host].pid), "-n", "--"]

    def cut(self, host: int, pids: Iterable[int] = ()) -> None:
        """Cuts `host` off: its link goes down, or (loopback) `pids` are frozen."""
        if self.mode == "netns":
            _run([*self.enter(host), "ip", "link", "set", LINK, "down"])
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
                self._frozen.append(pid)
            except ProcessLookupError:
                pass

    def restore(self, host: int) -> None:
        """Brings `host`'s link back up (namespaces); thaws frozen processes (loopback)."""
        if self.mode == "netns":
            _run([*self.enter(host), "ip", "link", "set", LINK, "up"])
            deadline = time.monotonic() + 10  # until the peer answers again
            while time.monotonic() < deadline and not self.reachable(host, 1 - host):
                time.sleep(0.2)
            return
        self._thaw()

    def reachable(self, host: int, peer: int) -> bool:
        """Whether `host` gets an answer (even a refusal) from `peer`'s address."""
        probe = (
            "import socket, sys\n"
            "try:\n"
            f"    socket.create_connection(({self.addresses[peer]!r}, 9), timeout=1).close()\n"
            "except ConnectionRefusedError:\n"
            "    pass\n"
            "except OSError:\n"
            "    sys.exit(1)\n"
        )
        return subprocess.call([*self.enter(host), sys.executable, "-c", probe]) == 0

    def _thaw(self) -> None:
        for pid in self._frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self._frozen.clear()

    def close(self) -> None:
        """Ends the holders (the kernel then deletes the namespaces and the veth)."""
        self._thaw()
        for holder in self._holders:
            if holder.poll() is None:
                holder.stdin.close()
                try:
                    holder.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    holder.kill()
                    holder.wait()
        self._holders = []
