"""A benchmark declared as data: the skeleton most ``minidist bench NAME`` commands share.

Most benches repeated one skeleton: their options, a full and a quick preset, the cases
(variants x world sizes, each case a launch), the best of ``--rounds`` interleaved rounds,
derived columns, a table, a few printed lines, ``--json`` and ``--plot``. :class:`Bench`
holds those parts; a bench module keeps only what is its own (its rank function, how one
case is measured, its derived columns, its plot) and ends with::

    SPEC = Bench(quick_help=..., full=FULL, quick=QUICK, variants=VARIANTS, measure=measure,
                 columns=COLUMNS, derive=derive, plot=plot, ...)
    add_arguments, main = SPEC.add_arguments, SPEC.main

``minidist bench NAME`` calls ``add_arguments(parser)`` and ``main(args)``
(``bench/__init__.py``), as it did before the specs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

from ..checks import int_list, positive_int
from ..notebook import quick_mode
from .timing import add_common_arguments, best_of_rounds, format_table, save_outputs

Case = tuple[dict, Callable[[], dict]]  # (the row's fields, one measurement: a dict with step_s)
Option = tuple[tuple[str, ...], dict]   # argparse's (flags, keywords)


def option(*flags: str, **keywords) -> Option:
    """One bench-specific option, as ``parser.add_argument(*flags, **keywords)`` takes it."""
    return flags, keywords


def _preset(preset: dict, args) -> dict:
    return preset


def _as_measured(rows: list[dict], cfg: dict) -> list[dict]:
    return rows


@dataclass(frozen=True)
class Bench:
    """What a bench declares. Every callable takes the run's ``cfg``: the preset (``full``
    or ``quick``, by ``--quick`` or :func:`minidist.notebook.quick_mode`) with the ``lists``
    and ``--rounds`` given on the command line, then passed through ``configure``.

    * ``cases(cfg)``: the (fields, run) pairs of :func:`timing.best_of_rounds`; by default
      every world size of ``cfg["world_sizes"]`` times every variant (``variants``, or
      ``variants(cfg)``), run as ``measure(variant, world_size, cfg)``;
    * ``derive(rows, cfg)``: the derived columns, after the best rounds are chosen;
    * ``header`` before the table (``header(cfg)``, or a template ``str.format``-ed with the
      config, ``parameters`` and ``millions``, the model's size in millions), ``notes``
      (text, or ``notes(rows, cfg)``) after it, then a line per row from ``summary``:
      ``summary(row)`` (None: nothing to say), or a pair (``when(row)``, a template
      ``str.format``-ed with the row's columns);
    * ``result(rows, cfg)``: what ``main`` returns and ``--json`` writes; by default the
      config (with ``parameters(cfg)``, the model's size, where given) and the rows.
    """

    quick_help: str
    full: dict
    quick: dict
    columns: Sequence[tuple[str, str, str]]
    variants: Sequence[str] | Callable[[dict], Sequence[str]] = ()
    measure: Callable[[str, int, dict], dict] | None = None
    cases: Callable[[dict], list[Case]] | None = None
    configure: Callable[[dict, object], dict] = _preset
    derive: Callable[[list[dict], dict], list[dict]] = _as_measured
    lists: Mapping[str, str] = field(default_factory=dict)  # option dest: an example value
    options: Sequence[Option] = ()
    header: str | Callable[[dict], str] | None = None
    notes: str | Callable[[list[dict], dict], str] = ""
    summary: Callable[[dict], str | None] | tuple[Callable[[dict], bool], str] | None = None
    parameters: Callable[[dict], int] | None = None
    result: Callable[[list[dict], dict], dict] | None = None
    plot: Callable[[list[dict], str], None] | None = None
    plot_help: str | None = "save a plot"  # None: no --plot option

    def add_arguments(self, parser) -> None:
        """The common options (``timing.add_common_arguments``), then this bench's own:
        ``--NAME LIST`` for each of ``lists``, then ``options``."""
        add_common_arguments(parser, self.quick_help, plot_help=self.plot_help)
        for dest, example in self.lists.items():
            parser.add_argument("--" + dest.replace("_", "-"), metavar="LIST",
                                help=f"comma-separated, e.g. {example}")
        for flags, keywords in self.options:
            parser.add_argument(*flags, **keywords)

    def config(self, args) -> dict:
        """The run's configuration from the preset and the command line."""
        quick = getattr(args, "quick", False) or quick_mode()
        cfg = dict(self.quick if quick else self.full)
        for dest in self.lists:
            text = getattr(args, dest, None)
            if text:
                cfg[dest] = tuple(int_list(text, "--" + dest.replace("_", "-")))
        if getattr(args, "rounds", None) is not None:
            cfg["rounds"] = positive_int(args.rounds, "--rounds")
        return self.configure(cfg, args)

    def all_cases(self, cfg: dict) -> list[Case]:
        if self.cases is not None:
            return self.cases(cfg)
        variants = self.variants(cfg) if callable(self.variants) else self.variants
        return [({"world_size": p, "variant": v}, partial(self.measure, v, p, cfg))
                for p in cfg["world_sizes"] for v in variants]

    def run(self, cfg: dict) -> list[dict]:
        """Every case ``cfg["rounds"]`` times, interleaved so that all see the same machine;
        each row its best round (other processes only ever slow a run down), derived."""
        return self.derive(best_of_rounds(self.all_cases(cfg), cfg["rounds"]), cfg)

    def report(self, rows: list[dict], cfg: dict) -> None:
        print(format_table(rows, self.columns))
        notes = self.notes(rows, cfg) if callable(self.notes) else self.notes
        if notes:
            print("\n" + notes)
        for line in _lines(self.summary, rows):
            print(line)

    def outcome(self, rows: list[dict], cfg: dict) -> dict:
        """What ``main`` returns and ``--json`` writes."""
        if self.result is not None:
            return self.result(rows, cfg)
        if self.parameters is not None:
            cfg = dict(cfg, parameters=self.parameters(cfg))
        return {"config": cfg, "rows": rows}

    def measure_and_report(self, args) -> tuple[list[dict], dict]:
        """Configure, print the header, run, print the report; (rows, result)."""
        cfg = self.config(args)
        if callable(self.header):
            print(self.header(cfg))
        elif self.header is not None:
            size = self.parameters(cfg) if self.parameters is not None else 0
            print(self.header.format(**cfg, parameters=size, millions=size / 1e6))
        rows = self.run(cfg)
        self.report(rows, cfg)
        return rows, self.outcome(rows, cfg)

    def main(self, args) -> dict:
        """``minidist bench NAME``: measure, report, write ``--json`` and ``--plot``."""
        rows, result = self.measure_and_report(args)
        draw = None if self.plot is None else partial(self.plot, rows)
        return save_outputs(args, result, draw)


def _lines(summary, rows: Iterable[dict]) -> list[str]:
    if summary is None:
        return []
    if isinstance(summary, tuple):
        when, template = summary
        return [template.format(**r) for r in rows if when(r)]
    return [line for line in map(summary, rows) if line is not None]


# -- derived columns most benches share ---------------------------------------------------
def slowest(ranks: Iterable[dict]) -> dict:
    """The rank with the longest ``step_s``: a step is as slow as its slowest rank."""
    return dict(max(ranks, key=lambda r: r["step_s"]))


def add_speed(row: dict) -> dict:
    """``ms`` and ``steps_per_s`` from the row's ``step_s``."""
    row["ms"], row["steps_per_s"] = row["step_s"] * 1e3, 1 / row["step_s"]
    return row


def speedup(row: dict, reference: dict | None) -> float | None:
    """How many times faster ``row`` ran than ``reference`` (None without one)."""
    return reference["step_s"] / row["step_s"] if reference else None
