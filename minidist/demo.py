"""``minidist demo``: four ranks pass a tensor around a ring and say what they got."""

from __future__ import annotations

import torch

from .launch import launch


def _ring_step(comm):
    """Each rank sends its rank number (times ten) to the next rank, around a ring."""
    right, left = (comm.rank + 1) % comm.world_size, (comm.rank - 1) % comm.world_size
    mine = torch.full((3,), 10.0 * comm.rank)
    got = torch.empty(3)
    source = comm.sendrecv(mine, right, got, left)
    comm.barrier()
    return {"sent": mine.tolist(), "to": right, "got": got.tolist(), "from": source,
            "bytes_sent": comm.stats.bytes_sent, "bytes_received": comm.stats.bytes_received}


def main(world_size: int = 4, backend: str = "local") -> list[dict]:
    results = launch(_ring_step, world_size, backend=backend)
    print(f"{world_size} ranks ({backend} backend), each sends to its right neighbour:")
    for rank, r in enumerate(results):
        print(f"  rank {rank}: sent {r['sent']} to rank {r['to']}, "
              f"got {r['got']} from rank {r['from']} "
              f"({r['bytes_sent']} bytes out, {r['bytes_received']} bytes in)")
    return results
