"""A synthetic benchmark in the style of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py
(written for this project, not copied): one fixed random batch, a torchvision.models
network, SGD through hvd.DistributedOptimizer, images per second. It ends by checking that
every rank holds the same parameters (the averaged gradients kept the replicas equal).

    minidist run -n 2 synthetic_benchmark.py --model resnet18 --batch-size 4
"""

import argparse
import timeit

import numpy as np
import torch
import torch.nn.functional as F
import torch.optim as optim
from torchvision import models

import minidist.horovod as hvd

parser = argparse.ArgumentParser(description="synthetic benchmark on minidist.horovod")
parser.add_argument("--model", default="resnet18", help="a torchvision.models name")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--image-size", type=int, default=224)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=2)
parser.add_argument("--num-iters", type=int, default=3)
parser.add_argument("--fp16-allreduce", action="store_true")
args = parser.parse_args()

hvd.init()
torch.manual_seed(hvd.rank())  # replicas start apart: broadcast_parameters must fix it
model = getattr(models, args.model)()
optimizer = optim.SGD(model.parameters(), lr=0.01 * hvd.size(), momentum=0.9)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=compression, op=hvd.Average)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, args.image_size, args.image_size)
target = torch.randint(0, 1000, (args.batch_size,))


def benchmark_step():
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(text):
    if hvd.rank() == 0:
        print(text, flush=True)


log(f"Model: {args.model}, batch size {args.batch_size}, ranks {hvd.size()}")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = []
for i in range(args.num_iters):
    seconds = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
    log(f"Iter #{i}: {img_secs[-1]:.1f} img/sec per CPU")
log(f"Img/sec per CPU: {np.mean(img_secs):.1f} +-{1.96 * np.std(img_secs):.1f}")
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * np.mean(img_secs):.1f}")

# The replicas must be bitwise equal: each parameter's max minus min over ranks is zero.
spread = max((hvd.allreduce(p.detach(), op=hvd.Max) - hvd.allreduce(p.detach(), op=hvd.Min))
             .abs().max().item() for p in model.parameters())
log(f"replicas identical: {spread == 0.0}")
