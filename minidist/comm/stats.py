"""Per-communicator traffic counters: payload bytes and messages, in total and per peer.

Only payload bytes are counted (no headers, no barrier or split control messages), so that a
test can check an algorithm against its formula exactly, e.g. ring all_reduce sending
2(p-1)/p * n bytes per rank. The shared-memory all_reduce counts the bytes of the messages
it replaces. A backend's own collective (``torch.distributed.all_reduce`` under ``auto`` on
the torch backend) moves bytes minidist cannot see: those calls add the tensor's size to
``native_bytes`` instead, so that a byte check on that path has something true to check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class PeerStats:
    bytes_sent: int = 0
    bytes_received: int = 0
    messages_sent: int = 0
    messages_received: int = 0


class CommStats:
    """``comm.stats``: totals as attributes, ``per_peer[rank]`` for the breakdown."""

    def __init__(self, world_size: int):
        self.per_peer: dict[int, PeerStats] = {r: PeerStats() for r in range(world_size)}
        self.native_bytes = 0  # bytes handed to a backend's own collective (uncounted traffic)

    def on_native(self, nbytes: int) -> None:
        self.native_bytes += nbytes

    def on_send(self, peer: int, nbytes: int) -> None:
        s = self.per_peer[peer]
        s.bytes_sent += nbytes
        s.messages_sent += 1

    def on_recv(self, peer: int, nbytes: int) -> None:
        s = self.per_peer[peer]
        s.bytes_received += nbytes
        s.messages_received += 1

    def reset(self) -> None:
        for r in self.per_peer:
            self.per_peer[r] = PeerStats()
        self.native_bytes = 0

    def _total(self, field: str) -> int:
        return sum(getattr(s, field) for s in self.per_peer.values())

    @property
    def bytes_sent(self) -> int:
        return self._total("bytes_sent")

    @property
    def bytes_received(self) -> int:
        return self._total("bytes_received")

    @property
    def messages_sent(self) -> int:
        return self._total("messages_sent")

    @property
    def messages_received(self) -> int:
        return self._total("messages_received")

    def as_dict(self) -> dict:
        """Totals and the per-peer breakdown (peers with no traffic left out), for JSON."""
        peers = {r: asdict(s) for r, s in self.per_peer.items() if any(asdict(s).values())}
        return {"bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "messages_sent": self.messages_sent,
                "messages_received": self.messages_received,
                "native_bytes": self.native_bytes, "per_peer": peers}

    def __repr__(self) -> str:
        return (f"CommStats(bytes_sent={self.bytes_sent}, bytes_received={self.bytes_received}, "
                f"messages_sent={self.messages_sent}, "
                f"messages_received={self.messages_received})")
