"""A small training loop with two common bugs, to see what `opscope trace` finds:

  opscope trace -- python examples/slow_train.py
  opscope trace -- python examples/fast_train.py
  opscope trace diff trace-A trace-B            # the two runs' names, as printed

1. The targets are built one element at a time through Python floats (`.item()` per row): one
   device→host read per element, then a host→device upload (on a CPU, a storm of host value reads).
2. `optimizer.zero_grad()` sits between `backward()` and `step()`: every step finds no gradient,
   so the model never changes and the loss stays where it started.

examples/fast_train.py is the same loop with both fixed. Plain PyTorch: it runs alone too.
"""

import argparse

import opscope
import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, d_in: int = 32, d_hidden: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())
        self.head = nn.Linear(d_hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))  # [B, 1]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = TinyNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    w = torch.randn(32, device=device) / 32**0.5
    data = torch.randn(args.batch, 32, device=device)  # one fixed batch: small and deterministic
    for step in range(args.steps):
        with opscope.region("data"):
            x = data  # [B, D]
            y = torch.tensor([[(row @ w).item()] for row in x], device=device)  # BUG: one .item() per row
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.zero_grad()  # BUG: clears the gradients before step() can use them
        optimizer.step()
        opscope.step()
        if step % 10 == 0 or step == args.steps - 1:
            print(f"step {step:3d}  loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
