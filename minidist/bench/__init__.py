"""Benchmarks: ``minidist bench NAME``. Each module has ``add_arguments(parser)`` and
``main(args)``; add a new one by naming its module here."""

BENCHMARKS = {
    "p2p": "minidist.bench.p2p",
    "collectives": "minidist.bench.collectives",
    "ddp": "minidist.bench.ddp",
    "faults": "minidist.bench.faults",
    "blame": "minidist.bench.blame",
    "pipeline": "minidist.bench.pipeline",
    "tensor": "minidist.bench.tensor",
    "ps": "minidist.bench.param_server",
    "zero": "minidist.bench.zero",
    "hybrid": "minidist.bench.hybrid",
    "amp": "minidist.bench.amp",
    "elastic": "minidist.bench.elastic",
    "costmodel": "minidist.bench.costmodel",
    "comm": "minidist.bench.comm",
    "emulation": "minidist.bench.emulation",
    "horovod": "minidist.bench.horovod",
    "torch-backend": "minidist.bench.torch_backend",
}
