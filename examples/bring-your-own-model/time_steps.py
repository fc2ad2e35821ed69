#!/usr/bin/python3
"""Training steps per second of exported TorchScript classifiers in PyTorch, one thread, batch 32, SGD.

    /usr/bin/python3 examples/bring-your-own-model/time_steps.py out/byom cnn_bn plain_cnn

For docs/performance.md: how much what a model is written with (nn.Linear on the reference BLAS vs convolutions
in oneDNN) costs on this machine. 10 warm-up steps, then 50 timed.
"""
import sys
import time

import torch


def main() -> None:
    torch.set_num_threads(1)
    folder, names = sys.argv[1], sys.argv[2:]
    for name in names:
        model = torch.jit.load(f"{folder}/{name}.pt")
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        x = torch.rand(32, 1, 28, 28)
        y = torch.randint(0, 10, (32,))
        start = 0.0
        for step in range(60):
            if step == 10:
                start = time.perf_counter()
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        print(f"{name}: {50 / (time.perf_counter() - start):.1f} steps/s")


if __name__ == "__main__":
    main()
