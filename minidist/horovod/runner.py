"""``horovod.run(fn, args=(), np=N)``: run ``fn`` on N ranks of this machine, each with
minidist.horovod initialized, and return the results by rank (``md.launch`` underneath)."""

from __future__ import annotations

from .context import init, shutdown

_LOCAL_HOSTS = ("localhost", "127.0.0.1")


def run(func, args=(), kwargs=None, np=1, hosts=None, use_gloo=None, use_mpi=None,
        timeout=None, **ignored):
    """Horovod's ``horovod.run``: ``func(*args, **kwargs)`` on ``np`` ranks; returns the
    list of their results. ``use_gloo=True`` runs over torch.distributed's gloo
    (minidist's torch backend), otherwise over shared memory; ``hosts`` may name only
    this machine (``"localhost:N"``); MPI is not available."""
    from ..launch import launch

    if use_mpi:
        raise NotImplementedError("use_mpi=True: minidist has no MPI transport; leave it "
                                  "unset (shared memory) or pass use_gloo=True")
    _check_hosts(hosts, np)
    unknown = sorted(k for k, v in ignored.items() if v is not None)
    if unknown:
        raise NotImplementedError(f"horovod.run options not supported by minidist.horovod: "
                                  f"{', '.join(unknown)}")
    backend = "torch" if use_gloo else "local"
    return list(launch(_rank_main, np, args=(func, tuple(args), dict(kwargs or {})),
                       backend=backend, timeout=timeout))


def _check_hosts(hosts, np: int) -> None:
    if hosts is None:
        return
    for entry in str(hosts).split(","):
        host, _, slots = entry.partition(":")
        if host not in _LOCAL_HOSTS:
            raise NotImplementedError(f"hosts={hosts!r}: minidist.horovod.run starts ranks "
                                      "on this machine only (localhost:N)")
        if slots and int(slots) < np:
            raise ValueError(f"hosts={hosts!r} offers {slots} slots for np={np}")


def _rank_main(comm, func, args, kwargs):
    init(comm)
    try:
        return func(*args, **kwargs)
    finally:
        shutdown()
