#!/usr/bin/python3
"""Checks the examples end to end in PyTorch, before fl-client sees them.

    /usr/bin/python3 examples/bring-your-own-model/check_examples.py [--dir DIR] [--steps 50]

DIR (default: a new temporary folder) is where export_models.py and make_data.py write; the scripts are
run (as a user runs them) when a file is missing there. Then, for every model:
  - the .pt reloads with torch.jit.load and keeps the eager model's state_dict order;
  - its forward takes a batch of the written data, prepared as fl-client prepares it (uint8 / 255 as
    float32; int64 token ids for next-token), and its output has the task's shape;
  - forward + backward work, and `steps` SGD steps (momentum 0.9, batch 32) lower the loss on a fixed
    held-out batch (evaluated in eval() mode, as fl-client evaluates).
And: the datasets follow the .npz contract (arrays, dtypes, lengths, label range, finite values), the
scripted CnnBn switches dropout and BatchNorm with train()/eval(), and PlainCnn computes what the
straightforward conv-ReLU-pool-linear network computes.

Exit status 0 when every check passed, 1 otherwise; the last line is "N passed, M failed".
"""

import argparse
import os
import subprocess
import sys
import tempfile
import traceback

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models  # noqa: E402

TEXT_DIR = "/usr/share/games/fortunes"
SEQ_LEN = 64
BATCH = 32
EVAL_BATCH = 256


def ensure_files(folder: str, seed: int) -> None:
    """Runs the two scripts as a user would, if their outputs are not in `folder` yet."""
    py = sys.executable
    if not all(os.path.exists(os.path.join(folder, f))
               for f in ("cnn_bn.pt", "tiny_lm.pt", "regressor.pt", "plain_cnn.pt")):
        subprocess.run([py, os.path.join(HERE, "export_models.py"), "--out", folder, "--seed", str(seed)],
                       check=True, stdout=subprocess.DEVNULL)
    if not all(os.path.exists(os.path.join(folder, f))
               for f in ("fashion_mnist.npz", "fashion_mnist_natural.npz", "regression.npz")):
        subprocess.run([py, os.path.join(HERE, "make_data.py"), "--out", folder], check=True,
                       stdout=subprocess.DEVNULL)


