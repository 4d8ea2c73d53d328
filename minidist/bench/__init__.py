"""Benchmarks: ``minidist bench NAME``. Each module has ``add_arguments(parser)`` and
``main(args)``; add a new one by naming its module here."""

BENCHMARKS = {
    "p2p": "minidist.bench.p2p",
    "collectives": "minidist.bench.collectives",
    "ddp": "minidist.bench.ddp",
    "faults": "minidist.bench.faults",
}
