#!/usr/bin/python3
"""Training steps per second of exported TorchScript models in PyTorch, one thread, SGD.

    /usr/bin/python3 examples/bring-your-own-model/time_steps.py out/byom cnn_bn plain_cnn tiny_lm

For docs/performance.md: how much what a model is written with costs on this machine (nn.Linear and nn.GRU on the
system BLAS — the reference BLAS or OpenBLAS, whichever Debian's alternatives select — against convolutions in
oneDNN). Classifiers get batches of 32 images, tiny_lm 32 sequences of 64 byte tokens (next-token loss).
10 warm-up steps, then 50 timed.
"""
import sys
import time

import torch


def batch(name: str):
    """Inputs and the loss of one step for the model `name` (export_models.py's names)."""
    if name == "tiny_lm":
        tokens = torch.randint(0, 256, (32, 64))

        def loss(model):
            logits = model(tokens)
            return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                     tokens[:, 1:].reshape(-1))
        return loss
    x = torch.rand(32, 1, 28, 28)
    y = torch.randint(0, 10, (32,))
    return lambda model: torch.nn.functional.cross_entropy(model(x), y)


def main() -> None:
    torch.set_num_threads(1)
    folder, names = sys.argv[1], sys.argv[2:]
    for name in names:
        model = torch.jit.load(f"{folder}/{name}.pt")
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
        loss = batch(name)
        start = 0.0
        for step in range(60):
            if step == 10:
                start = time.perf_counter()
            optimizer.zero_grad()
            loss(model).backward()
            optimizer.step()
        print(f"{name}: {50 / (time.perf_counter() - start):.1f} steps/s")


if __name__ == "__main__":
    main()
