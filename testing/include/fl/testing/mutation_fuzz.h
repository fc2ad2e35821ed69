// Test support: mutation fuzzing of a reader of users' files, from a seed corpus kept in the repository.
//
// The suite runs each target for a fixed number of inputs (deterministic: the same seed gives the same inputs
// on every machine, so a failure reproduces); by hand, FL_FUZZ_SECONDS=N runs it for N seconds and FL_FUZZ_SEED
// picks other inputs:
//
//   FL_FUZZ_SECONDS=600 FL_FUZZ_SEED=7 build/release/formats/formats_fuzz_test
//
// A target must return normally for every input (any Status is fine). A crash or an abort writes the input to
// $TMPDIR/fl_fuzz_<name>.crash (async-signal-safe, from the signal handler) and re-raises, so the test dies
// with the signal; an exception escaping the target fails the test and saves the input the same way. With
// memory_limit_bytes the run holds RLIMIT_AS, so an input that makes the reader allocate without bound fails
// as std::bad_alloc (an escaping exception) instead of slowly taking the machine.
//
// Mutations are the usual ones of coverage-free fuzzers (AFL's havoc stage, libFuzzer's mutators): bit flips,
// random bytes, "interesting" 8/16/32/64-bit values (0, -1, 2^k, 2^k - 1, INT_MIN/MAX) in both byte orders,
// inserted, deleted and duplicated ranges, splices with another corpus file, truncation. Several are stacked
// per input.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

