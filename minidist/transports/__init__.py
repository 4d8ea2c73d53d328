"""Transports: what moves bytes between global ranks under a Communicator.

* ``local.py``: processes on this machine, messages through one shared-memory segment
  (``shm_segment.py``).
* ``torch_dist.py``: a ``torch.distributed`` process group (gloo, NCCL).

The primitives every transport provides, and the optional capabilities, are declared in
``protocol.py``.
"""
