"""``minidist doctor --gpu``: verify minidist on this machine's CUDA GPUs (issue 30).

1. ``pytest -m gpu tests``: every GPU test (collectives, transports, DDP, and every strategy
   on the ``device`` fixture of ``tests/gpu``), under a time limit; it needs a source
   checkout (the tests are not installed).
2. A short benchmark, each row read against torch's own:

   - all-reduce of 64 MiB of float32 over NCCL, one rank per GPU (the torch backend):
     minidist's ring (NCCL point-to-point) against NCCL's ``all_reduce`` on the same
     process group, as bus bandwidth 2 (p - 1) / p x bytes / time (nccl-tests' definition,
     ``doc/PERFORMANCE.md`` there); the goal is 0.8x. It needs two GPUs or more: NCCL refuses
     two ranks of one communicator on one GPU;
   - a DDP step of 2 ranks sharing GPU 0: minidist's DDP (local backend, gradients staged
     through host memory) against torch's DDP (gloo, CUDA tensors), the same model, data and
     SGD; their final parameters compared;
   - the same step in float16: minidist's ``MixedPrecision`` and ``GradScaler`` against
     ``torch.autocast`` and ``torch.amp.GradScaler``.

Timings are printed, never judged; the exit status is non-zero when no GPU is present, when
a test fails, or when a result check fails.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
RING_BYTES, STEPS, WARMUP = 64 << 20, 20, 3
WIDTH, BATCH = 1024, 64


def no_gpu_message() -> str | None:
    """Why ``--gpu`` cannot run here, or None when torch sees a CUDA GPU."""
    if torch.cuda.is_available():
        return None
    build = torch.version.cuda or "none: a CPU-only torch build"
    return (f"minidist doctor --gpu: no CUDA GPU is present (torch {torch.__version__}, "
            f"CUDA {build}); nothing was verified. Run it on a machine with an NVIDIA GPU.")


def run_gpu_tests(root: Path = ROOT, timeout: float = 600) -> bool:
    """``pytest -m gpu`` on the checkout's tests; True if it passed."""
    if not (root / "tests").is_dir():
        print(f"  GPU tests: FAILED: no tests/ under {root} (run from a source checkout)")
        return False
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider",
           "tests"]
    print(f"$ (cd {root} && {' '.join(cmd[2:])})", flush=True)
    try:
        return subprocess.run(cmd, cwd=root, timeout=timeout).returncode == 0
    except subprocess.TimeoutExpired:
        print(f"  GPU tests: FAILED: still running after {timeout:.0f} s")
        return False


def median_time(step, steps: int = STEPS, warmup: int = WARMUP) -> float:
    """Median seconds of ``step()``, each ended by a device synchronisation."""
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _ring_rank(comm, nbytes: int):
    import torch.distributed as dist

    import minidist as md

    p = comm.world_size
    check = md.all_reduce(comm, torch.full((1 << 16,), comm.rank + 1.0, device=comm.device),
                          algorithm="ring")
    ok = bool((check == p * (p + 1) / 2).all())
    x = torch.zeros(nbytes // 4, device=comm.device)  # zeros: repeated sums stay finite
    ring = median_time(lambda: md.all_reduce(comm, x, algorithm="ring"), steps=10)
    nccl = median_time(lambda: dist.all_reduce(x), steps=10)
    return ring, nccl, ok


def ring_row(nbytes: int = RING_BYTES) -> tuple[str, str, bool]:
    import minidist as md

    p = torch.cuda.device_count()
    if p < 2:
        return ("ring over NCCL", "not run: needs 2 GPUs or more (NCCL refuses two ranks on "
                f"one GPU); this machine has {p}", True)
    out = md.launch(_ring_rank, p, args=(nbytes,), backend="torch", device="cuda", timeout=120)
    ring, nccl = max(o[0] for o in out), max(o[1] for o in out)  # the slowest rank's
    bus = 2 * (p - 1) / p * nbytes / 2**30
    text = (f"{p} ranks, {nbytes >> 20} MiB: ring {bus / ring:.1f} GiB/s, NCCL all_reduce "
            f"{bus / nccl:.1f} GiB/s: {nccl / ring:.2f}x (goal 0.8x)")
    return "ring over NCCL", text, all(o[2] for o in out)


def bench_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH),
                         nn.GELU(), nn.Linear(WIDTH, WIDTH))


