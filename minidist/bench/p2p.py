"""``minidist bench p2p``: ping-pong latency and bandwidth, minidist local vs torch gloo.

Two ranks bounce a message back and forth; one-way time is half the round trip, and
one-way bandwidth is size / one-way time. The same loop runs on minidist's shared-memory
backend and on ``torch.distributed`` with gloo (raw ``dist.send``/``dist.recv``), in one run.
Then the cost of starting ranks: ``md.launch`` of 4 ranks doing one barrier against
``torch.multiprocessing.spawn`` + gloo init doing the same.

Fit to the alpha-beta (Hockney) model, t(n) = alpha + n / beta: alpha is the latency, beta
the bandwidth; a least-squares fit over the sweep gives both.
"""

from __future__ import annotations

import socket
import statistics
import time

import torch

from ..launch import launch
from ..notebook import quick_mode
from .timing import (
    add_common_arguments,
    fit_alpha_beta,
    format_table,
    iterations_for,
    median_time,
    pyplot,
    save_figure,
    save_outputs,
)

SIZES = [4, 64, 1024, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
QUICK_SIZES = [4, 1024, 64 << 10, 1 << 20, 16 << 20]


def add_arguments(parser) -> None:
    add_common_arguments(parser, "a short sweep (CI does this)",
                         plot_help="save a bandwidth/latency plot", rounds=False)
    parser.add_argument("--no-launch", action="store_true", help="skip the launch-time part")


def _pingpong(comm, sizes, quick, use_torch):
    """Runs on both ranks; returns one-way seconds per size (rank 0's view)."""
    if use_torch:
        import torch.distributed as dist
        send, recv = (lambda t, p: dist.send(t, p)), (lambda t, p: dist.recv(t, p))
    else:
        send, recv = comm.send, comm.recv
    peer, out = 1 - comm.rank, {}
    for n in sizes:
        buf = torch.zeros(n, dtype=torch.uint8)

        def step(buf=buf):
            if comm.rank == 0:
                send(buf, peer)
                recv(buf, peer)
            else:
                recv(buf, peer)
                send(buf, peer)

        out[n] = median_time(step, iterations_for(n, quick), warmup=3) / 2
    return out


def measure_p2p(sizes, quick: bool, rounds: int = 3) -> list[dict]:
    """minidist and gloo take turns (``rounds`` each); each size keeps its best round, so
    a burst of load from elsewhere on a shared machine does not decide a row."""
    local = dict.fromkeys(sizes, float("inf"))
    gloo = dict.fromkeys(sizes, float("inf"))
    for _ in range(rounds):
        for best, backend in ((local, "local"), (gloo, "torch")):
            got = launch(_pingpong, 2, args=(sizes, quick, backend == "torch"),
                         backend=backend)[0]
            for n in sizes:
                best[n] = min(best[n], got[n])
    rows = []
    for n in sizes:
        row = {"bytes": n, "local_us": local[n] * 1e6, "gloo_us": gloo[n] * 1e6,
               "local_GBps": n / local[n] / 1e9, "gloo_GBps": n / gloo[n] / 1e9}
        row["speedup"] = gloo[n] / local[n]
        rows.append(row)
    return rows


# -- launch time -----------------------------------------------------------------------------
def _barrier(comm):
    comm.barrier()


def _torch_spawn_worker(rank, world_size, port):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    dist.barrier()
    dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_launch(world_size: int = 4, repeats: int = 3) -> dict:
    import torch.multiprocessing as tmp

    ours, theirs = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        launch(_barrier, world_size)
        ours.append(time.perf_counter() - t)
        t = time.perf_counter()
        tmp.spawn(_torch_spawn_worker, args=(world_size, _free_port()), nprocs=world_size)
        theirs.append(time.perf_counter() - t)
    m, g = statistics.median(ours), statistics.median(theirs)
    return {"world_size": world_size, "minidist_s": m, "torch_spawn_gloo_s": g,
            "speedup": g / m}


def main(args) -> dict:
    quick = args.quick or quick_mode()
    sizes = QUICK_SIZES if quick else SIZES
    rounds = 1 if quick else 3
    rows = measure_p2p(sizes, quick, rounds)
    print(f"Ping-pong between 2 ranks, one-way time and bandwidth (median of each round, "
          f"best of {rounds} rounds)\n")
    print(format_table(rows, [("bytes", "size", "bytes"), ("local_us", "local us", ".1f"),
                              ("gloo_us", "gloo us", ".1f"), ("local_GBps", "local GB/s", ".2f"),
                              ("gloo_GBps", "gloo GB/s", ".2f"),
                              ("speedup", "local/gloo", ".2f")]))
    fits = {}
    for name in ("local", "gloo"):
        alpha, beta = fit_alpha_beta(sizes, [r[f"{name}_us"] * 1e-6 for r in rows])
        fits[name] = {"alpha_us": alpha * 1e6, "beta_GBps": beta / 1e9}
        print(f"alpha-beta fit, {name:5s}: alpha = {alpha * 1e6:7.1f} us, "
              f"beta = {beta / 1e9:6.2f} GB/s")
    result = {"p2p": rows, "fit": fits}
    if not args.no_launch:
        lt = measure_launch(4, 2 if quick else 5)
        result["launch"] = lt
        print(f"\nStarting 4 ranks + one barrier: md.launch {lt['minidist_s'] * 1e3:.0f} ms, "
              f"torch.multiprocessing.spawn + gloo {lt['torch_spawn_gloo_s'] * 1e3:.0f} ms "
              f"({lt['speedup']:.1f}x)")
    return save_outputs(args, result, lambda path: plot(rows, path))


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    sizes = [r["bytes"] for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for name, label in (("local", "minidist local (shared memory)"), ("gloo", "torch gloo")):
        ax1.loglog(sizes, [r[f"{name}_us"] for r in rows], "o-", label=label)
        ax2.semilogx(sizes, [r[f"{name}_GBps"] for r in rows], "o-", label=label)
    ax1.set(xlabel="message size (bytes)", ylabel="one-way time (us)", title="Latency")
    ax2.set(xlabel="message size (bytes)", ylabel="GB/s", title="One-way bandwidth")
    for ax in (ax1, ax2):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    save_figure(fig, path)
