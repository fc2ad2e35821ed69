// TorchScript model vs built-in model: training steps per second of the same CNN architecture on the same data
// in the same run (docs/performance.md, "TorchScript models").
//
//   BM_BuiltinCnnTrain/32  fl-client's built-in "cnn" (TorchTrainer, C++ torch::nn module)
//   BM_ScriptCnnTrain/32   examples/bring-your-own-model's PlainCnn exported with torch.jit.script (ScriptTrainer)
//
// Both train on the same Fashion-MNIST shard (client 0 of 4, 15,000 images), batch 32, SGD with momentum, one
// intra-op thread, the same seeded batch order (train_loop.h). One iteration = one Train call of 20 steps; the
// items/s counter is steps per second and the table after the run gives the TorchScript model's ratio to the
// built-in one (goal >= 0.9x).
//
// The .pt is exported by Debian's python3-torch when the benchmark starts (FL_BENCH_SCRIPT_CNN=path skips that).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "fl/training/script_trainer.h"
#include "fl/training/torch_trainer.h"
#include "fl/training/data/fashion_mnist.h"
#include "ratio_reporter.h"

namespace {

constexpr uint32_t kStepsPerIteration = 20;

std::string ScriptCnnPath() {
  if (const char* env = std::getenv("FL_BENCH_SCRIPT_CNN"); env != nullptr && *env != '\0') return env;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "fl_script_model_bench";
  std::filesystem::create_directories(dir);
  const std::string command = "/usr/bin/python3 " FL_SOURCE_DIR
                              "/examples/bring-your-own-model/export_models.py --out " +
                              dir.string() + " > " + (dir / "export.log").string() + " 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::cerr << "script_model_bench: exporting the TorchScript CNN failed (" << command
              << "); python3-torch is installed by deploy/install-deps.sh\n";
    std::exit(2);
  }
  return (dir / "plain_cnn.pt").string();
}

fl::training::TrainOptions Options() {
  fl::training::TrainOptions t;
  t.local_steps = kStepsPerIteration;
  t.batch_size = 32;
  t.learning_rate = 0.02;
  t.momentum = 0.9;
  t.seed = 1;
  return t;
}

void RunTraining(benchmark::State& state, fl::training::Trainer& trainer) {
  std::vector<float> params(trainer.spec().num_elements());
  if (!trainer.GetParameters(params).ok()) state.SkipWithError("GetParameters failed");
  fl::training::TrainOptions options = Options();
  for (auto _ : state) {
    auto result = trainer.Train(params, options);
    if (!result.ok()) {
      state.SkipWithError(std::string(result.status().message()).c_str());
      break;
    }
    ++options.seed;
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * kStepsPerIteration);
}

void BM_BuiltinCnnTrain(benchmark::State& state) {
  fl::training::TorchTrainerOptions o;
  o.model = "cnn";
  o.num_clients = 4;
  o.device = "cpu";
  o.num_threads = 1;
  auto trainer = fl::training::TorchTrainer::Create(o);
  if (!trainer.ok()) {
    state.SkipWithError(std::string(trainer.status().message()).c_str());
    return;
  }
  RunTraining(state, **trainer);
}

void BM_ScriptCnnTrain(benchmark::State& state) {
  static const std::string path = ScriptCnnPath();
  fl::training::ScriptTrainerOptions o;
  o.model_path = path;
  o.data.path = std::string(fl::training::data::kDefaultFashionMnistDir);
  o.data.num_clients = 4;
  o.device = "cpu";
  o.num_threads = 1;
  auto trainer = fl::training::ScriptTrainer::Create(o);
  if (!trainer.ok()) {
    state.SkipWithError(std::string(trainer.status().message()).c_str());
    return;
  }
  RunTraining(state, **trainer);
}

// Interleaved by repetition (--benchmark_repetitions, --benchmark_enable_random_interleaving) so that both see
// the same machine load; the argument is the batch size, which the ratio table matches on.
BENCHMARK(BM_BuiltinCnnTrain)->Arg(32)->Unit(benchmark::kMillisecond)->MinTime(3.0);
BENCHMARK(BM_ScriptCnnTrain)->Arg(32)->Unit(benchmark::kMillisecond)->MinTime(3.0);

}  // namespace

int main(int argc, char** argv) {
  return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_BuiltinCnnTrain", "items_per_second");
}
