"""A torch-backend launch on one machine listens on loopback only (the store and gloo).

The listening TCP sockets a process owns are read from /proc (its socket inodes in
/proc/PID/fd, matched against /proc/net/tcp and tcp6), so no iproute2 is needed.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import textwrap

import pytest

import minidist as md

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/net/tcp"),
                                reason="needs Linux's /proc/net/tcp")

_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column


def listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every listening TCP socket the process ``pid`` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        found += [_address(row[1]) for row in rows if row[3] == _LISTEN and row[9] in inodes]
    return found


def _address(field: str) -> tuple[str, int]:
    """``0100007F:1F90`` (each 32-bit word of the address in host byte order) as an
    address and a port."""
    raw, port = field.split(":")
    words = [int(raw[i:i + 8], 16) for i in range(0, len(raw), 8)]
    packed = struct.pack(f"={len(words)}I", *words)
    family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, packed), int(port, 16)


def not_loopback(found: list[tuple[str, int]]) -> list[tuple[str, int]]:
    def loopback(addr: str) -> bool:
        ip = ipaddress.ip_address(addr)
        return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None)
                                      and ip.ipv4_mapped.is_loopback)
    return [(a, p) for a, p in found if not loopback(a)]


def test_address_decoding():
    assert _address("0100007F:1F90") == ("127.0.0.1", 8080)
    assert _address("00000000000000000000000000000000:AAD9") == ("::", 43737)
    assert _address("00000000000000000000000001000000:0016") == ("::1", 22)
    assert not_loopback([("127.0.0.1", 1), ("::1", 2), ("::ffff:127.0.0.1", 3)]) == []
    assert not_loopback([("0.0.0.0", 4), ("::", 5)]) == [("0.0.0.0", 4), ("::", 5)]


def _live_listeners(comm):
    """Inside a rank, with the group up: this rank's listeners, the caller's (rank 0), and
    the store's port; the ranks then wait for each other so every listener is still open."""
    import torch.distributed as dist

    comm.barrier()
    mine = {f"rank {comm.rank}": listeners(os.getpid())}
    if comm.rank == 0:
        mine["caller"] = listeners(os.getppid())
    store = dist.distributed_c10d._get_default_store().underlying_store
    comm.barrier()
    return mine, store.port


def test_torch_launch_listens_on_loopback_only():
    results = md.launch(_live_listeners, 2, backend="torch")
    found = {who: socks for mine, _ in results for who, socks in mine.items()}
    everything = [s for socks in found.values() for s in socks]
    assert not not_loopback(everything), f"listening beyond loopback: {found}"
    store_port = results[0][1]
    assert store_port in {p for _, p in found["rank 0"]}, found  # rank 0 hosts the store
    assert found["rank 1"], found  # gloo's listener: the check saw it


RUN_SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, sys.argv[1])
    import minidist as md
    from test_listeners import listeners
    comm = md.init()
    comm.barrier()
    mine = {f"rank {comm.rank}": listeners(os.getpid())}
    if comm.rank == 0:
        mine["runner"] = listeners(os.getppid())
    print("LISTENERS " + json.dumps(mine), flush=True)
    comm.barrier()
    comm.close()
""")


def test_minidist_run_torch_listens_on_loopback_only(tmp_path):
    script = tmp_path / "listen.py"
    script.write_text(RUN_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "minidist.cli", "run", "-n", "2", "--backend",
                           "torch", str(script), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    found = {}
    for line in proc.stdout.splitlines():
        if line.startswith("LISTENERS "):
            found.update(json.loads(line[len("LISTENERS "):]))
    assert set(found) == {"rank 0", "rank 1", "runner"}, proc.stdout
    everything = [tuple(s) for socks in found.values() for s in socks]
    assert not not_loopback(everything), f"listening beyond loopback: {found}"
    assert found["runner"], found  # the runner hosts the store
