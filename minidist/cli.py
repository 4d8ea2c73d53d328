"""The ``minidist`` command: run, bench, grade, doctor, demo, book."""

from __future__ import annotations

import argparse
import importlib
import sys

from . import book
from .bench import BENCHMARKS
from .grading import grade


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minidist", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a script on N ranks (like torchrun)")
    run.add_argument("-n", "--nprocs", type=int, required=True, help="number of ranks")
    run.add_argument("--backend", choices=("local", "torch"), default="local")
    run.add_argument("--device", default="cpu", help="cpu or cuda")
    run.add_argument("--timeout", type=float, help="seconds a blocking call may wait")
    run.add_argument("-m", dest="module", help="run a module, as python -m does")
    run.add_argument("script", nargs="?", help="the script to run")
    run.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    bench = sub.add_parser("bench", help="benchmarks against torch.distributed")
    bsub = bench.add_subparsers(dest="benchmark", required=True)
    for name, module in BENCHMARKS.items():
        mod = importlib.import_module(module)
        mod.add_arguments(bsub.add_parser(name, help=(mod.__doc__ or "").splitlines()[0]))
    grade.add_arguments(sub.add_parser("grade", help="grade exercise notebooks"))
    doctor = sub.add_parser("doctor", help="what this machine can run")
    doctor.add_argument("--gpu", action="store_true",
                        help="verify on this machine's GPUs: the GPU tests and a benchmark")
    demo = sub.add_parser("demo", help="launch 4 ranks and show what they exchange")
    demo.add_argument("-n", "--nprocs", type=int, default=4)
    demo.add_argument("--backend", choices=("local", "torch"), default="local")
    book.add_arguments(sub.add_parser("book", help="build the lessons, exercises, guide and "
                                      "API reference as a static web site"))
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "run":
        from .launch.script_runner import run

        if args.module:
            command = ["-m", args.module] + ([args.script] if args.script else []) + args.args
        elif args.script:
            command = [args.script] + args.args
        else:
            print("minidist run: name a script or -m module", file=sys.stderr)
            return 2
        return run(args.nprocs, command, args.backend, args.device, args.timeout)
    if args.command == "bench":
        importlib.import_module(BENCHMARKS[args.benchmark]).main(args)
        return 0
    if args.command == "grade":
        return grade.main(args)
    if args.command == "doctor":
        from .doctor import main as doctor

        return doctor(gpu=args.gpu)
    if args.command == "demo":
        from .demo import main as demo

        demo(args.nprocs, args.backend)
        return 0
    if args.command == "book":
        return book.main(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
