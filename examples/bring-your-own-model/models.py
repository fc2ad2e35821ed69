"""Models a researcher brings to fl-client, written as ordinary PyTorch modules.

fl-client trains a TorchScript file (export_models.py writes them). What it expects of a model's forward:

  classification  float32 [B, *x_shape] -> logits [B, C]       (uint8 data arrives divided by 255)
  regression      float32 [B, *x_shape] -> predictions [B] or [B, *y_shape]
  next-token      int64 token ids [B, T] -> logits [B, T, V]

The flat update fl-client sends holds every tensor of state_dict() (parameters and buffers) in
state_dict() order, so the order in which a module assigns its submodules is the order on the wire.

  CnnBn      Fashion-MNIST classifier with BatchNorm and Dropout (the "my own model" example).
  TinyLm     byte-level GRU language model (vocabulary 256), next-token on a text corpus.
  Regressor  small CNN for regression.npz (top half of an image -> mean brightness of its bottom half).
  PlainCnn   the built-in "cnn" of fl-client, same tensors, same function: the TorchScript-vs-built-in
             speed benchmark (docs/performance.md).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

# Fashion-MNIST's pixel mean and standard deviation on [0, 1]: fl-client's built-in CNN normalises its
# input with these (training/data/include/fl/training/data/fashion_mnist.h); PlainCnn does the same in its forward.
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530


class CnnBn(nn.Module):
    """[B, 1, 28, 28] float in [0, 1] -> [B, 10] logits.

    conv(1->32, 3x3, pad 1)-BN-ReLU-maxpool 2, conv(32->64, 3x3, pad 1)-BN-ReLU-maxpool 2 (28 -> 14 -> 7),
    fc(64*7*7 -> 128)-ReLU-dropout-fc(128 -> 10). The convolutions have no bias: BatchNorm's shift replaces
    it. BatchNorm's running_mean / running_var / num_batches_tracked are buffers: with `buffers: average`
    fl-client averages the float ones (FedAvg), with `buffers: local` each client keeps its own (FedBN).
    """

    def __init__(self, num_classes: int = 10, dropout: float = 0.25):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.dropout = nn.Dropout(dropout)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)  # [B, 32, 14, 14]
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # [B, 64, 7, 7]
        x = self.dropout(F.relu(self.fc1(torch.flatten(x, 1))))
        return self.fc2(x)


class TinyLm(nn.Module):
    """int64 byte ids [B, T] -> [B, T, 256] next-byte logits.

    Embedding(256, 64) -> GRU(64 -> 128, 1 layer) -> Linear(128 -> 256). Every sequence starts from a zero
    hidden state, so one batch of windows needs nothing from the previous batch. No dropout: the model is
    exported with torch.jit.trace, which would freeze the train/eval switch of a dropout (see README).
    """

    def __init__(self, vocab: int = 256, embed: int = 64, hidden: int = 128):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.gru = nn.GRU(embed, hidden, num_layers=1, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h, _ = self.gru(self.embed(tokens))  # [B, T, hidden]
        return self.head(h)


class Regressor(nn.Module):
    """[B, 1, 14, 28] float in [0, 1] (the top half of an image) -> [B] (its bottom half's mean brightness).

    conv(1->16, 3x3, pad 1)-ReLU-maxpool 2 (14x28 -> 7x14), conv(16->32, 3x3, pad 1)-ReLU-maxpool 2
    (-> 3x7), fc(32*3*7 -> 64)-ReLU-fc(64 -> 1), squeezed to [B] to match the [N] float32 targets.
    """

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 3 * 7, 64)
        self.fc2 = nn.Linear(64, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x).squeeze(1)


class PlainCnn(nn.Module):
    """fl-client's built-in "cnn" (training/src/models.cc, FashionCnn) as a TorchScript model.

    Same tensors, names, shapes and order as the built-in: conv1.weight [32,1,3,3], conv1.bias [32],
    conv2.weight [64,32,3,3], conv2.bias [64], fc1.weight [128,1600], fc1.bias [128], fc2.weight [10,128],
    fc2.bias [10]: 225,034 parameters. fc1 is a Linear, as in the built-in (which stores it as a Linear too
    and only *computes* it as a convolution).

    Same function as the built-in: conv1-ReLU-maxpool 2, conv2-ReLU-maxpool 2, fc1-ReLU-fc2, on images
    normalised with Fashion-MNIST's mean and standard deviation (the built-in normalises while loading the
    data; a TorchScript model gets x / 255, so it normalises here). The forward uses the built-in's two exact
    rewrites so that the benchmark measures TorchScript, not a different computation:
      - ReLU after the max-pool (ReLU is monotone, so relu(pool(x)) == pool(relu(x))): ReLU on 4x less data;
      - fc1 computed as a 5x5 convolution over the [B, 64, 5, 5] map with fc1.weight viewed as
        [128, 64, 5, 5] (flatten is channel-major, the same order). Debian's LibTorch multiplies matrices
        with the reference BLAS unless OpenBLAS is installed; its convolutions run in oneDNN, several
        times faster for this layer.
    The built-in also has a faster 2x2 max-pool kernel than LibTorch 1.13's, which TorchScript cannot use.
    """

    # Plain floats, compiled into the TorchScript code as constants (not tensors: not in the update).
    __constants__ = ["mean", "std"]

    def __init__(self):
        super().__init__()
        self.mean = FASHION_MNIST_MEAN
        self.std = FASHION_MNIST_STD
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * 5 * 5, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = (x - self.mean) / self.std
        x = F.relu(F.max_pool2d(self.conv1(x), 2))  # [B, 32, 13, 13]
        x = F.relu(F.max_pool2d(self.conv2(x), 2))  # [B, 64, 5, 5]
        x = F.conv2d(x, self.fc1.weight.view(128, 64, 5, 5), self.fc1.bias)  # [B, 128, 1, 1]
        return self.fc2(F.relu(torch.flatten(x, 1)))


def plain_cnn_reference_forward(model: PlainCnn, x: torch.Tensor) -> torch.Tensor:
    """PlainCnn's function written the straightforward way (check_examples.py compares the two)."""
    x = (x - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
    x = F.max_pool2d(F.relu(model.conv1(x)), 2)
    x = F.max_pool2d(F.relu(model.conv2(x)), 2)
    x = F.relu(model.fc1(torch.flatten(x, 1)))
    return model.fc2(x)
