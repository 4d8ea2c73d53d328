"""``costmodel.transformer``: a GPT's shape, and the FLOPs of a step against Megatron-LM's closed
forms (Narayanan et al., SC 2021, section 5.1) and Kaplan et al.'s 6 N D."""

from __future__ import annotations

import pytest

import minidist as md
from minidist.costmodel import GPT3_175B, GPTShape, model_flops, step_flops

SMALL = GPTShape(layers=24, hidden=2304, heads=24, vocab=51200, seq=2048)


@pytest.mark.parametrize("model", [SMALL, GPT3_175B], ids=["1.7B", "175B"])
def test_full_recompute_is_megatrons_96_formula(model):
    """96 B s l h^2 (1 + s/6h + V/16lh), exactly (up to float rounding)."""
    b, s, n, h, v = 512, model.seq, model.layers, model.hidden, model.vocab
    paper = 96 * b * s * n * h * h * (1 + s / (6 * h) + v / (16 * n * h))
    assert step_flops(model, b, "full") == pytest.approx(paper, rel=1e-12)


def test_no_recompute_and_selective():
    """Without recomputation: 72 B s l h^2 (1 + s/6h + V/12lh) (the logit layer keeps its
    6 B s h V); selective recomputation adds the attention scores' forward, 4 B s^2 h l."""
    m, b = GPT3_175B, 8
    s, n, h, v = m.seq, m.layers, m.hidden, m.vocab
    none = 72 * b * s * n * h * h * (1 + s / (6 * h) + v / (12 * n * h))
    assert step_flops(m, b) == pytest.approx(none, rel=1e-12) == model_flops(m, b)
    assert step_flops(m, b, "selective") - step_flops(m, b) == pytest.approx(
        4 * b * s * s * h * n, rel=1e-12)
    # full recomputation: every layer's forward once more (the logit layer not)
    assert step_flops(m, b, "full") - step_flops(m, b) == pytest.approx(
        n * (24 * b * s * h * h + 4 * b * s * s * h), rel=1e-12)


def test_model_flops_are_about_6_n_d():
    """Kaplan et al. 2020's C = 6 N D per token is the 72 formula without the s/6h term and
    the position embedding: within 10% for GPT-3 (the attention scores add s/6h = 2.8%)."""
    tokens = 8 * GPT3_175B.seq
    ratio = model_flops(GPT3_175B, 8) / (6 * GPT3_175B.params * tokens)
    assert 1.0 < ratio < 1.1


def test_shape_from_a_config_and_params():
    cfg = md.models.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32)
    shape = GPTShape.from_config(cfg)
    assert (shape.layers, shape.hidden, shape.heads, shape.vocab, shape.seq) == (2, 32, 4, 64, 16)
    assert shape.params == md.costmodel.transformer_params(2, 32, 64, 16)
    assert round(GPT3_175B.params / 1e9, 1) == 174.6


@pytest.mark.parametrize("kwargs, message", [
    ({"layers": 0}, "layers must be a positive integer, got 0"),
    ({"hidden": 100}, "hidden=100 must be divisible by heads=24"),
    ({"heads": 2.5}, "heads must be a positive integer, got 2.5"),
    ({"vocab": True}, "vocab must be a positive integer, got True"),
])
def test_bad_shapes_are_named(kwargs, message):
    args = dict(layers=24, hidden=2304, heads=24, vocab=51200, seq=2048) | kwargs
    with pytest.raises(ValueError, match=message):
        GPTShape(**args)


def test_bad_flops_arguments():
    with pytest.raises(ValueError, match="recompute must be one of"):
        step_flops(SMALL, 8, "sometimes")
    with pytest.raises(ValueError, match="batch .* must be a positive integer, got 0"):
        step_flops(SMALL, 0)


def test_untied_head_adds_v_h():
    cfg = md.models.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_embd=32,
                              tie_weights=False)
    shape = GPTShape.from_config(cfg)
    assert shape.params == md.costmodel.transformer_params(2, 32, 64, 16) + 64 * 32
    assert shape.params + 2 * 32 == md.models.GPT(cfg).num_params()  # + the final LayerNorm
