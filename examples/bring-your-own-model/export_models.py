#!/usr/bin/python3
"""Exports the example models (models.py) as TorchScript files for fl-client.

    /usr/bin/python3 examples/bring-your-own-model/export_models.py --out out/byom [--seed 1]

writes cnn_bn.pt, tiny_lm.pt, regressor.pt and plain_cnn.pt and prints, for each, its parameter count and
its state_dict() keys in order: the order of the tensors in fl-client's flat update (parameters and
buffers interleaved, module by module).

Two ways to export, both shown here:
  - torch.jit.script(model) compiles the Python source of forward. It keeps control flow and the
    train()/eval() switch, so it is the way for models with Dropout or BatchNorm (CnnBn).
  - torch.jit.trace(model, example) runs forward once on an example input and records the operations.
    Data-dependent branches are frozen to the path the example took, and so is the training flag of
    functional dropout / batch norm: trace only models whose forward does not branch on data or on
    self.training (TinyLm: embedding, GRU, linear). The example's batch size and length are not frozen;
    the check below runs the traced model on another shape.
"""

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402  (the folder of this script, so that it runs from anywhere)


def describe(name: str, module: torch.nn.Module) -> None:
    """Prints the parameter count and the state_dict order: what fl-client's flat update holds."""
    trainable = sum(p.numel() for p in module.parameters() if p.requires_grad)
    param_names = {n for n, _ in module.named_parameters()}
    state = module.state_dict()
    total = sum(t.numel() for t in state.values())
    print(f"{name}: {trainable:,} trainable parameters; {len(state)} tensors, {total:,} values in the flat update")
    for key, tensor in state.items():
        kind = "parameter" if key in param_names else "buffer"
        print(f"    {key:32s} {str(list(tensor.shape)):18s} {str(tensor.dtype):14s} {kind}")


def export_scripted(model: torch.nn.Module, path: str) -> torch.jit.ScriptModule:
    scripted = torch.jit.script(model)
    scripted.save(path)
    return scripted


def export_traced(model: torch.nn.Module, example: torch.Tensor, path: str) -> torch.jit.ScriptModule:
    traced = torch.jit.trace(model, example)
    # A traced model must give the eager model's answer on an input of another shape, or the trace froze
    # something it should not have (a shape, a branch).
    other = torch.randint(0, 256, (example.shape[0] + 3, example.shape[1] * 2), dtype=torch.int64)
    with torch.no_grad():
        if not torch.allclose(traced(other), model(other), atol=1e-5):
            raise SystemExit(f"{path}: the traced model differs from the eager one on shape {list(other.shape)}")
    traced.save(path)
    return traced


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for the .pt files (created if missing)")
    parser.add_argument("--seed", type=int, default=1, help="torch.manual_seed before building each model")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    # Each model is built right after torch.manual_seed(seed): the same seed gives the same initial weights,
    # whichever models are exported. The weights saved in the .pt are the federation's starting point:
    # every client loads the same file, and fl-server asks one client for its model as the initial one.
    torch.manual_seed(args.seed)
    cnn_bn = models.CnnBn()
    export_scripted(cnn_bn, os.path.join(args.out, "cnn_bn.pt"))
    describe("cnn_bn.pt (torch.jit.script)", cnn_bn)

    torch.manual_seed(args.seed)
    tiny_lm = models.TinyLm()
    example = torch.randint(0, 256, (2, 16), dtype=torch.int64)  # [B, T] byte ids, any B and T
    export_traced(tiny_lm, example, os.path.join(args.out, "tiny_lm.pt"))
    describe("tiny_lm.pt (torch.jit.trace)", tiny_lm)

    torch.manual_seed(args.seed)
    regressor = models.Regressor()
    export_scripted(regressor, os.path.join(args.out, "regressor.pt"))
    describe("regressor.pt (torch.jit.script)", regressor)

    torch.manual_seed(args.seed)
    plain_cnn = models.PlainCnn()
    export_scripted(plain_cnn, os.path.join(args.out, "plain_cnn.pt"))
    describe("plain_cnn.pt (torch.jit.script)", plain_cnn)

    print(f"wrote {args.out}/cnn_bn.pt, tiny_lm.pt, regressor.pt, plain_cnn.pt")


if __name__ == "__main__":
    main()
