"""``minidist bench horovod --quick`` runs its three rows (timings are reported, never
asserted)."""

from __future__ import annotations

import argparse

from minidist.bench import horovod as bench


def test_quick_bench_reports_every_row(tmp_path):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    args = parser.parse_args(["--quick", "--json", str(tmp_path / "out.json")])
    result = bench.main(args)
    assert [r["variant"] for r in result["rows"]] == list(bench.VARIANTS)
    assert all(r["img_per_s"] > 0 for r in result["rows"])
    assert result["config"]["parameters"] == 11_689_512  # resnet18, stand-in or real
    assert (tmp_path / "out.json").exists()
