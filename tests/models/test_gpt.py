"""The small GPT: deterministic, causal, its stage list composes to forward, and its loss is
the plain cross-entropy."""

import pytest
import torch
import torch.nn.functional as F

import minidist as md


def _model(**kw):
    return md.models.GPT(md.models.GPTConfig(**kw))


def test_same_seed_same_weights_different_seed_different():
    a, b, c = _model(), _model(), _model(seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)


def test_construction_leaves_the_global_rng_alone():
    torch.manual_seed(5)
    want = torch.rand(3)
    torch.manual_seed(5)
    _model()
    assert torch.equal(torch.rand(3), want)


def test_stages_compose_to_forward_and_share_parameters():
    m = _model(n_layer=3, tie_weights=False)
    x = torch.randint(96, (4, 16))
    h = x
    for s in m.stages():
        h = s(h)
    assert torch.equal(h, m(x)[0])
    stage_params = {id(p) for s in m.stages() for p in s.parameters()}
    assert stage_params == {id(p) for p in m.parameters()}


def test_loss_is_cross_entropy_over_every_position():
    m = _model()
    x, y = md.models.synthetic_tokens(1, 3, 8, 96)[0]
    logits, loss = m(x, y)
    assert logits.shape == (3, 8, 96)
    assert torch.allclose(loss, F.cross_entropy(logits.transpose(1, 2), y))
    assert m(x)[1] is None


def test_causal_a_later_token_does_not_change_earlier_logits():
    m = _model()
    x = torch.randint(96, (1, 10))
    x2 = x.clone()
    x2[0, 7] = (x2[0, 7] + 1) % 96
    a, b = m(x)[0], m(x2)[0]
    assert torch.equal(a[:, :7], b[:, :7]) and not torch.equal(a[:, 7:], b[:, 7:])


def test_tied_head_counts_once_and_matches_megatron_count():
    tied, untied = _model(), _model(tie_weights=False)
    assert tied.lm_head.weight is tied.transformer.wte.weight
    assert untied.num_params() - tied.num_params() == 96 * 64
    c = tied.config
    # Megatron-LM's 12*l*h^2 (1 + 13/(12h) + (V+s)/(12lh)) counts weights, biases and the
    # blocks' norms; the final LayerNorm (2h) is the one thing it leaves out
    assert tied.num_params() == md.costmodel.transformer_params(
        c.n_layer, c.n_embd, c.vocab_size, c.block_size) + 2 * c.n_embd


def test_a_few_steps_learn_the_text():
    data = md.models.CharText()
    assert data.vocab_size == 96 and data.decode(data.encode("Hello\n")) == "Hello\n"
    m = _model()
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for x, y in data.batches(60, 8, 32):
        loss = m(x, y)[1]
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 4.0 and sum(losses[-10:]) / 10 < 3.4


@pytest.mark.parametrize("kw, words", [
    ({"n_embd": 63, "n_head": 2}, "not divisible"),
    ({"n_layer": 0}, "n_layer"),
])
def test_bad_config_names_the_mistake(kw, words):
    with pytest.raises(ValueError, match=words):
        md.models.GPTConfig(**kw)


def test_too_long_a_sequence_is_a_clear_error():
    with pytest.raises(ValueError, match="block_size"):
        _model(block_size=8)(torch.zeros(1, 9, dtype=torch.long))
