"""TensorFlow's MirroredStrategy beside minidist's DDP: the same model, data and step give
the same averaged gradient (float32 tolerance), and one process on the whole batch agrees
with both; so does MultiWorkerMirroredStrategy with two worker processes. Needs the
optional extra (pip install -e ".[tensorflow]"); skipped without it.
TensorFlow runs in a subprocess so that this process (which forks the minidist ranks) never
starts TensorFlow's threads."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minidist as md

SCRIPT = Path(__file__).parent / "scripts" / "tf_mirrored.py"
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None,
    reason='TensorFlow is not installed: pip install -e ".[tensorflow]"')


def _problem():
    spec = importlib.util.spec_from_file_location("tf_mirrored", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [torch.from_numpy(a) for a in module.problem()]


def _model(w1, b1, w2, b2):
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    with torch.no_grad():
        for p, v in zip(model.parameters(), (w1, b1, w2, b2)):
            p.copy_(v)
    return model


def _ddp_grads(comm, tensors):
    w1, b1, w2, b2, x, y = tensors
    ddp = md.DistributedDataParallel(_model(w1, b1, w2, b2), comm)
    xs, ys = x[4 * comm.rank:][:4], y[4 * comm.rank:][:4]
    torch.nn.functional.mse_loss(ddp(xs), ys).backward()
    return [p.grad.clone() for p in ddp.module.parameters()]


def test_mirrored_strategy_averages_like_ddp_and_one_process():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 0, proc.stderr[-3000:]
    tf_out = json.loads(proc.stdout)
    assert tf_out["cross_device_ops"] == "CollectiveAllReduce"  # TensorFlow's all-reduce
    assert tf_out["replicas"] == 2 and len(tf_out["devices"]) == 2

    tensors = _problem()
    model = _model(*tensors[:4])
    torch.nn.functional.mse_loss(model(tensors[4]), tensors[5]).backward()
    one = [p.grad for p in model.parameters()]
    ddp = md.launch(_ddp_grads, 2, args=(tensors,))
    for i, want in enumerate(one):
        for replica in tf_out["grads"][i]:  # both replicas hold the average
            torch.testing.assert_close(torch.tensor(replica), want, rtol=1e-5, atol=1e-6)
        for rank in ddp:
            torch.testing.assert_close(rank[i], want, rtol=1e-5, atol=1e-6)


def _unshare_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-rn", "true"], capture_output=True).returncode == 0


# TensorFlow's gRPC server listens on every interface (*:port), whatever TF_CONFIG says, so
# the two workers run in a network namespace of their own that holds only loopback: nothing
# they open can be reached from another machine.
WORKERS = """
ip link set lo up
for i in 0 1; do
  TF_CONFIG='{"cluster": {"worker": ["127.0.0.1:23456", "127.0.0.1:23457"]}, '\\
'"task": {"type": "worker", "index": '$i'}}' "$PYTHON" "$SCRIPT" > "$OUT/$i.json" &
done
wait
"""


@pytest.mark.slow
@pytest.mark.skipif(not _unshare_works(), reason="needs unshare -rn (a private network "
                    "namespace) to keep TensorFlow's servers off the network")
def test_multi_worker_mirrored_strategy_on_two_processes(tmp_path):
    script = SCRIPT.with_name("tf_multiworker.py")
    env = dict(os.environ, PYTHON=sys.executable, SCRIPT=str(script), OUT=str(tmp_path),
               CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(["unshare", "-rn", "bash", "-euc", WORKERS], capture_output=True,
                          text=True, timeout=400, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    tensors = _problem()
    model = _model(*tensors[:4])
    torch.nn.functional.mse_loss(model(tensors[4]), tensors[5]).backward()
    for i in (0, 1):
        out = json.loads((tmp_path / f"{i}.json").read_text())
        assert out["index"] == i and out["replicas"] == 2
        assert out["cross_device_ops"] == "CollectiveAllReduce"
        for got, p in zip(out["grads"], model.parameters()):
            torch.testing.assert_close(torch.tensor(got), p.grad, rtol=1e-5, atol=1e-6)
