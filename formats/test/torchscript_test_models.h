// Test support for the TorchScript reader: real models exported by Debian's python3-torch, with Python's own
// view of them (state_dict keys, dtypes, shapes, parameter or buffer, fp32 values) to compare against.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fl/testing/python.h"

namespace fl::formats::testing {

// sys.argv[1]: output folder. For each model NAME it writes NAME.pt, NAME.data.pkl (the archive's data.pkl,
// extracted by zipfile), NAME.keys.txt (one line per state_dict entry: "name dtype d0,d1,... is_parameter",
// "-" for a 0-d shape) and NAME.f32 (the state_dict's values converted to float32, C order, concatenated).
inline constexpr const char* kExportModelsScript = R"PY(
import os, sys, zipfile
import torch, torch.nn as nn

torch.manual_seed(7)
out = sys.argv[1]

class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.25),
                                      nn.MaxPool2d(2))
        self.fc = nn.Linear(4 * 13 * 13, 10)
    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))

class Block(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.lin = nn.Linear(n, n, bias=False)  # a parameter that is None
        self.norm = nn.LayerNorm(n)
    def forward(self, x):
        return self.norm(self.lin(x))

class Nested(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(Block(6), nn.ReLU()), nn.Sequential(Block(6))])
        self.heads = nn.ModuleDict({"b": nn.Linear(6, 2), "a": nn.Linear(6, 3)})
        self.tied = nn.Linear(6, 2)
        self.tied.weight = self.heads["b"].weight  # tied weights: one tensor under two names
        base = torch.randn(40)
        # Parameters registered after the submodules: a view at a storage offset, a transposed (non-contiguous)
        # view of the same storage, a frozen one.
        self.scale = nn.Parameter(base[5:11].view(2, 3))
        self.shift = nn.Parameter(base[20:32].view(3, 4).t())
        self.frozen = nn.Parameter(torch.randn(3), requires_grad=False)
        self.register_buffer("steps", torch.tensor([3, 1, 4], dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([1, 0, 255], dtype=torch.uint8))
        self.register_buffer("counts", torch.tensor([[7, -2]], dtype=torch.int32))
        self.register_buffer("halfbuf", torch.randn(2, 2).half())
        self.register_buffer("bf16buf", torch.randn(3).bfloat16())
        self.register_buffer("precise", torch.randn(2, dtype=torch.float64))
        self.plain = torch.ones(5)  # a tensor attribute that is neither a parameter nor a buffer
    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return (self.heads["a"](x).sum() + self.heads["b"](x).sum() + self.tied(x).sum() + self.scale.sum()
                + self.shift.sum() + self.plain.sum())

class Lm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.enc = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        self.gru = nn.GRU(8, 12, num_layers=2, batch_first=True)
        self.head = nn.Linear(12, 20)
    def forward(self, x):
        o, _ = self.gru(self.enc(self.emb(x)))
        return self.head(o)

def export(name, module, scripted):
    path = os.path.join(out, name + ".pt")
    scripted.save(path)
    sd = module.state_dict()
    params = set((prefix + "." if prefix else "") + n for prefix, m in module.named_modules(remove_duplicate=False)
                 for n, p in m._parameters.items() if p is not None)
    assert list(torch.jit.load(path).state_dict().keys()) == list(sd.keys())
    with open(os.path.join(out, name + ".keys.txt"), "w") as f:
        for k, v in sd.items():
            shape = ",".join(str(d) for d in v.shape) or "-"
            f.write("%s %s %s %d\n" % (k, str(v.dtype).replace("torch.", ""), shape, 1 if k in params else 0))
    with open(os.path.join(out, name + ".f32"), "wb") as f:
        for v in sd.values():
            f.write(v.detach().to(torch.float32).contiguous().numpy().tobytes())
    with zipfile.ZipFile(path) as z:
        pkl = [n for n in z.namelist() if n.endswith("/data.pkl")][0]
        with open(os.path.join(out, name + ".data.pkl"), "wb") as f:
            f.write(z.read(pkl))

cnn = Cnn()
cnn.train()
for _ in range(3):
    cnn(torch.randn(8, 1, 28, 28))  # running statistics and num_batches_tracked away from their defaults
export("cnn_scripted", cnn, torch.jit.script(cnn))
cnn.eval()
export("cnn_traced", cnn, torch.jit.trace(cnn, torch.randn(2, 1, 28, 28)))
nested = Nested()
export("nested", nested, torch.jit.script(nested))
lm = Lm()
export("lm", lm, torch.jit.script(lm))
print("exported")
)PY";

inline constexpr const char* kModelNames[] = {"cnn_scripted", "cnn_traced", "nested", "lm"};

// Writes `script` into `dir`/`name` (TorchScript needs the classes' source in a file) and runs it with `dir` as
// its argument. When it fails because torch is missing, the failure says how to install it.
inline ::testing::AssertionResult RunTorchScript(const std::string& dir, const std::string& name,
                                                 const std::string& script) {
  const std::string script_path = dir + "/" + name;
  std::ofstream(script_path) << script;
  auto run = fl::testing::RunPythonFile(script_path, {dir}, script_path + ".log");
  if (run.ok()) return ::testing::AssertionSuccess();
  if (absl::Status s = fl::testing::RequirePythonModule("torch", dir + "/require_torch.log"); !s.ok()) {
    return ::testing::AssertionFailure() << s.message();
  }
  return ::testing::AssertionFailure() << run.status().message();
}

inline ::testing::AssertionResult ExportTestModels(const std::string& dir) {
  return RunTorchScript(dir, "export_models.py", kExportModelsScript);
}

struct ExpectedTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  bool is_parameter = false;
};

inline std::vector<ExpectedTensor> ReadExpectedKeys(const std::string& path) {
  std::vector<ExpectedTensor> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    ExpectedTensor t;
    std::string shape;
    int is_parameter = 0;
    fields >> t.name >> t.dtype >> shape >> is_parameter;
    t.is_parameter = is_parameter != 0;
    if (shape != "-") {
      std::istringstream dims(shape);
      std::string dim;
      while (std::getline(dims, dim, ',')) t.shape.push_back(std::stoll(dim));
    }
    out.push_back(std::move(t));
  }
  return out;
}

inline std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

inline std::vector<float> ReadFloats(const std::string& path) {
  const std::string bytes = ReadFileBytes(path);
  std::vector<float> values(bytes.size() / sizeof(float));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
  return values;
}

}  // namespace fl::formats::testing
