"""The example-style scripts (tests/horovod/scripts: a synthetic benchmark and MNIST
training, written in the style of Horovod's examples) run unchanged under `minidist run`,
torchrun and hvd.run, with the stand-in torchvision on their path."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HERE = Path(__file__).parent
SCRIPTS = HERE / "scripts"
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE / "standin"),
                                                   os.environ.get("PYTHONPATH", "")]),
           OMP_NUM_THREADS="1")
SMALL = ["--model", "resnet18", "--batch-size", "2", "--image-size", "64",
         "--num-warmup-batches", "1", "--num-batches-per-iter", "1", "--num-iters", "2"]


def run(*command, cwd):
    proc = subprocess.run(list(command), capture_output=True, text=True, timeout=300, env=ENV,
                          cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def minidist_run(n, script, *args, cwd):
    return run(sys.executable, "-m", "minidist.cli", "run", "-n", str(n),
               str(SCRIPTS / script), *args, cwd=cwd)


def test_synthetic_benchmark_under_minidist_run(tmp_path):
    out = minidist_run(2, "synthetic_benchmark.py", *SMALL, cwd=tmp_path)
    assert "Total img/sec on 2 CPU(s)" in out
    assert "replicas identical: True" in out  # they started from different seeds


@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun is not installed")
def test_synthetic_benchmark_under_torchrun(tmp_path):
    out = run("torchrun", "--nproc-per-node", "2", "--standalone",
              str(SCRIPTS / "synthetic_benchmark.py"), *SMALL, "--fp16-allreduce",
              cwd=tmp_path)
    assert "replicas identical: True" in out


def test_mnist_learns_and_joins_under_minidist_run(tmp_path):
    out = minidist_run(2, "mnist.py", "--epochs", "2", "--uneven", cwd=tmp_path)
    assert "size 2 local_size 2 cross_size 1 mpi False" in out
    assert "rank 1 local_rank 1 cross_rank 0" in out
    losses = [float(x) for x in re.findall(r"Average loss: ([0-9.]+)", out)]
    assert len(losses) == 2 and losses[1] < losses[0]
    # rank 1 stops a batch early each epoch; rank 0, with every batch, joins last
    assert out.count("rank 1 joined; last to join: 0") == 2
    assert "rank 0 replicas identical: True" in out and "rank 1 replicas identical: True" in out


def test_mnist_through_hvd_run(tmp_path):
    out = run(sys.executable, str(SCRIPTS / "mnist.py"), "--epochs", "1", "--num-proc", "2",
              "--fp16-allreduce", "--gradient-predivide-factor", "2",
              "--backward-passes-per-step", "2", cwd=tmp_path)
    assert "Running training through hvd.run" in out and "results: [True, True]" in out


def test_standin_resnets_have_torchvisions_parameter_counts():
    sys.path.insert(0, str(HERE / "standin"))
    try:
        from torchvision import models
    finally:  # leave no stand-in behind for other tests to import
        sys.path.remove(str(HERE / "standin"))
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
    # torchvision's published counts (torchvision.models documentation, "Num Params")
    for name, count in [("resnet18", 11_689_512), ("resnet34", 21_797_672),
                        ("resnet50", 25_557_032), ("resnet101", 44_549_160)]:
        assert sum(p.numel() for p in getattr(models, name)().parameters()) == count, name
