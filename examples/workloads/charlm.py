"""What the seed workloads share: a character corpus made in code, a
minGPT-style model, the batch of each step, and the lines they print.

Everything is deterministic and depends on the step alone, never on the
world size or on how the run got there: the global batch of step s is the
same whether one, two or three nodes train it, and each rank takes its
slice of it. So the loss of a step, averaged over the world, continues
across a restart from a checkpoint on fewer nodes.

Lines the e2e tests read (rank 0 only, one write per line):
  RDZV_LOSS step=<s> loss=<f> generation=<g> world=<n>   every step
  RDZV_RESUMED step=<s> path=<checkpoint> generation=<g>  after loading one
  RDZV_DONE steps=<n> final_loss=<f> generation=<g>       at the end
"""

from __future__ import annotations

import math
import os
import random
import sys
from typing import List, Tuple

import torch
import torch.nn as nn
from torch.nn import functional as F

# A small vocabulary and a corpus with structure to learn: sentences made of
# a few words, so that the loss falls well below log(vocab) in a few dozen
# steps.
_WORDS = ("the quick brown fox jumps over lazy dog and cat sat on mat while "
          "bird sings in tree near river bank under blue sky").split()
VOCAB = sorted(set(" .abcdefghijklmnopqrstuvwxyz"))
STOI = {c: i for i, c in enumerate(VOCAB)}


def corpus(chars: int = 20000, seed: int = 1234) -> torch.Tensor:
    """The training text as token ids, made from a fixed seed."""
    rng = random.Random(seed)
    out: List[str] = []
    n = 0
    while n < chars:
        sentence = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(4, 9))) + ". "
        out.append(sentence)
        n += len(sentence)
    text = "".join(out)[:chars]
    return torch.tensor([STOI[c] for c in text], dtype=torch.long)


def global_batch(data: torch.Tensor, step: int, batch: int, block: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The whole world's batch of step: inputs and next-character targets."""
    g = torch.Generator().manual_seed(step)
    starts = torch.randint(0, len(data) - block - 1, (batch,), generator=g)
    x = torch.stack([data[s:s + block] for s in starts])
    y = torch.stack([data[s + 1:s + block + 1] for s in starts])
    return x, y


def shard(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    """This rank's rows of a global batch, like DistributedSampler's."""
    return t[rank::world]


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = nn.MultiheadAttention(n_embd, n_head, batch_first=True)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))
        self.register_buffer("mask", torch.triu(torch.ones(block, block, dtype=torch.bool), diagonal=1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.size(1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=self.mask[:t, :t], need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class MiniGPT(nn.Module):
    """minGPT's shape (token and position embeddings, pre-norm causal
    blocks, a language-model head), small enough for a CPU; no dropout, so
    that a step's loss depends on the weights and the batch alone."""

    def __init__(self, vocab: int = len(VOCAB), block: int = 32, n_layer: int = 2, n_head: int = 2, n_embd: int = 48):
        super().__init__()
        self.block = block
        self.tok = nn.Embedding(vocab, n_embd)
        self.pos = nn.Embedding(block, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, block) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for b in self.blocks:
            x = b(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def world_mean(loss: torch.Tensor, rows: int) -> float:
    """The loss over the whole global batch: each rank's mean weighted by
    its rows, summed over the world."""
    import torch.distributed as dist

    t = torch.tensor([loss.detach().float().item() * rows, float(rows)])
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return (t[0] / t[1]).item()


def log(tag: str, **fields: object) -> None:
    # One write per line: ranks share stdout.
    parts = [tag] + ["%s=%s" % (k, ("%.6f" % v) if isinstance(v, float) else v) for k, v in fields.items()]
    sys.stdout.write(" ".join(parts) + "\n")
    sys.stdout.flush()


def generation() -> str:
    return os.environ.get("RDZV_GENERATION", "0")


def finite(x: float) -> float:
    if not math.isfinite(x):
        raise SystemExit("loss is %r: training diverged" % x)
    return x