namespace fl::testing {

struct FuzzOptions {
  uint64_t seed = 1;
  size_t iterations = 2000;         // what the suite runs: a fixed count, never a time
  size_t max_input_size = 1 << 20;  // mutated inputs are cut to this
  size_t memory_limit_bytes = 0;    // > 0: RLIMIT_AS (address space) while the target runs
};

// Every regular file of `dir`, sorted by name.
inline std::vector<std::vector<uint8_t>> ReadCorpus(const std::string& dir) {
  std::vector<std::filesystem::path> paths;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file()) paths.push_back(entry.path());
  }
  std::sort(paths.begin(), paths.end());
  std::vector<std::vector<uint8_t>> out;
  for (const auto& p : paths) {
    std::ifstream in(p, std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  return out;
}

namespace fuzz_internal {

// The input being run, for the crash handler (which may only use async-signal-safe calls).
inline const uint8_t* g_current = nullptr;
inline size_t g_current_size = 0;
inline char g_crash_path[4096] = {};

inline void OnCrash(int sig) {
  if (g_current != nullptr && g_crash_path[0] != '\0') {
    const int fd = ::open(g_crash_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      size_t done = 0;
      while (done < g_current_size) {
        const ssize_t n = ::write(fd, g_current + done, g_current_size - done);
        if (n <= 0) break;
        done += static_cast<size_t>(n);
      }
      ::close(fd);
    }
    static const char kMsg[] = "fuzz target crashed; input saved to ";
    (void)!::write(2, kMsg, sizeof(kMsg) - 1);
    (void)!::write(2, g_crash_path, std::strlen(g_crash_path));
    (void)!::write(2, "\n", 1);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

inline std::string CrashPath(std::string_view name) {
  const char* tmp = std::getenv("TMPDIR");
  return std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/fl_fuzz_" + std::string(name) + ".crash";
}

class Mutator {
 public:
  Mutator(uint64_t seed, const std::vector<std::vector<uint8_t>>& corpus, size_t max_size)
      : rng_(seed), corpus_(corpus), max_size_(max_size) {}

  std::vector<uint8_t> Next() {
    std::vector<uint8_t> data = corpus_.empty() ? std::vector<uint8_t>{} : corpus_[Below(corpus_.size())];
    const size_t stacked = 1 + Below(8);
    for (size_t i = 0; i < stacked; ++i) MutateOnce(data);
    if (data.size() > max_size_) data.resize(max_size_);
    return data;
  }

 private:
  size_t Below(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }

  uint64_t Interesting() {
    static constexpr uint64_t kValues[] = {0,
                                           1,
                                           0x7f,
                                           0x80,
                                           0xff,
                                           0x7fff,
                                           0x8000,
                                           0xffff,
                                           0x7fffffff,
                                           0x80000000,
                                           0xffffffff,
                                           0x100000000ull,
                                           0x7fffffffffffffffull,
                                           0x8000000000000000ull,
                                           0xffffffffffffffffull,
                                           (1ull << 62) + (1ull << 28),
                                           1ull << 20,
                                           1ull << 24,
                                           1ull << 31};
    return kValues[Below(std::size(kValues))];
  }

  void MutateOnce(std::vector<uint8_t>& d) {
    switch (Below(9)) {
      case 0:  // flip a bit
        if (!d.empty()) d[Below(d.size())] ^= static_cast<uint8_t>(1u << Below(8));
        break;
      case 1:  // a random byte
        if (!d.empty()) d[Below(d.size())] = static_cast<uint8_t>(rng_());
        break;
      case 2: {  // an interesting value of 1, 2, 4 or 8 bytes, little- or big-endian
        const size_t width = size_t{1} << Below(4);
        if (d.size() < width) break;
        const size_t at = Below(d.size() - width + 1);
        const uint64_t v = Interesting();
        const bool big = Below(2) == 1;
        for (size_t i = 0; i < width; ++i) {
          const size_t shift = 8 * (big ? width - 1 - i : i);
          d[at + i] = static_cast<uint8_t>(v >> shift);
        }
        break;
      }
      case 3: {  // insert random bytes
        const size_t n = 1 + Below(16);
        const size_t at = Below(d.size() + 1);
        std::vector<uint8_t> bytes(n);
        for (auto& b : bytes) b = static_cast<uint8_t>(rng_());
        d.insert(d.begin() + static_cast<std::ptrdiff_t>(at), bytes.begin(), bytes.end());
        break;
      }
      case 4: {  // delete a range
        if (d.empty()) break;
        const size_t at = Below(d.size());
        const size_t n = 1 + Below(std::min<size_t>(64, d.size() - at));
        d.erase(d.begin() + static_cast<std::ptrdiff_t>(at), d.begin() + static_cast<std::ptrdiff_t>(at + n));
        break;
      }
      case 5: {  // duplicate a range in place (repeated structures, nesting)
        if (d.empty() || d.size() > max_size_) break;
        const size_t at = Below(d.size());
        const size_t n = 1 + Below(std::min<size_t>(256, d.size() - at));
        const size_t times = 1 + Below(16);
        std::vector<uint8_t> piece(d.begin() + static_cast<std::ptrdiff_t>(at),
                                   d.begin() + static_cast<std::ptrdiff_t>(at + n));
        for (size_t t = 0; t < times; ++t) {
          d.insert(d.begin() + static_cast<std::ptrdiff_t>(at), piece.begin(), piece.end());
        }
        break;
      }
      case 6: {  // splice: the head of this input, the tail of another
        if (corpus_.empty()) break;
        const auto& other = corpus_[Below(corpus_.size())];
        const size_t cut = Below(d.size() + 1);
        const size_t from = Below(other.size() + 1);
        d.resize(cut);
        d.insert(d.end(), other.begin() + static_cast<std::ptrdiff_t>(from), other.end());
        break;
      }
      case 7:  // truncate
        if (!d.empty()) d.resize(Below(d.size()));
        break;
      default: {  // copy a range over another place (moves lengths and offsets around)
        if (d.size() < 2) break;
        const size_t n = 1 + Below(std::min<size_t>(32, d.size() / 2));
        const size_t from = Below(d.size() - n + 1);
        const size_t to = Below(d.size() - n + 1);
        std::memmove(d.data() + to, d.data() + from, n);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
  const std::vector<std::vector<uint8_t>>& corpus_;
  size_t max_size_;
};

}  // namespace fuzz_internal

// Returns the number of inputs run (the corpus itself first, unmutated, then mutations).
inline size_t RunMutationFuzz(std::string_view name, const std::vector<std::vector<uint8_t>>& corpus,
                              const std::function<void(std::span<const uint8_t>)>& target,
                              const FuzzOptions& options = {}) {
  using namespace fuzz_internal;
  uint64_t seed = options.seed;
  if (const char* s = std::getenv("FL_FUZZ_SEED"); s != nullptr && *s != '\0') seed = std::strtoull(s, nullptr, 10);
  double seconds = 0;
  if (const char* s = std::getenv("FL_FUZZ_SECONDS"); s != nullptr && *s != '\0') seconds = std::strtod(s, nullptr);

  const std::string crash_path = CrashPath(name);
  std::snprintf(g_crash_path, sizeof(g_crash_path), "%s", crash_path.c_str());
  struct sigaction action {};
  action.sa_handler = OnCrash;
  sigemptyset(&action.sa_mask);
  struct sigaction old_segv {
  }, old_abrt{}, old_bus{}, old_fpe{}, old_ill{};
  sigaction(SIGSEGV, &action, &old_segv);
  sigaction(SIGABRT, &action, &old_abrt);
  sigaction(SIGBUS, &action, &old_bus);
  sigaction(SIGFPE, &action, &old_fpe);
  sigaction(SIGILL, &action, &old_ill);

  struct rlimit old_limit {};
  const bool limit = options.memory_limit_bytes > 0 && getrlimit(RLIMIT_AS, &old_limit) == 0;
  if (limit) {
    struct rlimit l = old_limit;
    l.rlim_cur = std::min<rlim_t>(old_limit.rlim_max, options.memory_limit_bytes);
    setrlimit(RLIMIT_AS, &l);
  }

  auto run_one = [&](const std::vector<uint8_t>& input) -> bool {
    g_current = input.data();
    g_current_size = input.size();
    try {
      target(std::span<const uint8_t>(input.data(), input.size()));
    } catch (const std::exception& e) {
      std::ofstream(crash_path, std::ios::binary)
          .write(reinterpret_cast<const char*>(input.data()), static_cast<std::streamsize>(input.size()));
      ADD_FAILURE() << "fuzz target " << name << " threw " << e.what() << "; input saved to " << crash_path;
      return false;
    }
    return true;
  };

  size_t runs = 0;
  bool ok = true;
  for (const auto& input : corpus) {
    if (!(ok = run_one(input))) break;
    ++runs;
  }
  Mutator mutator(seed, corpus, options.max_input_size);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; ok; ++i) {
    if (seconds > 0) {
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= seconds) break;
    } else if (i >= options.iterations) {
      break;
    }
    const std::vector<uint8_t> input = mutator.Next();
    ok = run_one(input);
    ++runs;
  }

  g_current = nullptr;
  g_current_size = 0;
  if (limit) setrlimit(RLIMIT_AS, &old_limit);
  sigaction(SIGSEGV, &old_segv, nullptr);
  sigaction(SIGABRT, &old_abrt, nullptr);
  sigaction(SIGBUS, &old_bus, nullptr);
  sigaction(SIGFPE, &old_fpe, nullptr);
  sigaction(SIGILL, &old_ill, nullptr);
  return runs;
}

}  // namespace fl::testing
