"""Smoke test of the compression half of ``minidist bench comm`` in quick mode: every row is
there, bytes come from comm.stats for minidist and from the formulas for torch, and the
ratios the table prints follow from the bytes. Timings are never asserted."""

from __future__ import annotations

import argparse

import matplotlib
import pytest

from minidist.bench import comm_compression as cc

matplotlib.use("Agg")


def parse(*argv: str):
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    cc.add_arguments(parser)
    return parser.parse_args(["--quick", *argv])


def test_quick_run_rows_bytes_and_plot(capsys):
    result = cc.measure(parse())
    rows = result["rows"]
    assert {(r["impl"], r["method"], r["network"]) for r in rows} == (
        {("minidist", m, n) for m in cc.MINIDIST for n in ("local", "emulated")}
        | {("torch", m, "local") for m in cc.TORCH})
    by = {(r["impl"], r["method"], r["network"]): r for r in rows}
    none = by["minidist", "none", "local"]["sent"]
    assert by["torch", "none", "local"]["sent"] == none  # formula == counted, float32 ring
    assert by["minidist", "fp16", "local"]["sent"] == none / 2
    assert by["minidist", "PowerSGD", "local"]["sent"] == by["torch", "PowerSGD", "local"]["sent"]
    # minidist's PowerSGD under torch DDP saw the same matrices in torch's bucket
    theirs = by["torch", "minidist PowerSGD", "local"]
    assert theirs["bytes_source"] == "hook report"
    assert theirs["sent"] == by["torch", "PowerSGD", "local"]["sent"]
    assert by["minidist", "top-k", "emulated"]["sent"] == by["minidist", "top-k", "local"]["sent"]
    assert 0 < by["minidist", "local SGD", "local"]["sent"] < none
    assert result["goal"]["powersgd_bytes_vs_none"] == pytest.approx(
        by["minidist", "PowerSGD", "local"]["sent"] / none)
    out = capsys.readouterr().out
    assert "Goal: PowerSGD rank 2" in out and "emulated 1 Gbit/s" in out
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2)
    cc.plot(result, axes)
    assert axes[0].get_xlabel() and axes[1].get_ylabel()
    plt.close(fig)


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="--ddp-topk-ratio"):
        cc.measure(parse("--ddp-topk-ratio", "0"))
    with pytest.raises(ValueError, match="--ddp-period"):
        cc.measure(parse("--ddp-period", "0"))
