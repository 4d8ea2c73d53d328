"""``minidist doctor``: what this machine can run (cores, torch, backends, GPUs); ``--gpu``
verifies minidist on its GPUs (``doctor_gpu.py``)."""

from __future__ import annotations

import os
import platform
import shutil
import sys
import time


def _check_local() -> str:
    from .launch import launch

    t = time.perf_counter()
    launch(lambda comm: comm.barrier(), 2)
    return f"ok (2 ranks started and met in {(time.perf_counter() - t) * 1e3:.0f} ms)"


def _check_torch() -> str:
    import torch.distributed as dist

    if not dist.is_available():
        return "unavailable: this torch build has no torch.distributed"
    kinds = [k for k, ok in (("gloo", dist.is_gloo_available()),
                             ("nccl", dist.is_nccl_available())) if ok]
    return f"ok (process-group backends: {', '.join(kinds) or 'none'})"


def report() -> list[tuple[str, str]]:
    import torch

    rows = [("python", f"{platform.python_version()} ({sys.executable})"),
            ("platform", platform.platform()),
            ("cpu cores", str(os.cpu_count())),
            ("torch", f"{torch.__version__} ({torch.get_num_threads()} threads)")]
    if os.path.isdir("/dev/shm"):
        st = os.statvfs("/dev/shm")
        rows.append(("/dev/shm free", f"{st.f_bavail * st.f_frsize / 2**30:.1f} GiB"))
    for name, check in (("backend local", _check_local), ("backend torch", _check_torch)):
        try:
            rows.append((name, check()))
        except Exception as e:  # report, never crash: this is a diagnosis
            rows.append((name, f"FAILED: {type(e).__name__}: {e}"))
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        rows.append(("GPUs", f"{len(names)}: {', '.join(names)}"))
    else:
        rows.append(("GPUs", "none (CUDA tests will be skipped)"))
    rows.append(("torchrun", shutil.which("torchrun") or "not on PATH"))
    return rows


def main(gpu: bool = False) -> int:
    """The report; with ``gpu``, then the GPU verification (``doctor_gpu.py``), which
    refuses with a non-zero status where no GPU is present."""
    if gpu:
        from .doctor_gpu import no_gpu_message

        if no_gpu_message() is not None:  # say so at once, before the slower checks
            print(no_gpu_message(), file=sys.stderr)
            return 2
    rows = report()
    width = max(len(k) for k, _ in rows)
    print("minidist doctor")
    for k, v in rows:
        print(f"  {k.ljust(width)}  {v}")
    status = 1 if any("FAILED" in v for _, v in rows) else 0
    if gpu:
        from .doctor_gpu import main as verify_gpu

        status = max(status, verify_gpu())
    return status