def bench_batch(rank: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    return (torch.randn(BATCH, WIDTH, generator=g).to(device),
            torch.randn(BATCH, WIDTH, generator=g).to(device))


def _minidist_rank(comm, half: bool):
    import minidist as md
    from minidist.parallel.amp import MixedPrecision

    model = bench_model().to(comm.device)
    x, y = bench_batch(comm.rank, comm.device)
    if half:
        mp = MixedPrecision(model, torch.optim.SGD, dtype=torch.float16,
                            scaler=md.GradScaler(comm), lr=0.01)
        model, backward, opt, x = mp.model, mp.backward, mp, x.half()
        ddp = md.DistributedDataParallel(model, comm)
    else:
        ddp = md.DistributedDataParallel(model, comm)
        opt, backward = torch.optim.SGD(model.parameters(), lr=0.01), lambda loss: loss.backward()

    def step():
        backward(F.mse_loss(ddp(x).float(), y))
        opt.step()
        opt.zero_grad()
    return median_time(step), [p.detach().float().cpu() for p in model.parameters()]


def _torch_rank(comm, half: bool):
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.cuda.set_device(0)
    model = bench_model().cuda()
    ddp = DDP(model, device_ids=[0])  # over gloo, the process group minidist's launch made
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=half)
    x, y = bench_batch(comm.rank, "cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.float16, enabled=half):
            out = ddp(x)
        scaler.scale(F.mse_loss(out.float(), y)).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return median_time(step), [p.detach().float().cpu() for p in model.parameters()]


def ddp_row(half: bool) -> tuple[str, str, bool]:
    """minidist's step against torch's on 2 ranks sharing GPU 0, and their parameters."""
    import minidist as md

    mine = md.launch(_minidist_rank, 2, args=(half,), device="cuda:0", timeout=300)
    theirs = md.launch(_torch_rank, 2, args=(half,), backend="torch", device="cpu",
                       start_method="spawn", timeout=300)
    t_md, t_torch = max(o[0] for o in mine), max(o[0] for o in theirs)
    diff = max((a - b).abs().max().item() for a, b in zip(mine[0][1], theirs[0][1]))
    # float32: the same SGD steps, sums in another order; float16: two recipes (16-bit
    # weights with float32 masters against autocast), so a looser bound
    bound = 5e-2 if half else 1e-4
    name = "DDP float16 (2 ranks, 1 GPU)" if half else "DDP float32 (2 ranks, 1 GPU)"
    text = (f"minidist {t_md * 1e3:.2f} ms/step, torch {t_torch * 1e3:.2f} ms/step "
            f"({t_torch / t_md:.2f}x torch's speed); parameters differ by {diff:.1e} "
            f"(allowed {bound:g})")
    return name, text, diff <= bound


def main() -> int:
    missing = no_gpu_message()
    if missing is not None:
        print(missing, file=sys.stderr)
        return 2
    ok = run_gpu_tests()
    print("minidist doctor --gpu: benchmark")
    for row in (ring_row, lambda: ddp_row(False), lambda: ddp_row(True)):
        try:
            name, text, good = row()
        except Exception as e:  # report, then go on: this is a diagnosis
            name, text, good = "benchmark", f"{type(e).__name__}: {e}", False
        ok &= good
        print(f"  {name}: {text}{'' if good else '  <- FAILED'}", flush=True)
    print(f"minidist doctor --gpu: {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1
