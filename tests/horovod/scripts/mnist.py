"""MNIST-style training in the style of Horovod's examples/pytorch/pytorch_mnist.py (written
for this project, not copied), on torchvision.datasets.MNIST (the tests' stand-in generates
the images). Every rank trains on its shard (DistributedSampler), metrics are averaged
with hvd.allreduce, and with --uneven each rank stops r batches early and calls hvd.join().

    minidist run -n 2 mnist.py --epochs 2        or   python mnist.py --num-proc 2
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import torch.utils.data.distributed
from torchvision import datasets, transforms

import minidist.horovod as hvd

parser = argparse.ArgumentParser(description="MNIST on minidist.horovod")
parser.add_argument("--batch-size", type=int, default=64)
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--backward-passes-per-step", type=int, default=1)
parser.add_argument("--uneven", action="store_true", help="rank r skips its last r batches")
parser.add_argument("--num-proc", type=int, help="start the ranks with hvd.run")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return F.log_softmax(self.fc2(F.relu(self.fc1(x.flatten(1)))), dim=1)


def metric_average(value, name):
    return hvd.allreduce(torch.tensor(value), name=name).item()


def main(args):
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    if hvd.rank() == 0:
        print(f"size {hvd.size()} local_size {hvd.local_size()} cross_size {hvd.cross_size()} "
              f"mpi {hvd.mpi_built()} gloo {hvd.gloo_built()}", flush=True)
    print(f"rank {hvd.rank()} local_rank {hvd.local_rank()} cross_rank {hvd.cross_rank()}",
          flush=True)
    to_tensor = transforms.Compose([transforms.ToTensor(),
                                    transforms.Normalize((0.1307,), (0.3081,))])
    train_set = datasets.MNIST("data", train=True, download=True, transform=to_tensor)
    test_set = datasets.MNIST("data", train=False, transform=to_tensor)
    train_sampler = torch.utils.data.distributed.DistributedSampler(
        train_set, num_replicas=hvd.size(), rank=hvd.rank())
    test_sampler = torch.utils.data.distributed.DistributedSampler(
        test_set, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size,
                                               sampler=train_sampler)
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=256, sampler=test_sampler)

    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(
        optimizer, named_parameters=model.named_parameters(), compression=compression,
        backward_passes_per_step=args.backward_passes_per_step,
        gradient_predivide_factor=args.gradient_predivide_factor)
    start = hvd.broadcast_object(1 if hvd.rank() == 0 else None, root_rank=0)

    for epoch in range(start, args.epochs + 1):
        train(args, model, optimizer, train_sampler, train_loader, epoch)
        test(model, test_loader, test_sampler)
    same = all([torch.equal(hvd.broadcast(p.detach(), root_rank=0), p.detach())
                for p in model.parameters()])  # a list: every rank joins every broadcast
    print(f"rank {hvd.rank()} replicas identical: {same}", flush=True)
    return same


def train(args, model, optimizer, sampler, loader, epoch):
    model.train()
    sampler.set_epoch(epoch)
    batches = len(loader) - (hvd.rank() if args.uneven else 0)
    passes = args.backward_passes_per_step
    for i, (data, target) in enumerate(loader):
        if i == batches:
            break
        if i % passes == 0:
            optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        if i % passes == passes - 1:
            optimizer.step()
        if i % 8 == 0 and hvd.rank() == 0:
            print(f"Train Epoch: {epoch} [{i * len(data)}/{len(sampler)}]\tLoss: "
                  f"{loss.item():.6f}", flush=True)
    if args.uneven:
        print(f"rank {hvd.rank()} joined; last to join: {hvd.join()}", flush=True)
        # a rank that joined early missed the others' last steps: take rank 0's weights
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)


def test(model, loader, sampler):
    model.eval()
    loss, correct = 0.0, 0.0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += (output.argmax(1) == target).float().sum().item()
    loss = metric_average(loss / len(sampler), "avg_loss")
    accuracy = metric_average(correct / len(sampler), "avg_accuracy")
    if hvd.rank() == 0:
        print(f"Test set: Average loss: {loss:.4f}, Accuracy: {100 * accuracy:.2f}%",
              flush=True)


if __name__ == "__main__":
    args = parser.parse_args()
    if args.num_proc:
        print("Running training through hvd.run", flush=True)
        print(f"results: {hvd.run(main, args=(args,), np=args.num_proc)}", flush=True)
    else:
        main(args)
