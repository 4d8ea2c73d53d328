"""``minidist bench elastic``: one failure's cost against the commit interval, vs torchrun.

The same job (an MLP, one epoch of ``steps`` global batches, DDP, 3 ranks, a commit every k
steps) runs for each k twice per implementation: fault-free, and with rank 1 killed
(SIGKILL) during step ``fail_at`` of the first attempt:

* ``minidist``: ``md.elastic.launch`` + ``md.elastic.run`` (local backend); after the kill
  the agent relaunches 2 ranks from the last commit;
* ``torchrun``: torch's ``elastic_launch`` (torchrun's ``LocalElasticAgent``, c10d
  rendezvous), torch DDP on gloo, ``torch.save`` checkpoints by rank 0 every k steps; after
  the kill the agent restarts all 3 workers (one node: torchrun keeps ``nproc_per_node``).

Per row: the median step and commit (ms); the steps lost (``fail_at`` minus the last commit,
``costs.lost_steps``); recovery, from the death to the first step after the restart (a
wall-clock difference between processes); the restore (ms); the measured overhead, wall
time with the failure minus without; and the predicted overhead
``t_start + t_restore + lost x t_step`` from fault-free figures (``t_start``: launch to first
step). Young's interval for ``--mtbf`` says which k balances commits against losses. On 2
cores the ranks share cores and torch's workers are spawned (each imports torch): start-up
dominates here; on a cluster the lost steps and the commits do.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..models import mlp
from ..parallel import elastic
from ..parallel.data import DistributedDataParallel
from .spec import Bench, option
from .timing import format_table, pyplot, save_figure, save_outputs

FULL = {"width": 512, "depth": 4, "batch": 48, "steps": 24, "fail_at": 15, "world": 3,
        "commit_every": (1, 2, 4, 8), "rounds": 2}
QUICK = {"width": 64, "depth": 2, "batch": 12, "steps": 10, "fail_at": 7, "world": 3,
         "commit_every": (2, 4), "rounds": 1}
COLUMNS = [("impl", "agent", ""), ("k", "k", "d"), ("step_ms", "step ms", ".1f"),
           ("commit_ms", "commit ms", ".1f"), ("lost_steps", "lost steps", "d"),
           ("recovery_s", "recovery s", ".2f"), ("restore_ms", "restore ms", ".1f"),
           ("overhead_s", "overhead s", ".2f"), ("predicted_s", "predicted s", ".2f"),
           ("restarts", "restarts", "d")]


OPTIONS = (option("--mtbf", type=float, default=3600.0,
                  help="seconds between failures for Young's interval (default 3600)"),
           option("--no-torch", action="store_true", help="skip torchrun's agent"),
           option("--torch-timeout", type=float, default=90.0,
                  help="seconds before a torchrun run counts as hung and is killed"))


def _data(cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = cfg["steps"] * cfg["batch"]
    return torch.randn(n, cfg["width"], generator=g), torch.randint(0, 10, (n,), generator=g)


def _die(cfg: dict) -> None:
    Path(cfg["death_file"]).write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def _train_step(model, opt, x, y, batch, times: list) -> None:
    start = time.perf_counter()
    opt.zero_grad()
    batch.mean(F.cross_entropy(model(x[batch.ids]), y[batch.ids], reduction="none")).backward()
    opt.step()
    times.append((time.time(), time.perf_counter() - start))


def _md_worker(comm, rdzv, cfg: dict, fail: bool) -> dict:
    torch.manual_seed(0)
    ddp = DistributedDataParallel(mlp(cfg["width"], cfg["depth"]), comm)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = _data(cfg)
    state = elastic.TorchState(rdzv.store, ddp, opt,
                               sampler=elastic.ElasticSampler(len(x), cfg["batch"]))
    times: list = []

    def step(batch):
        if fail and rdzv.attempt == 0 and state.step == cfg["fail_at"] and comm.rank == 1:
            _die(cfg)
        _train_step(ddp, opt, x, y, batch, times)

    elastic.run(step, comm, state, rdzv, epochs=1, commit_every=cfg["k"])
    spans = [e for e in comm.timeline.as_dicts() if e["cat"] == "elastic"]
    took = {n: [e["end"] - e["start"] for e in spans if e["name"] == n]
            for n in ("commit", "restore")}
    return _summary(times, took["commit"], sum(took["restore"]), rdzv.restart_count)


def _summary(times: list, commits: list, restore_s: float, restarts: int) -> dict:
    return {"first_step": times[0][0], "step_s": statistics.median(t for _, t in times),
            "commit_s": statistics.median(commits) if commits else 0.0,
            "restore_s": restore_s, "restarts": restarts}


def _torch_worker(cfg: dict, fail: bool) -> None:
    """One worker under torchrun: plain torch, checkpoints by ``torch.save``; rank 0 writes
    its summary to ``dir/torch.json`` at the end."""
    import torch.distributed as dist

    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=30)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=False, timeout=timeout)  # the agent's store
    # one key space per restart: with env:// the restarted workers met the dead ones'
    # addresses and every restart failed ("Connection refused") on this machine
    dist.init_process_group("gloo", store=dist.PrefixStore(f"restart{restart}", store),
                            rank=rank, world_size=world, timeout=timeout)
    torch.manual_seed(0)
    model = mlp(cfg["width"], cfg["depth"])
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x, y = _data(cfg)
    sampler, step, restore_s = elastic.ElasticSampler(len(x), cfg["batch"]), 0, 0.0
    path = Path(cfg["dir"]) / "torch.pt"
    if path.exists():
        start = time.perf_counter()
        ck = torch.load(path, weights_only=True)  # as md.elastic: tensors and plain types only
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        sampler.load_state_dict(ck["sampler"])
        step, restore_s = ck["step"], time.perf_counter() - start
    times, commits = [], []
    while (batch := sampler.next_batch(rank, world)) is not None:
        if fail and restart == 0 and step == cfg["fail_at"] and rank == 1:
            _die(cfg)
        _train_step(ddp, opt, x, y, batch, times)
        sampler.advance(batch)
        step += 1
        if step % cfg["k"] == 0 and rank == 0:
            start = time.perf_counter()
            _save(path, {"model": model.state_dict(), "opt": opt.state_dict(),
                         "sampler": sampler.state_dict(), "step": step})
            commits.append(time.perf_counter() - start)
    dist.destroy_process_group()
    if rank == 0:
        summary = _summary(times, commits, restore_s, restart)
        Path(cfg["dir"], "torch.json").write_text(json.dumps(summary))


def _save(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _run_md(cfg: dict, fail: bool) -> tuple[dict, int]:
    out = elastic.launch(_md_worker, cfg["world"], min_ranks=2, args=(cfg, fail), timeout=120,
                         trace=True)
    return out[0], out.attempts[0].end_step if fail else 0


def _run_torch(cfg: dict, fail: bool) -> tuple[dict | None, int]:
    """``torchrun --nnodes=1 --max-restarts=3`` on this module's worker, in its own session,
    killed as a whole if it has not finished after ``torch_timeout`` seconds (None then)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
           f"--nproc-per-node={cfg['world']}", "--max-restarts=3", "--monitor-interval=0.05",
           "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "-m", __name__,
           json.dumps(dict(cfg, fail=fail))]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        proc.wait(timeout=cfg["torch_timeout"])
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return None, 0
    out = Path(cfg["dir"], "torch.json")
    if proc.returncode != 0 or not out.exists():
        return None, 0
    committed = cfg["fail_at"] // cfg["k"] * cfg["k"]  # torch's checkpoints: every k steps
    return json.loads(out.read_text()), committed if fail else 0


