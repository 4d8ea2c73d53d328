"""Layer 1: the Communicator (point-to-point messages with tags, ``barrier``, ``split``,
byte counters, timeline) over a transport (``minidist/transports``)."""

from .communicator import ANY_SOURCE, UNDEFINED, Communicator, Request
from .stats import CommStats, PeerStats

__all__ = ["ANY_SOURCE", "UNDEFINED", "Communicator", "Request", "CommStats", "PeerStats"]
