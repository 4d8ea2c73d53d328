"""``md.costmodel`` against the papers' own numbers: Megatron-LM's Table 1 (Narayanan et al.,
SC 2021), ZeRO's Figure 1 example (Rajbhandari et al., SC 2020), the pipeline bubble (GPipe,
Huang et al. 2019; interleaved schedule, Narayanan et al. SC 2021)."""

from __future__ import annotations

import pytest

import minidist as md

# Narayanan et al. 2021, Table 1 (arXiv:2104.04473): billions of parameters, hidden size,
# layers; every model has V = 51200 and s = 2048. The table prints one decimal.
MEGATRON_TABLE_1 = [(1.7, 2304, 24), (3.6, 3072, 30), (7.5, 4096, 36), (18.4, 6144, 40),
                    (39.1, 8192, 48), (76.1, 10240, 60), (145.6, 12288, 80),
                    (310.1, 16384, 96), (529.6, 20480, 105), (1008.0, 25600, 128)]


@pytest.mark.parametrize("billions, hidden, layers", MEGATRON_TABLE_1)
def test_transformer_params_reproduces_megatron_table_1(billions, hidden, layers):
    p = md.costmodel.transformer_params(layers, hidden, 51200, 2048)
    assert round(p / 1e9, 1) == billions  # the table's figure, at the table's precision
    assert p / 1e9 == pytest.approx(billions, rel=0.03 if billions < 5 else 0.005)


def test_transformer_params_gpt3_and_the_closed_form():
    p = md.costmodel.transformer_params(96, 12288, 51200, 2048)
    assert p == pytest.approx(175e9, rel=0.01)
    n, h, v, s = 24, 2304, 51200, 2048
    paper = 12 * n * h**2 * (1 + 13 / (12 * h) + (v + s) / (12 * n * h))
    assert md.costmodel.transformer_params(n, h, v, s) == pytest.approx(paper, rel=1e-12)
    assert isinstance(md.costmodel.transformer_params(n, h, v, s), int)


def test_zero_memory_reproduces_the_papers_example():
    """Psi = 7.5B, Nd = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.9 GB (ZeRO, Figure 1)."""
    gb = [md.costmodel.zero_memory(7.5e9, 64, stage)["total"] / 1e9 for stage in range(4)]
    assert [round(g, 1) for g in gb] == [120.0, 31.4, 16.6, 1.9]


def test_zero_memory_parts():
    psi, nd = 1000, 8
    m = [md.costmodel.zero_memory(psi, nd, s) for s in range(4)]
    assert m[0] == {"params": 2000, "grads": 2000, "optimizer": 12000, "total": 16000}
    assert m[1]["optimizer"] == 1500 and m[1]["grads"] == 2000
    assert m[2]["grads"] == 250 and m[2]["params"] == 2000
    assert m[3] == {"params": 250, "grads": 250, "optimizer": 1500, "total": 2000}
    assert md.costmodel.zero_memory(psi, 1, 3) == m[0]  # one rank: nothing to shard
    sgd = md.costmodel.zero_memory(psi, nd, 0, optimizer_bytes=4)  # fp32 master weights only
    assert sgd["optimizer"] == 4000 and sgd["total"] == 8000


def test_bubble_fraction_both_forms():
    bf, bo = md.costmodel.bubble_fraction, md.costmodel.bubble_overhead
    assert bf(4, 8) == pytest.approx(3 / 11)  # GPipe: (p-1) / (m + p-1) of the step idle
    assert bo(4, 8) == pytest.approx(3 / 8)  # the paper's (p-1) / m
    assert bf(4, 8, chunks=2) == pytest.approx(3 / 19)  # interleaved: (p-1) / (v m + p-1)
    assert bo(4, 8, chunks=2) == pytest.approx(3 / 16)
    assert bf(1, 5) == 0 and bo(1, 5) == 0  # one stage: no pipeline, no bubble
    for p, m, v in [(8, 32, 1), (8, 32, 4), (2, 1, 1)]:
        f, o = bf(p, m, v), bo(p, m, v)
        assert f == pytest.approx(o / (1 + o))  # idle share = overhead / (1 + overhead)
    assert bf(8, 10_000) < 1e-3


@pytest.mark.parametrize("call, error, words", [
    (lambda c: c.transformer_params(0, 1024, 51200, 2048), ValueError, "layers"),
    (lambda c: c.transformer_params(24, 1024.5, 51200, 2048), TypeError, "hidden"),
    (lambda c: c.transformer_params(24, 1024, -3, 2048), ValueError, "vocab"),
    (lambda c: c.zero_memory(7.5e9, 64, 4), ValueError, "stage must be one of 0, 1, 2, 3"),
    (lambda c: c.zero_memory(7.5e9, 64, True), ValueError, "stage"),
    (lambda c: c.zero_memory(7.5e9, 0, 1), ValueError, "dp"),
    (lambda c: c.zero_memory(-1, 8, 1), ValueError, "params"),
    (lambda c: c.zero_memory(1e9, 8, 1, optimizer_bytes=-4), ValueError, "optimizer_bytes"),
    (lambda c: c.bubble_fraction(0, 8), ValueError, "stages"),
    (lambda c: c.bubble_fraction(4, 0), ValueError, "microbatches"),
    (lambda c: c.bubble_fraction(4, 8, chunks=0), ValueError, "chunks"),
    (lambda c: c.bubble_overhead(4, 2.5), TypeError, "microbatches"),
])
def test_bad_input_is_named(call, error, words):
    with pytest.raises(error, match=words):
        call(md.costmodel)