def measure(impl: str, k: int, preset: dict) -> dict:
    """Fault-free, then with the failure; one row (``finished`` False: torchrun did not
    finish within ``torch_timeout`` seconds and was killed)."""
    walls, results = {}, {}
    with tempfile.TemporaryDirectory(prefix="minidist-bench-elastic-") as d:
        for fail in (False, True):
            cfg = dict(preset, k=k, dir=d, death_file=str(Path(d) / "death"))
            Path(d, "torch.pt").unlink(missing_ok=True)
            start = time.time()
            results[fail], committed = (_run_md if impl == "minidist" else _run_torch)(cfg, fail)
            walls[fail] = (start, time.time() - start)
        death = Path(d, "death")
        death = float(death.read_text()) if death.exists() else None
    ok, bad = results[False], results[True]
    row = {"impl": impl, "k": k, "finished": ok is not None and bad is not None}
    if not row["finished"]:
        return row
    lost = preset["fail_at"] - committed
    t_start = ok["first_step"] - walls[False][0]
    return dict(row, step_ms=ok["step_s"] * 1e3, commit_ms=ok["commit_s"] * 1e3,
                lost_steps=lost, recovery_s=bad["first_step"] - death,
                restore_ms=bad["restore_s"] * 1e3, overhead_s=walls[True][1] - walls[False][1],
                predicted_s=t_start + bad["restore_s"] + lost * ok["step_s"], start_s=t_start,
                restarts=bad["restarts"])


