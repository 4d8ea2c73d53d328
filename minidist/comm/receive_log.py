"""What a communicator has received from each peer, so that a receive that waits forever can
say what did arrive (a message an earlier ANY_SOURCE receive took is the usual reason)."""

from __future__ import annotations


class ReceiveLog:
    def __init__(self):
        self._by_source: dict[int, list] = {}  # source: [count, last tag, via ANY_SOURCE]

    def note(self, source: int, tag: int, via_any: bool) -> None:
        entry = self._by_source.setdefault(source, [0, tag, via_any])
        entry[0], entry[1], entry[2] = entry[0] + 1, tag, via_any

    def describe(self, peer: int | None) -> str:
        """A sentence for a timeout's text about what came from ``peer`` (or from anyone)."""
        if peer is None:
            got = sum(c for c, _, _ in self._by_source.values())
            return f"(This rank has received {got} messages on this communicator so far.)"
        if peer not in self._by_source:
            return f"(Nothing from rank {peer} has arrived on this communicator so far.)"
        count, tag, via_any = self._by_source[peer]
        how = "by a receive from ANY_SOURCE" if via_any else "by a receive naming it"
        return (f"(So far {count} message{'s' if count > 1 else ''} from rank {peer} arrived "
                f"on this communicator; the last, on tag {tag}, was taken {how}.)")
