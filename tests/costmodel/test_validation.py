"""``costmodel.validation``: the cost model against published figures. Megatron-LM's Table 1
(Narayanan et al., SC 2021): parameter counts to the printed decimal, throughput per GPU
within a stated tolerance with one efficiency fitted on the first row only; ZeRO's Figure 1
exactly; Megatron-LM's training-time estimates."""

from __future__ import annotations

import pytest

from minidist.costmodel import training_days
from minidist.costmodel.cluster import A100_EFFICIENCY
from minidist.costmodel.validation import (
    MEGATRON_TRAINING_TIME,
    TABLE_1,
    TABLE_1_TOLERANCE,
    ZERO_FIGURE_1,
    calibrated_efficiency,
    table1_comparison,
    table1_model,
    zero_figure1,
)

# Rows the model predicts more than 15% low: the paper's largest models (h >= 16384) reach
# 155-163 TFLOP/s with larger matrix products than the 1.7B row the efficiency was fitted
# on; one constant efficiency (and no overlap) cannot follow that. Kept here so that a
# change to the model that moves any row in or out shows up as a failure to look at.
OUTSIDE_TOLERANCE = {310.1, 529.6, 1008.0}


@pytest.mark.parametrize("row", TABLE_1, ids=lambda r: f"{r.billions}B")
def test_table_1_parameters_to_the_printed_decimal(row):
    assert round(table1_model(row).params / 1e9, 1) == row.billions


@pytest.mark.parametrize("row", TABLE_1, ids=lambda r: f"{r.billions}B")
def test_table_1_is_transcribed_consistently(row):
    """The table's own arithmetic: % of the A100's 312 TFLOP/s and the aggregate PFLOP/s
    (printed from unrounded per-GPU figures: within half a TFLOP/s per GPU)."""
    assert row.dp * row.pp * row.tp == row.gpus and row.batch % row.dp == 0
    assert round(100 * row.tflops / 312) == row.percent_peak
    assert abs(row.petaflops * 1e3 / row.gpus - row.tflops) <= 0.5 + 0.05e3 / row.gpus


def test_efficiency_is_fitted_on_the_first_row_only():
    assert calibrated_efficiency() == pytest.approx(A100_EFFICIENCY, abs=5e-4)
    first = table1_comparison()[0]
    assert first["ratio"] == pytest.approx(1.0, abs=2e-3)


def test_table_1_throughput_within_tolerance():
    rows = table1_comparison()
    outside = {r["billions"] for r in rows if not r["within"]}
    assert outside == OUTSIDE_TOLERANCE
    assert all(abs(r["ratio"] - 1) <= TABLE_1_TOLERANCE for r in rows
               if r["billions"] not in OUTSIDE_TOLERANCE)
    assert all(0.75 < r["ratio"] <= 1.001 for r in rows)  # never above the paper


def test_zero_figure_1_exactly():
    """7.5B parameters, 64 GPUs, K = 12: 120, 31.4, 16.6, 1.9 GB (to the printed decimal)."""
    assert [round(gb, 1) for gb in zero_figure1()] == list(ZERO_FIGURE_1["gb"])
    assert zero_figure1()[0] == 16 * 7.5


@pytest.mark.parametrize("params, tokens, gpus, flops, days", MEGATRON_TRAINING_TIME)
def test_megatron_training_time_estimates(params, tokens, gpus, flops, days):
    """GPT-3 175B, 300B tokens, 1024 A100s at 140 TFLOP/s: 34 days; 1T, 450B tokens, 3072
    at 163: 84 days (Narayanan et al., section 5.1)."""
    assert round(training_days(params, tokens, gpus, flops)) == days
    assert training_days(params, tokens, gpus, flops, recompute=False) == pytest.approx(
        0.75 * training_days(params, tokens, gpus, flops))


def test_training_days_errors():
    with pytest.raises(ValueError, match="tokens must be a positive number, got 0"):
        training_days(1e9, 0, 8, 1e12)
    with pytest.raises(ValueError, match="gpus must be a positive integer"):
        training_days(1e9, 1e9, 0, 1e12)
