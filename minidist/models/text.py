"""Datasets for the small GPT that need no download.

``CharText``: a character-level corpus from the Python documentation shipped with Python itself
(``pydoc_data.topics``, about 465 000 characters), mapped to 96 symbols (printable ASCII, a
newline, and ``?`` for anything else). ``synthetic_tokens``: random token sequences from a
seed, for tests that only need shapes and determinism.
"""

from __future__ import annotations

import string

import torch

# 95 printable ASCII characters plus newline = 96 symbols; anything else maps to "?"
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))
assert len(ALPHABET) == 96 and set(string.ascii_letters) <= set(ALPHABET)


class CharText:
    """The Python docs as one long tensor of character ids; ``batch`` cuts random windows.

    ``vocab_size`` is 96; ``encode``/``decode`` convert text. ``split="train"`` is the first
    90%, ``"val"`` the rest.
    """

    vocab_size = len(ALPHABET)

    def __init__(self, split: str = "train") -> None:
        if split not in ("train", "val"):
            raise ValueError(f"CharText: split must be 'train' or 'val', got {split!r}")
        from pydoc_data import topics

        text = "".join(topics.topics[k] for k in sorted(topics.topics))
        ids = self.encode(text)
        cut = int(0.9 * len(ids))
        self.data = ids[:cut] if split == "train" else ids[cut:]

    @staticmethod
    def encode(text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(ALPHABET)}
        unknown = index["?"]
        return torch.tensor([index.get(c, unknown) for c in text], dtype=torch.long)

    @staticmethod
    def decode(ids: torch.Tensor | list[int]) -> str:
        return "".join(ALPHABET[int(i)] for i in ids)

    def batch(self, batch_size: int, block_size: int,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of shape ``(batch_size, block_size)``: y is x shifted one character on."""
        if block_size >= len(self.data):
            raise ValueError(f"CharText.batch: block_size={block_size} exceeds the corpus")
        starts = torch.randint(len(self.data) - block_size - 1, (batch_size,),
                               generator=generator)
        x = torch.stack([self.data[s:s + block_size] for s in starts.tolist()])
        y = torch.stack([self.data[s + 1:s + 1 + block_size] for s in starts.tolist()])
        return x, y

    def batches(self, steps: int, batch_size: int, block_size: int,
                seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``steps`` batches, the same for every caller with the same seed (every rank)."""
        g = torch.Generator().manual_seed(seed)
        return [self.batch(batch_size, block_size, g) for _ in range(steps)]


def synthetic_tokens(steps: int, batch_size: int, block_size: int, vocab_size: int,
                     seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` batches of uniformly random tokens ``(x, y)``, y being x shifted by one."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        seq = torch.randint(vocab_size, (batch_size, block_size + 1), generator=g)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out
