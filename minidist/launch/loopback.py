"""What a torch-backend launch on one machine listens on: loopback only.

torch's ``TCPStore`` server ignores its host argument: both of its backends bind every
interface (libuv: ``[::]``, falling back to ``0.0.0.0``; the legacy one: a passive
``getaddrinfo`` address), so ``TCPStore("127.0.0.1", 0, is_master=True)`` accepts anyone on
the network, unauthenticated. Handed a socket already bound (``master_listen_fd``), it
listens on that socket instead, and owns it from then on. gloo's listeners follow the
address this machine's hostname resolves to (often a LAN address) unless
``GLOO_SOCKET_IFNAME`` names an interface.

``md.launch(backend="torch")`` and ``minidist run --backend torch`` use both; under
``torchrun`` / ``md.init()`` the store is wherever ``MASTER_ADDR`` says, as torch does.
"""

from __future__ import annotations

import contextlib
import datetime
import socket
from collections.abc import MutableMapping
from pathlib import Path

LOOPBACK = "127.0.0.1"
_IFF_LOOPBACK = 0x8  # <linux/if.h>


def host_loopback_store(world_size: int | None, timeout: datetime.timedelta):
    """The master ``TCPStore`` of a launch on this machine, on a port the OS picks (so
    concurrent launches never collide), reachable only from this machine."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        store = dist.TCPStore(LOOPBACK, sock.getsockname()[1], world_size, True, timeout,
                              wait_for_workers=False, master_listen_fd=sock.fileno())
    except BaseException:
        with contextlib.suppress(OSError):  # the store may have closed it already
            sock.close()
        raise
    sock.detach()  # the store's server closes the socket when the store goes
    return store


def pin_gloo_to_loopback(env: MutableMapping[str, str]) -> None:
    """Make gloo listen on the loopback interface, unless ``GLOO_SOCKET_IFNAME`` already
    names one (the user's explicit choice is kept)."""
    name = loopback_interface()
    if name is not None and not env.get("GLOO_SOCKET_IFNAME"):
        env["GLOO_SOCKET_IFNAME"] = name


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), or None."""
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        try:
            flags = int(Path(f"/sys/class/net/{name}/flags").read_text(), 16)
        except (OSError, ValueError):
            continue
        if flags & _IFF_LOOPBACK:
            return name
    return next((n for n in ("lo", "lo0") if n in names), None)
