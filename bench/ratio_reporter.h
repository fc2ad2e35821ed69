// RatioReporter: Google Benchmark's console output, followed by a markdown table that puts every benchmark's
// throughput next to its ratio to a reference benchmark measured in the same run (by default a memcpy).
//
// Absolute GB/s depend on the machine, its load and its memory; a ratio to memcpy of the same buffer,
// measured minutes apart in the same process, is what can be compared across machines and stated as a
// target ("encode at >= 0.5x memcpy"). Matching is by the benchmark name's trailing numeric argument, so
// "BM_Encode/int8/1048576" is compared with "BM_Memcpy/1048576": any benchmark family works as long as its
// last numeric argument is the size that the reference family is also run at.
//
// Use it through RunBenchmarksWithRatios in place of BENCHMARK_MAIN():
//   int main(int argc, char** argv) { return fl::bench::RunBenchmarksWithRatios(argc, argv, "BM_Memcpy"); }
// Throughput is the "bytes_per_second" counter (state.SetBytesProcessed); with --benchmark_repetitions the
// table uses the median of the repetitions.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace fl::bench {

// The usual reference benchmark's body: copies `in` into a buffer of its size (touched first, so that page faults
// are not measured) once per iteration, counting its bytes.
inline void MemcpyReference(benchmark::State& state, const std::vector<float>& in) {
  std::vector<float> out(in.size(), 1.0f);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), in.size() * sizeof(float));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(in.size() * sizeof(float)));
}

class RatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit RatioReporter(std::string reference = "BM_Memcpy", std::string counter = "bytes_per_second")
      : reference_(std::move(reference)), counter_(std::move(counter)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    benchmark::ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      // Aggregates (mean/median/stddev) are recomputed from the repetitions below; errors have no rate.
      if (run.error_occurred || run.run_type != Run::RT_Iteration) continue;
      const auto it = run.counters.find(counter_);
      if (it == run.counters.end()) continue;
      const std::string name = run.run_name.str();
      if (!samples_.count(name)) order_.push_back({{run.family_index, run.per_family_instance_index}, name});
      samples_[name].push_back(it->second.value);
    }
  }

  void Finalize() override {
    benchmark::ConsoleReporter::Finalize();
    GetOutputStream() << "\n" << MarkdownTable() << std::flush;
  }

  // The trailing numeric segment of a benchmark name ("BM_Encode/int8/1048576" -> "1048576"); empty if none.
  static std::string SizeKey(const std::string& name) {
    size_t end = name.size();
    while (end > 0) {
      const size_t slash = name.rfind('/', end - 1);
      const size_t begin = slash == std::string::npos ? 0 : slash + 1;
      const std::string segment = name.substr(begin, end - begin);
      if (!segment.empty() &&
          std::all_of(segment.begin(), segment.end(), [](unsigned char c) { return std::isdigit(c) != 0; })) {
        return segment;
      }
      if (slash == std::string::npos) break;
      end = slash;
    }
    return "";
  }

  std::string MarkdownTable() const {
    // Registration order (family, then instance), whatever order the runs came in
    // (--benchmark_enable_random_interleaving shuffles them).
    std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> sorted = order_;
    std::stable_sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::map<std::string, double> reference_rate;  // size key -> median rate of the reference
    for (const auto& [index, name] : sorted) {
      if (name.rfind(reference_ + "/", 0) == 0) reference_rate[SizeKey(name)] = Median(samples_.at(name));
    }
    // Bytes per second read as GB/s; any other counter (items_per_second: steps/s, ...) as it is.
    const bool bytes = counter_ == "bytes_per_second";
    const double scale = bytes ? 1e-9 : 1.0;
    std::string table = "| benchmark | " + (bytes ? std::string("GB/s") : counter_) + " | x " + reference_ +
                        " (same n, same run) |\n|---|---:|---:|\n";
    for (const auto& [index, name] : sorted) {
      const double rate = Median(samples_.at(name)) * scale;
      const auto ref = reference_rate.find(SizeKey(name));
      char line[512];
      if (ref != reference_rate.end() && ref->second > 0) {
        std::snprintf(line, sizeof(line), "| %s | %.2f | %.2f |\n", name.c_str(), rate, rate / (ref->second * scale));
      } else {
        std::snprintf(line, sizeof(line), "| %s | %.2f | n/a |\n", name.c_str(), rate);
      }
      table += line;
    }
    return table;
  }

 private:
  static double Median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t m = v.size() / 2;
    return v.size() % 2 == 1 ? v[m] : (v[m - 1] + v[m]) / 2;
  }

  std::string reference_;
  std::string counter_;
  // (family index, instance index) and name of every benchmark seen, in first-seen order.
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::string>> order_;
  std::map<std::string, std::vector<double>> samples_;  // name -> rate of each repetition
};

// Parses Google Benchmark's flags, runs the selected benchmarks with a RatioReporter on the console (file
// output via --benchmark_out keeps its own format) and returns a process exit code.
inline int RunBenchmarksWithRatios(int argc, char** argv, const std::string& reference = "BM_Memcpy",
                                   const std::string& counter = "bytes_per_second") {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter(reference, counter);
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace fl::bench