def load_npz(path: str, task: str) -> dict:
    """The arrays of `path`, checked against the contract fl-client enforces."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    for key in ("x_train", "y_train", "x_test", "y_test"):
        assert key in arrays, f"{path}: no array {key}"
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        assert x.dtype in (np.uint8, np.float32), f"{path}: x_{split} is {x.dtype}"
        assert len(x) == len(y), f"{path}: x_{split} has {len(x)} rows, y_{split} {len(y)}"
        if task == "classification":
            assert y.dtype == np.int64, f"{path}: y_{split} is {y.dtype}, expected int64"
            assert y.min() >= 0 and y.max() < 10, f"{path}: y_{split} outside [0, 10)"
        else:
            assert y.dtype == np.float32, f"{path}: y_{split} is {y.dtype}, expected float32"
            assert np.isfinite(y).all(), f"{path}: y_{split} has NaN/Inf"
    if "client_id" in arrays:
        cid = arrays["client_id"]
        assert cid.dtype == np.int64 and len(cid) == len(arrays["x_train"]), f"{path}: bad client_id"
    return arrays


def to_input(x: np.ndarray) -> torch.Tensor:
    """What fl-client hands the model: uint8 divided by 255 as float32, float32 as is."""
    t = torch.from_numpy(np.ascontiguousarray(x))
    return t.float().div_(255.0) if t.dtype == torch.uint8 else t


def text_tokens() -> np.ndarray:
    """The bytes of every fortune file (no extension: not the .dat indices, not the .u8 links)."""
    names = sorted(n for n in os.listdir(TEXT_DIR)
                   if "." not in n and os.path.isfile(os.path.join(TEXT_DIR, n)))
    assert names, f"no text files in {TEXT_DIR}: apt-get install fortunes-min"
    data = b"".join(open(os.path.join(TEXT_DIR, n), "rb").read() for n in names)
    return np.frombuffer(data, dtype=np.uint8).astype(np.int64)


class Task:
    """A model file, its data and its loss: batches drawn with a seeded generator."""

    def __init__(self, name, model_file, kind, lr, sample):
        self.name, self.model_file, self.kind, self.lr, self.sample = name, model_file, kind, lr, sample

    def loss(self, out, y):
        if self.kind == "classification":
            assert out.dim() == 2 and out.shape[0] == y.shape[0], f"{self.name}: logits {list(out.shape)}"
            return F.cross_entropy(out, y)
        if self.kind == "regression":
            assert out.shape == y.shape, f"{self.name}: predictions {list(out.shape)}, targets {list(y.shape)}"
            return F.mse_loss(out, y)
        assert out.dim() == 3 and out.shape[:2] == y.shape, f"{self.name}: logits {list(out.shape)}"
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def npz_sampler(arrays):
    def sample(gen, n, split):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        idx = torch.randint(0, len(x), (n,), generator=gen).numpy()
        return to_input(x[idx]), torch.from_numpy(y[idx])
    return sample


def text_sampler(tokens):
    held_out = len(tokens) * 9 // 10  # the last 10% is the evaluation text

    def sample(gen, n, split):
        lo, hi = (0, held_out) if split == "train" else (held_out, len(tokens))
        starts = torch.randint(lo, hi - SEQ_LEN - 1, (n,), generator=gen).numpy()
        windows = np.stack([tokens[s:s + SEQ_LEN + 1] for s in starts])
        w = torch.from_numpy(windows)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()
    return sample


def check_training(task: Task, folder: str, steps: int) -> str:
    eager_order = {
        "cnn_bn.pt": models.CnnBn, "tiny_lm.pt": models.TinyLm,
        "regressor.pt": models.Regressor, "plain_cnn.pt": models.PlainCnn,
    }[task.model_file]().state_dict().keys()
    model = torch.jit.load(os.path.join(folder, task.model_file))
    assert list(model.state_dict().keys()) == list(eager_order), f"{task.model_file}: state_dict order changed"
    gen = torch.Generator().manual_seed(7)
    x_eval, y_eval = task.sample(gen, EVAL_BATCH, "test")

    def eval_loss():
        model.eval()
        with torch.no_grad():
            return float(task.loss(model(x_eval), y_eval))

    before = eval_loss()
    opt = torch.optim.SGD(model.parameters(), lr=task.lr, momentum=0.9)
    model.train()
    for _ in range(steps):
        x, y = task.sample(gen, BATCH, "train")
        loss = task.loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss), f"{task.name}: loss {float(loss)}"
    after = eval_loss()
    assert after < 0.9 * before, f"{task.name}: held-out loss {before:.4f} -> {after:.4f} after {steps} steps"
    return f"held-out loss {before:.4f} -> {after:.4f} after {steps} SGD steps"


def check_train_eval_switch(folder: str) -> str:
    model = torch.jit.load(os.path.join(folder, "cnn_bn.pt"))
    x = torch.rand(8, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    model.eval()
    with torch.no_grad():
        a, b = model(x), model(x)
        assert torch.equal(a, b), "cnn_bn.pt: eval() forward is not deterministic"
        tracked = int(model.bn1.num_batches_tracked)
        model.train()
        c, d = model(x), model(x)
    assert not torch.equal(c, d), "cnn_bn.pt: train() forward does not apply dropout"
    assert int(model.bn1.num_batches_tracked) == tracked + 2, "cnn_bn.pt: train() does not update BatchNorm"
    return "eval(): deterministic, running stats fixed; train(): dropout on, BatchNorm statistics updated"


def check_plain_cnn(folder: str) -> str:
    scripted = torch.jit.load(os.path.join(folder, "plain_cnn.pt"))
    eager = models.PlainCnn()
    eager.load_state_dict(scripted.state_dict())
    x = torch.rand(16, 1, 28, 28, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        fast, plain = scripted(x), models.plain_cnn_reference_forward(eager, x)
    diff = float((fast - plain).abs().max())
    assert diff < 1e-4, f"plain_cnn.pt differs from the straightforward forward by {diff}"
    n = sum(p.numel() for p in scripted.parameters())
    assert n == 225_034, f"plain_cnn.pt has {n} parameters, the built-in cnn 225,034"
    return f"same function as conv-ReLU-pool x2, fc1-ReLU-fc2 (max |diff| {diff:.1e}), 225,034 parameters"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", help="where the .pt and .npz files are (or are written); default: a temp folder")
    parser.add_argument("--steps", type=int, default=50, help="SGD steps per model")
    parser.add_argument("--seed", type=int, default=1, help="export_models.py --seed")
    args = parser.parse_args()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    torch.manual_seed(0)
    tmp = None
    folder = args.dir
    if folder is None:
        tmp = tempfile.TemporaryDirectory(prefix="byom-check-")
        folder = tmp.name
    os.makedirs(folder, exist_ok=True)
    ensure_files(folder, args.seed)

    checks = []
    fmnist = load_npz(os.path.join(folder, "fashion_mnist.npz"), "classification")
    checks.append(("fashion_mnist.npz contract", lambda: f"{len(fmnist['x_train'])} + {len(fmnist['x_test'])} rows"))
    natural = load_npz(os.path.join(folder, "fashion_mnist_natural.npz"), "classification")
    checks.append(("fashion_mnist_natural.npz contract",
                   lambda: f"{len(np.unique(natural['client_id']))} distinct client_id values"))
    regression = load_npz(os.path.join(folder, "regression.npz"), "regression")
    checks.append(("regression.npz contract", lambda: f"x {list(regression['x_train'].shape[1:])}, y float32"))
    tasks = [
        Task("cnn_bn classification", "cnn_bn.pt", "classification", 0.02, npz_sampler(fmnist)),
        Task("plain_cnn classification", "plain_cnn.pt", "classification", 0.02, npz_sampler(fmnist)),
        Task("regressor regression", "regressor.pt", "regression", 0.02, npz_sampler(regression)),
        Task("tiny_lm next-token", "tiny_lm.pt", "next-token", 0.5, text_sampler(text_tokens())),
    ]
    for task in tasks:
        checks.append((task.name, lambda task=task: check_training(task, folder, args.steps)))
    checks.append(("cnn_bn train()/eval()", lambda: check_train_eval_switch(folder)))
    checks.append(("plain_cnn matches the built-in cnn", lambda: check_plain_cnn(folder)))

    passed = failed = 0
    for name, check in checks:
        try:
            print(f"PASS {name}: {check()}", flush=True)
            passed += 1
        except Exception:  # every failure is reported, then counted
            print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
