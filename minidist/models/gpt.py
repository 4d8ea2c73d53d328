"""A small GPT, shaped like nanoGPT's ``model.py`` (Karpathy, 2022), for the pipeline, tensor,
ZeRO and hybrid strategies, their tests and their benchmarks.

Token and position embeddings, ``n_layer`` pre-norm blocks of causal self-attention and an MLP
(4x wide, GELU), a final LayerNorm and a linear head, tied to the token embedding by default
as in GPT-2 (Radford et al. 2019). Parameter names follow nanoGPT (``transformer.wte``,
``transformer.h.0.attn.c_attn``, ``lm_head``) so a learner can read both side by side.

Deterministic from ``GPTConfig.seed``: two calls with the same config give the same weights on
every rank. ``forward(idx, targets=None)`` returns ``(logits, loss)``; ``loss`` is ``None``
without targets.

``GPT.stages()`` lists the model as a flat sequence of modules (embedding, blocks, head) whose
composition is ``forward``: the pipeline cuts this list into stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..checks import positive_int


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the model. The defaults train on this machine in seconds (0.11 M parameters
    with ``vocab_size=96``)."""

    vocab_size: int = 96
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    bias: bool = True
    tie_weights: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            positive_int(getattr(self, name), f"GPTConfig.{name}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig: n_embd={self.n_embd} is not divisible by "
                             f"n_head={self.n_head}")


class CausalSelfAttention(nn.Module):
    """Multi-head attention where position t sees positions <= t (Vaswani et al. 2017).
    ``c_attn`` holds the query, key and value projections stacked as [q; k; v] on its
    output dimension, each ``n_head`` blocks of ``head_dim`` rows, as in nanoGPT."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = config.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.c_attn(x).split(self.n_head * self.head_dim, dim=2)
        q, k, v = (z.view(b, t, -1, self.head_dim).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(ln(x)), then x + mlp(ln(x)) (GPT-2's ordering)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Embedding(nn.Module):
    """Token plus learned position embedding; a pipeline's first stage."""

    def __init__(self, wte: nn.Embedding, wpe: nn.Embedding, drop: nn.Dropout) -> None:
        super().__init__()
        self.wte, self.wpe, self.drop = wte, wpe, drop

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.wpe.num_embeddings:
            raise ValueError(f"GPT: sequence of length {t} is longer than block_size="
                             f"{self.wpe.num_embeddings}")
        pos = torch.arange(t, device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))


class Head(nn.Module):
    """Final LayerNorm and the vocabulary projection; a pipeline's last stage."""

    def __init__(self, ln_f: nn.LayerNorm, lm_head: nn.Linear) -> None:
        super().__init__()
        self.ln_f, self.lm_head = ln_f, lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        gen_state = torch.random.get_rng_state()
        torch.manual_seed(config.seed)
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            drop=nn.Dropout(config.dropout),
            h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
            ln_f=nn.LayerNorm(config.n_embd, bias=config.bias),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_weights:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(_init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) (nanoGPT does the same)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        torch.random.set_rng_state(gen_state)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        x = idx
        for module in self.stages():
            x = module(x)
        loss = None if targets is None else lm_loss(x, targets)
        return x, loss

    def stages(self) -> list[nn.Module]:
        """The model as a flat list [embedding, block 0, ..., block n-1, head] whose
        composition is the forward pass; modules share this model's parameters."""
        t = self.transformer
        return [Embedding(t.wte, t.wpe, t.drop), *t.h, Head(t.ln_f, self.lm_head)]

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters counted once (a tied head counts once); ``non_embedding`` leaves out the
        position embedding, as nanoGPT's count does."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if non_embedding else n


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position: the language-modelling loss."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, nn.Embedding):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
