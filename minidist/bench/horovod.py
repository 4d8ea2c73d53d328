"""``minidist bench horovod``: Horovod's synthetic benchmark on ``minidist.horovod`` against
the same step on torch DDP over gloo.

The step is the one of Horovod's ``examples/pytorch/pytorch_synthetic_benchmark.py``: a
fixed random batch of ``--batch`` images per rank, a ``torchvision.models`` network
(``--model``), cross-entropy, SGD. Three ways to average its gradients, in one run:

* ``hvd shm``: ``hvd.DistributedOptimizer`` on minidist's local backend (shared memory);
* ``hvd gloo``: the same on minidist's torch backend (its messages over gloo);
* ``torch DDP``: ``torch.nn.parallel.DistributedDataParallel`` on a gloo process group.

``hvd`` starts one allreduce per gradient as backward produces it (no Tensor Fusion here);
DDP packs gradients into 25 MiB buckets. Reported per way, from the best of ``--rounds``
interleaved runs: images per second over all ranks (as Horovod's script reports it: the
slowest rank's mean rate times the number of ranks) and the ratio to torch DDP.

torchvision's wheel does not load against the CPU torch here; without a working
torchvision the benchmark uses the tests' stand-in (``tests/horovod/standin``: ResNets with
torchvision's layout) when run from a source checkout.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..launch import launch
from ..notebook import quick_mode
from .timing import add_common_arguments, best_of_rounds, format_table, save_outputs

VARIANTS = ("hvd shm", "hvd gloo", "torch DDP")
FULL = {"image": 224, "batches": 5, "iters": 3, "warmup": 2, "rounds": 3}
QUICK = {"image": 32, "batches": 1, "iters": 2, "warmup": 1, "rounds": 1}


def add_arguments(parser) -> None:
    add_common_arguments(parser, "tiny images, few steps (CI)", plot_help=None)
    parser.add_argument("--model", default="resnet18", help="a torchvision.models name")
    parser.add_argument("--batch", type=int, default=8, help="images per rank per step")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--image-size", type=int, help="pixels per side (default 224)")


def torchvision_models():
    """``torchvision.models``, or the tests' stand-in where torchvision does not load."""
    try:
        from torchvision import models

        return models
    except (ImportError, RuntimeError):  # RuntimeError: a wheel built for another torch
        standin = Path(__file__).resolve().parents[2] / "tests" / "horovod" / "standin"
        if not standin.is_dir():
            raise SystemExit("minidist bench horovod needs torchvision.models (or a source "
                             "checkout, whose tests/horovod/standin stands in)") from None
        sys.path.insert(0, str(standin))
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]  # a half-imported broken torchvision
        from torchvision import models

        return models


def _wrap(comm, variant: str, model: nn.Module):
    """The model to call and the optimizer to step, for ``variant``."""
    import minidist.horovod as hvd

    if variant == "torch DDP":
        ddp = nn.parallel.DistributedDataParallel(model)
        return ddp, torch.optim.SGD(ddp.parameters(), lr=0.01)
    hvd.init(comm)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return model, opt


def _run_rank(comm, variant: str, cfg: dict) -> dict:
    import minidist.horovod as hvd

    torch.manual_seed(0)
    model, opt = _wrap(comm, variant, getattr(torchvision_models(), cfg["model"])())
    data = torch.randn(cfg["batch"], 3, cfg["image"], cfg["image"])
    target = torch.randint(0, 1000, (cfg["batch"],))

    def step():
        opt.zero_grad()
        F.cross_entropy(model(data), target).backward()
        opt.step()

    for _ in range(cfg["warmup"]):
        step()
    rates = []
    for _ in range(cfg["iters"]):
        start = time.perf_counter()
        for _ in range(cfg["batches"]):
            step()
        rates.append(cfg["batch"] * cfg["batches"] / (time.perf_counter() - start))
    if hvd.is_initialized():
        hvd.shutdown()
    return {"img_per_s": sum(rates) / len(rates)}


def measure(variant: str, cfg: dict) -> dict:
    backend = "local" if variant == "hvd shm" else "torch"
    ranks = launch(_run_rank, cfg["world_size"], args=(variant, cfg), backend=backend)
    slowest = min(r["img_per_s"] for r in ranks)
    return {"img_per_s": slowest * cfg["world_size"], "step_s": cfg["batch"] / slowest}


def run_all(cfg: dict, rounds: int) -> list[dict]:
    cases = [({"variant": v}, partial(measure, v, cfg)) for v in VARIANTS]
    rows = best_of_rounds(cases, rounds)
    ddp = next(r for r in rows if r["variant"] == "torch DDP")
    for r in rows:
        r["vs_torch"] = r["img_per_s"] / ddp["img_per_s"]
    return rows


COLUMNS = [("variant", "gradients averaged by", "s"), ("img_per_s", "img/s (all ranks)", ".1f"),
           ("vs_torch", "vs torch DDP", ".2f")]


def main(args) -> dict:
    quick = args.quick or quick_mode()
    preset = QUICK if quick else FULL
    cfg = {"model": args.model, "batch": args.batch, "world_size": args.world_size,
           "image": args.image_size or preset["image"], "batches": preset["batches"],
           "iters": preset["iters"], "warmup": preset["warmup"]}
    n_params = sum(p.numel() for p in getattr(torchvision_models(), cfg["model"])().parameters())
    print(f"{cfg['model']} ({n_params / 1e6:.1f} M parameters), {cfg['batch']} images of "
          f"{cfg['image']}x{cfg['image']} per rank, {cfg['world_size']} ranks\n")
    rows = run_all(cfg, args.rounds or preset["rounds"])
    print(format_table(rows, COLUMNS))
    return save_outputs(args, {"config": dict(cfg, parameters=n_params), "rows": rows})