def _better(row: dict, old: dict | None) -> bool:
    if old is None or not old["finished"]:
        return True
    return row["finished"] and row["overhead_s"] < old["overhead_s"]


# The options and presets as a spec; the rounds are the main's own: a row is the round with
# the least overhead (a failure's cost), a case two runs (fault-free, then with the kill).
SPEC = Bench(
    quick_help="a small model, few steps (CI)", full=FULL, quick=QUICK,
    lists={"commit_every": "1,2,4"}, options=OPTIONS,
    configure=lambda preset, args: dict(preset, torch_timeout=args.torch_timeout),
    columns=COLUMNS)
add_arguments = SPEC.add_arguments


def main(args) -> dict:
    preset = SPEC.config(args)
    ks, impls = list(preset["commit_every"]), ["minidist"] + ([] if args.no_torch else ["torchrun"])
    print(f"MLP {preset['depth']} x {preset['width']}, {preset['steps']} steps of "
          f"{preset['batch']} samples on {preset['world']} ranks; rank 1 killed in step "
          f"{preset['fail_at']}; commit every k steps\n")
    measure("minidist", ks[0], preset)  # warm-up: the first launch imports and compiles
    best: dict = {}
    for _ in range(preset["rounds"]):
        for k in ks:
            for impl in impls:  # alternate: both see the same machine load
                row = measure(impl, k, preset)
                if _better(row, best.get((impl, k))):
                    best[impl, k] = row
    rows = [best[i, k] for k in ks for i in impls]
    print(format_table(rows, COLUMNS))
    for r in rows:
        if not r["finished"]:
            print(f"{r['impl']}, k={r['k']}: did not finish within {args.torch_timeout:g} s "
                  "(killed; torchrun's restart hung in gloo's re-rendezvous)")
    _print_young(rows, args.mtbf)
    result = {"config": preset, "rows": rows, "mtbf_s": args.mtbf}
    return save_outputs(args, result, lambda path: plot(rows, path))


def _print_young(rows: list[dict], mtbf: float) -> None:
    print("\npredicted = t_start + restore + lost steps x t_step (fault-free figures); "
          "overhead = wall with the failure - wall without")
    for r in rows:
        if r.get("commit_ms"):
            tau = elastic.young_interval(r["commit_ms"] / 1e3, mtbf)
            r["young_k"] = tau / (r["step_ms"] / 1e3)
    for impl in dict.fromkeys(r["impl"] for r in rows):
        ks = [r["young_k"] for r in rows if r["impl"] == impl and "young_k" in r]
        if ks:
            print(f"{impl}: Young's interval for a failure every {mtbf:g} s: commit every "
                  f"~{statistics.median(ks):.0f} steps (sqrt(2 t_commit MTBF) / t_step)")


def plot(rows: list[dict], path: str) -> None:
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for impl in dict.fromkeys(r["impl"] for r in rows):
        mine = [r for r in rows if r["impl"] == impl and r["finished"]]
        ks = [r["k"] for r in mine]
        line = ax1.plot(ks, [r["overhead_s"] for r in mine], "o-", label=f"{impl} measured")
        ax1.plot(ks, [r["predicted_s"] for r in mine], "x--", color=line[0].get_color(),
                 label=f"{impl} predicted")
        ax2.plot(ks, [r["lost_steps"] * r["step_ms"] / 1e3 for r in mine], "o-",
                 label=f"{impl}: lost steps x t_step")
        ax2.plot(ks, [r["recovery_s"] for r in mine], "s:", color=ax2.lines[-1].get_color(),
                 label=f"{impl}: recovery (death to next step)")
    ax1.set(xlabel="commit interval k (steps)", ylabel="seconds",
            title="Time one failure adds to the job")
    ax2.set(xlabel="commit interval k (steps)", ylabel="seconds",
            title="Where it goes: redone steps and restart")
    for ax in (ax1, ax2):  # seconds span 1 ms to several s: log scale, 0 kept (symlog)
        ax.set_yscale("symlog", linthresh=1e-3)
        ax.set_xticks(sorted({r["k"] for r in rows}))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    save_figure(fig, path)


if __name__ == "__main__":  # a torchrun worker: python -m minidist.bench.elastic CONFIG
    _options = json.loads(sys.argv[1])
    _torch_worker(_options, _options.pop("fail"))
