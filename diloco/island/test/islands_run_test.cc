// End-to-end runs of real fl-island processes (and fl-coordinator): global state hashes agree
// across islands after DiLoCo and Streaming DiLoCo with overlap and 4-bit exchange; an island of two c10d
// ranks trains; an island SIGKILLed mid-run and another joining late leave training going with equal
// hashes. A tiny character model keeps each run to seconds of compute.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fl/testing/python.h"
#include "fl/pki/pki.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace {

using fl::testing::FreeLoopbackPort;
using fl::testing::ScratchDir;
using fl::testing::Subprocess;
namespace pki = fl::pki;

std::vector<std::string> TinyModelArgs() {
  return {"--model",      "char-lm", "--d-model", "16", "--layers",       "2", "--heads",    "2",   "--context", "16",
          "--batch-size", "4",       "--threads", "1",  "--warmup-steps", "5", "--inner-lr", "3e-3"};
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json();
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t CountLines(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(needle) != std::string::npos;
  return n;
}

int ReadPortFile(const std::string& path, std::chrono::seconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    std::ifstream in(path);
    int port = 0;
    if (in >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return 0;
}

// "prefix" + number without GCC 12's false -Wrestrict on operator+(const char*, std::string&&).
std::string Cat(const std::string& a, long long v) {
  std::ostringstream o;
  o << a << v;
  return o.str();
}
std::string Cat(const std::string& a, const std::string& b) {
  std::ostringstream o;
  o << a << b;
  return o.str();
}

std::vector<std::string> Concat(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Static ring (no coordinator): two islands, Streaming DiLoCo with 3 fragments, overlap 2, int4 + error
// feedback. Both must end with bit-identical θ_global + outer state and the expected number of outer steps.
// A throwaway CA in `keys.dir` with island certificates island-0..island-(n-1) and, unless `with_coordinator` is
// false, a server certificate "coordinator" for 127.0.0.1.
void ProvisionIslands(const pki::Paths& keys, int n, bool with_coordinator = true) {
  ASSERT_TRUE(pki::CreateCa(keys.dir, {}).ok());
  if (with_coordinator) {
    pki::IssueOptions server_cert;
    server_cert.ip_addresses = {"127.0.0.1"};
    ASSERT_TRUE(pki::Issue(keys.dir, pki::Kind::kServer, "coordinator", server_cert).ok());
  }
  for (int i = 0; i < n; ++i) ASSERT_TRUE(pki::Issue(keys.dir, pki::Kind::kIsland, Cat("island-", i), {}).ok());
}

// fl-coordinator's mutual-TLS flags with the certificates of ProvisionIslands.
std::vector<std::string> CoordinatorTlsArgs(const pki::Paths& keys) {
  return {"--tls-cert",      keys.Cert(pki::Kind::kServer, "coordinator"),
          "--tls-key",       keys.Key(pki::Kind::kServer, "coordinator"),
          "--tls-client-ca", keys.CaCert()};
}

// fl-island's mutual-TLS flags for island `id`.
std::vector<std::string> IslandTlsArgs(const pki::Paths& keys, const std::string& id) {
  return {"--tls-ca",   keys.CaCert(),
          "--tls-cert", keys.Cert(pki::Kind::kIsland, id),
          "--tls-key",  keys.Key(pki::Kind::kIsland, id)};
}

// Two islands of a static ring (no coordinator, plaintext), island i on shard i of 2, each started with the ring's
// own flags (--island-id, --shard, --data-endpoint, --peer, --summary s<i>.json, --metrics m<i>.jsonl) and then
// `args`; waits for both to exit 0 and gives their summaries.
void RunTwoStaticIslands(const ScratchDir& dir, const std::vector<std::string>& args, nlohmann::json* s0,
                         nlohmann::json* s1) {
  const int p0 = FreeLoopbackPort(), p1 = FreeLoopbackPort();
  const std::string e0 = Cat("tcp://127.0.0.1:", p0), e1 = Cat("tcp://127.0.0.1:", p1);
  std::vector<std::unique_ptr<Subprocess>> islands;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> ring = {FL_ISLAND_BIN,     "--insecure",
                                     "--island-id",     Cat("island-", i),
                                     "--shard",         Cat("", i),
                                     "--num-shards",    "2",
                                     "--data-endpoint", i == 0 ? e0 : e1,
                                     "--peer",          Cat("island-0=", e0),
                                     "--peer",          Cat("island-1=", e1),
                                     "--summary",       dir.File(Cat(Cat("s", i), ".json")),
                                     "--metrics",       dir.File(Cat(Cat("m", i), ".jsonl"))};
    islands.push_back(std::make_unique<Subprocess>(Concat(ring, args), dir.File(Cat("log", i))));
  }
  for (int i = 0; i < 2; ++i) {
    std::optional<int> rc = islands[i]->Wait(std::chrono::minutes(5));
    ASSERT_TRUE(rc.has_value()) << "island " << i << " did not finish";
    ASSERT_EQ(*rc, 0) << ReadFile(dir.File(Cat("log", i)));
  }
  *s0 = ReadJson(dir.File("s0.json"));
  *s1 = ReadJson(dir.File("s1.json"));
  ASSERT_TRUE(s0->is_object() && s1->is_object());
}

TEST(IslandsRunTest, TwoIslandsStreamingOverlapInt4EndWithEqualHashes) {
  ScratchDir dir("island_static");
  nlohmann::json s0, s1;
  ASSERT_NO_FATAL_FAILURE(RunTwoStaticIslands(dir,
                                              Concat({"--inner-steps", "12", "--fragments", "3", "--overlap-steps", "2",
                                                      "--codec", "int4", "--total-steps", "36"},
                                                     TinyModelArgs()),
                                              &s0, &s1));
  EXPECT_EQ(s0["state_hash"], s1["state_hash"]);
  EXPECT_EQ(s0["outer_steps"], 9);  // 36 steps / H 12 = 3 rounds x 3 fragments
  EXPECT_EQ(s0["syncs"], 9);
  EXPECT_GT(s0["bytes_sent"].get<uint64_t>(), 0u);
  EXPECT_LT(s0["final_eval_loss"].get<double>(), 4.0);  // below ln(vocab) ~ 4.4 of the untrained model
  // Every sync's hash is logged: the two islands' sequences must be equal sync by sync.
  std::ifstream m0(dir.File("m0.jsonl")), m1(dir.File("m1.jsonl"));
  std::vector<std::string> h0, h1;
  for (std::string line; std::getline(m0, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "sync") h0.push_back(j["hash"]);
  }
  for (std::string line; std::getline(m1, line);) {
    auto j = nlohmann::json::parse(line);
    if (j["event"] == "sync") h1.push_back(j["hash"]);
  }
  EXPECT_EQ(h0.size(), 9u);
  EXPECT_EQ(h0, h1);
}

// The same static ring (fixed ring order, so the same fp32 sums in the same order) over CurveZMQ with
// provisioned keys and in plaintext: the final states are the same bits.
TEST(IslandsRunTest, StaticRingOverCurveEndsWithThePlaintextHashes) {
  ScratchDir dir("island_curve");
  const pki::Paths keys{dir.File("pki")};
  ProvisionIslands(keys, 2, /*with_coordinator=*/false);
  auto run = [&](const std::string& tag, bool secure) {
    const std::string e0 = Cat("tcp://127.0.0.1:", FreeLoopbackPort()),
                      e1 = Cat("tcp://127.0.0.1:", FreeLoopbackPort());
    std::vector<std::unique_ptr<Subprocess>> islands;
    for (int i = 0; i < 2; ++i) {
      const std::string id = Cat("island-", i);
      std::vector<std::string> args = {FL_ISLAND_BIN,
                                       "--island-id",
                                       id,
                                       "--shard",
                                       Cat("", i),
                                       "--num-shards",
                                       "2",
                                       "--data-endpoint",
                                       i == 0 ? e0 : e1,
                                       "--peer",
                                       Cat("island-0=", e0),
                                       "--peer",
                                       Cat("island-1=", e1),
                                       "--inner-steps",
                                       "10",
                                       "--fragments",
                                       "2",
                                       "--codec",
                                       "fp32",
                                       "--total-steps",
                                       "20",
                                       "--summary",
                                       dir.File(Cat(tag, Cat(id, ".json")))};
      const std::vector<std::string> security =
          secure ? std::vector<std::string>{"--tls-ca",   keys.CaCert(),
                                            "--tls-cert", keys.Cert(pki::Kind::kIsland, id),
                                            "--tls-key",  keys.Key(pki::Kind::kIsland, id)}
                 : std::vector<std::string>{"--insecure"};
      islands.push_back(std::make_unique<Subprocess>(Concat(Concat(args, security), TinyModelArgs()),
                                                     dir.File(Cat(tag, Cat(id, ".log")))));
    }
    for (int i = 0; i < 2; ++i) {
      std::optional<int> rc = islands[i]->Wait(std::chrono::minutes(5));
      EXPECT_TRUE(rc.has_value() && *rc == 0) << ReadFile(dir.File(Cat(tag, Cat(Cat("island-", i), ".log"))));
    }
    return std::make_pair(ReadJson(dir.File(Cat(tag, "island-0.json"))), ReadJson(dir.File(Cat(tag, "island-1.json"))));
  };
  const auto [curve0, curve1] = run("curve-", true);
  const auto [plain0, plain1] = run("plain-", false);
  ASSERT_TRUE(curve0.is_object() && curve1.is_object() && plain0.is_object() && plain1.is_object());
  EXPECT_EQ(curve0["state_hash"], curve1["state_hash"]);
  EXPECT_EQ(curve0["state_hash"], plain0["state_hash"]);
  EXPECT_EQ(curve0["final_eval_loss"], plain0["final_eval_loss"]);
  EXPECT_EQ(curve0["bytes_sent"], plain0["bytes_sent"]);
  EXPECT_EQ(ReadFile(dir.File("curve-island-0.log")).find("plaintext"), std::string::npos);
}

// The real binaries refuse what they must, with messages that say what to do: fl-island without TLS material or
// --insecure (exit 2); an island presenting another island's certificate, and a plaintext island, to a TLS
// coordinator (exit 1 at once, not a retry until the join timeout).
TEST(IslandsRunTest, IslandsAreRefusedWithoutTheirOwnCertificate) {
  ScratchDir dir("island_refused");
  const pki::Paths keys{dir.File("pki")};
  ProvisionIslands(keys, 2);  // island-1: its ring keys only; island-0 does not get its certificate

  Subprocess bare({FL_ISLAND_BIN, "--island-id", "island-0", "--coordinator", "127.0.0.1:1"}, dir.File("bare.log"));
  EXPECT_EQ(bare.Wait(std::chrono::minutes(1)), 2);
  for (const char* want : {"--tls-ca", "--tls-cert", "--tls-key", "--insecure", "fl-provision"}) {
    EXPECT_NE(ReadFile(dir.File("bare.log")).find(want), std::string::npos)
        << want << ": " << ReadFile(dir.File("bare.log"));
  }

  Subprocess server(Concat({FL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.File("port"), "--db", "",
                            "--min-islands", "1"},
                           CoordinatorTlsArgs(keys)),
                    dir.File("server.log"));
  const int port = ReadPortFile(dir.File("port"), std::chrono::seconds(30));
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string coordinator = Cat("127.0.0.1:", port);
  auto island = [&](const std::string& id, const std::vector<std::string>& security, const std::string& log) {
    std::vector<std::string> args = {FL_ISLAND_BIN,
                                     "--island-id",
                                     id,
                                     "--coordinator",
                                     coordinator,
                                     "--data-endpoint",
                                     Cat("tcp://127.0.0.1:", FreeLoopbackPort())};
    return std::make_unique<Subprocess>(Concat(Concat(args, security), TinyModelArgs()), dir.File(log));
  };
  auto impostor = island("island-1",
                         {"--tls-ca", keys.CaCert(), "--tls-cert", keys.Cert(pki::Kind::kIsland, "island-0"),
                          "--tls-key", keys.Key(pki::Kind::kIsland, "island-0"), "--curve-dir", keys.dir + "/islands"},
                         "impostor.log");
  EXPECT_EQ(impostor->Wait(std::chrono::minutes(2)), 1);
  const std::string impostor_log = ReadFile(dir.File("impostor.log"));
  EXPECT_NE(impostor_log.find("PERMISSION_DENIED"), std::string::npos) << impostor_log;
  EXPECT_NE(impostor_log.find("island certificate is for \"island-0\" but the call is for island_id \"island-1\""),
            std::string::npos)
      << impostor_log;

  auto plaintext = island("island-0", {"--insecure"}, "plaintext.log");
  EXPECT_EQ(plaintext->Wait(std::chrono::minutes(2)), 1);
  const std::string plaintext_log = ReadFile(dir.File("plaintext.log"));
  EXPECT_NE(plaintext_log.find("it probably serves mutual TLS"), std::string::npos) << plaintext_log;
  server.Kill(SIGTERM);
  server.Wait(std::chrono::seconds(20));
}

// fl-coordinator --tls-crl with the real fl-island: an island whose certificate is revoked mid-run (the CRL file
// rewritten by fl::pki, as `fl-provision revoke` does; the coordinator checks it every 50 ms) is evicted, exits 1
// with the revocation in its log, and the records say why; the other island trains on to the end.
TEST(IslandsRunTest, AnIslandRevokedMidRunExitsAndTheOtherTrainsOn) {
  ScratchDir dir("island_revoked");
  const std::string db = dir.File("records.db");
  const pki::Paths keys{dir.File("pki")};
  ProvisionIslands(keys, 2);
  Subprocess server(Concat({FL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.File("port"), "--db", db,
                            "--inner-steps", "10", "--outer-steps", "40", "--min-islands", "2", "--exchange-timeout-ms",
                            "5000", "--tls-crl", keys.Crl(), "--tls-crl-reload-ms", "50"},
                           CoordinatorTlsArgs(keys)),
                    dir.File("server.log"));
  const int port = ReadPortFile(dir.File("port"), std::chrono::seconds(30));
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  std::vector<std::unique_ptr<Subprocess>> islands;
  for (int i = 0; i < 2; ++i) {
    const std::string id = Cat("island-", i);
    std::vector<std::string> args = {FL_ISLAND_BIN,
                                     "--island-id",
                                     id,
                                     "--shard",
                                     Cat("", i),
                                     "--num-shards",
                                     "2",
                                     "--coordinator",
                                     Cat("127.0.0.1:", port),
                                     "--data-endpoint",
                                     Cat("tcp://127.0.0.1:", FreeLoopbackPort()),
                                     "--summary",
                                     dir.File(Cat(id, ".json")),
                                     "--metrics",
                                     dir.File(Cat(id, ".jsonl"))};
    islands.push_back(std::make_unique<Subprocess>(Concat(Concat(args, IslandTlsArgs(keys, id)), TinyModelArgs()),
                                                   dir.File(Cat(id, ".log"))));
  }
  const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(4);
  while (CountLines(dir.File("island-0.jsonl"), "\"sync\"") < 3 && std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_GE(CountLines(dir.File("island-0.jsonl"), "\"sync\""), 3u) << ReadFile(dir.File("island-0.log"));
  const pki::Kind island_kind = pki::Kind::kIsland;
  absl::StatusOr<std::vector<pki::Issued>> revoked = pki::Revoke(keys.dir, "island-1", &island_kind);
  ASSERT_TRUE(revoked.ok() && revoked->size() == 1) << revoked.status();
  const std::string serial = revoked->front().serial_hex;

  std::optional<int> rc = islands[1]->Wait(std::chrono::minutes(2));
  ASSERT_TRUE(rc.has_value()) << "the revoked island is still running: " << ReadFile(dir.File("island-1.log"));
  EXPECT_EQ(*rc, 1);
  const std::string log = ReadFile(dir.File("island-1.log"));
  EXPECT_NE(log.find(serial), std::string::npos) << log;
  EXPECT_NE(log.find("revoked"), std::string::npos) << log;
  rc = islands[0]->Wait(std::chrono::minutes(6));
  ASSERT_TRUE(rc.has_value()) << "island-0 did not finish";
  EXPECT_EQ(*rc, 0) << ReadFile(dir.File("island-0.log"));
  EXPECT_EQ(ReadJson(dir.File("island-0.json"))["outer_steps"], 40);

  server.Kill(SIGTERM);
  server.Wait(std::chrono::seconds(20));
  sqlite3* handle = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(
      sqlite3_prepare_v2(handle, "SELECT left_reason FROM islands WHERE island_id = 'island-1'", -1, &stmt, nullptr),
      SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  const std::string reason = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  sqlite3_finalize(stmt);
  sqlite3_close(handle);
  EXPECT_EQ(reason, Cat(Cat("evicted: the certificate of island 'island-1' (serial ", serial),
                        Cat(Cat(") was revoked (", keys.Crl()), ")")));
}

// The TorchScript models of examples/bring-your-own-model, exported into `dir` by python3-torch.
::testing::AssertionResult ExportExampleModels(const ScratchDir& dir) {
  auto exported = fl::testing::RunPythonFile(Cat(FL_SOURCE_DIR, "/examples/bring-your-own-model/export_models.py"),
                                             {"--out", dir.path().string()}, dir.File("python.log"));
  if (exported.ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << exported.status();
}

// Bring your own model: two islands train a TorchScript GRU language model (examples/bring-your-own-model,
// exported by python3-torch here) next-token on the fortunes text with DiLoCo over int8: equal hashes sync by
// sync, and the model learns (below the ln 256 = 5.55 nats of a uniform byte model).
TEST(IslandsRunTest, TwoIslandsTrainATorchScriptModelWithEqualHashes) {
  ScratchDir dir("island_script");
  ASSERT_TRUE(ExportExampleModels(dir));
  nlohmann::json s0, s1;
  ASSERT_NO_FATAL_FAILURE(RunTwoStaticIslands(dir, {"--inner-steps",  "15",
                                                    "--codec",        "int8",
                                                    "--total-steps",  "45",
                                                    "--model",        dir.File("tiny_lm.pt"),
                                                    "--data",         "/usr/share/games/fortunes",
                                                    "--task",         "next-token",
                                                    "--context",      "32",
                                                    "--batch-size",   "8",
                                                    "--threads",      "1",
                                                    "--warmup-steps", "5",
                                                    "--inner-lr",     "3e-3"},
                                              &s0, &s1));
  EXPECT_EQ(s0["state_hash"], s1["state_hash"]);
  EXPECT_EQ(s0["outer_steps"], 3);
  EXPECT_LT(s0["final_eval_loss"].get<double>(), 5.0);
}

// fl-client's CNN on Fashion-MNIST (--model cnn), each island on its IID half, reading only that half's images
// (train_task.cc): two islands end with equal hashes and an evaluation loss below the untrained model's ln 10.
TEST(IslandsRunTest, TwoIslandsTrainTheBuiltInCnnOnTheirShardsWithEqualHashes) {
  ScratchDir dir("island_cnn");
  nlohmann::json s0, s1;
  ASSERT_NO_FATAL_FAILURE(
      RunTwoStaticIslands(dir,
                          {"--inner-steps", "20", "--codec", "int8", "--total-steps", "60", "--model", "cnn",
                           "--batch-size", "32", "--threads", "1", "--warmup-steps", "5", "--inner-lr", "1e-3"},
                          &s0, &s1));
  EXPECT_EQ(s0["state_hash"], s1["state_hash"]);
  EXPECT_EQ(s0["outer_steps"], 3);
  EXPECT_LT(s0["final_eval_loss"].get<double>(), 2.0) << "ln 10 = 2.30 is an untrained 10-class model";
}

// A TorchScript model that does not fit the data stops the island before it trains, naming the file.
TEST(IslandsRunTest, TorchScriptModelThatDoesNotFitTheDataIsRefused) {
  ScratchDir dir("island_script_bad");
  ASSERT_TRUE(ExportExampleModels(dir));
  const int p0 = FreeLoopbackPort();
  const std::string e0 = Cat("tcp://127.0.0.1:", p0);
  // The image classifier on text tokens.
  Subprocess island({FL_ISLAND_BIN,     "--insecure",
                     "--island-id",     "island-0",
                     "--data-endpoint", e0,
                     "--peer",          Cat("island-0=", e0),
                     "--total-steps",   "10",
                     "--inner-steps",   "10",
                     "--model",         dir.File("cnn_bn.pt"),
                     "--data",          "/usr/share/games/fortunes",
                     "--task",          "next-token",
                     "--threads",       "1"},
                    dir.File("log"));
  std::optional<int> rc = island.Wait(std::chrono::minutes(2));
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 2);
  const std::string log = ReadFile(dir.File("log"));
  EXPECT_NE(log.find("cnn_bn.pt"), std::string::npos) << log;
  EXPECT_NE(log.find("conv2d"), std::string::npos) << "LibTorch's own reason is shown: " << log;
}

// One island of two ranks (processes) over c10d Gloo: gradients all-reduced every step; the leader runs
// DiLoCo alone (a ring of one) and broadcasts each fragment to rank 1.
TEST(IslandsRunTest, IslandWithTwoGlooRanksTrains) {
  ScratchDir dir("island_ranks");
  const int store = FreeLoopbackPort(), data = FreeLoopbackPort();
  const std::string e = Cat("tcp://127.0.0.1:", data);
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < 2; ++r) {
    std::vector<std::string> args = {FL_ISLAND_BIN,     "--insecure",
                                     "--island-id",     "island-0",
                                     "--rank",          Cat("", r),
                                     "--ranks",         "2",
                                     "--pg-store",      Cat("127.0.0.1:", store),
                                     "--data-endpoint", e,
                                     "--peer",          Cat("island-0=", e),
                                     "--inner-steps",   "10",
                                     "--fragments",     "2",
                                     "--total-steps",   "30",
                                     "--summary",       dir.File(Cat(Cat("s", r), ".json"))};
    ranks.push_back(std::make_unique<Subprocess>(Concat(args, TinyModelArgs()), dir.File(Cat("log", r))));
  }
  for (int r = 0; r < 2; ++r) {
    std::optional<int> rc = ranks[r]->Wait(std::chrono::minutes(5));
    ASSERT_TRUE(rc.has_value()) << "rank " << r << " did not finish";
    ASSERT_EQ(*rc, 0) << ReadFile(dir.File(Cat("log", r)));
  }
  nlohmann::json s0 = ReadJson(dir.File("s0.json")), s1 = ReadJson(dir.File("s1.json"));
  ASSERT_TRUE(s0.is_object() && s1.is_object());
  // Both ranks took the same all-reduced AdamW steps and received the same fragments: identical replicas.
  EXPECT_EQ(s0["local_model_hash"], s1["local_model_hash"]);
  EXPECT_EQ(s1["steps"], 30);
  EXPECT_EQ(s0["steps"], 30);
  EXPECT_EQ(s0["outer_steps"], 6);
  EXPECT_EQ(s0["units"], 30 * 2 * 4 * 16);  // steps x ranks x batch x context tokens
}

// fl-coordinator + 3 islands; island-2 is SIGKILLed after a few syncs, island-3 joins late,
// copies the state from a peer and trains to the end; survivors and the late joiner end with equal hashes.
// 150 outer steps of H = 10 so that the survivors are still training when the late joiner has started
// (a process start takes a second or more here; 24 outer steps were sometimes over by then).
TEST(IslandsRunTest, KilledIslandAndLateJoinerLeaveTrainingGoingWithEqualHashes) {
  ScratchDir dir("island_membership");
  const std::string db = dir.File("records.db");
  // Over mutual TLS and CurveZMQ, as the launcher runs it: the late joiner copies the state from a peer's state
  // server over TLS (checked against that island's certificate) and joins a CURVE ring.
  const pki::Paths pki_dir{dir.File("pki")};
  ProvisionIslands(pki_dir, 4);
  Subprocess server(
      Concat({FL_COORDINATOR_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.File("port"), "--db", db,
              "--inner-steps", "10", "--outer-steps", "150", "--min-islands", "3", "--heartbeat-timeout-ms", "3000",
              "--exchange-timeout-ms", "5000", "--barrier-timeout-ms", "20000"},
             CoordinatorTlsArgs(pki_dir)),
      dir.File("server.log"));
  const int port = ReadPortFile(dir.File("port"), std::chrono::seconds(30));
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));
  const std::string coordinator = Cat("127.0.0.1:", port);
  auto start_island = [&](int i) {
    const std::string id = Cat("island-", i);
    std::vector<std::string> args = {FL_ISLAND_BIN,
                                     "--island-id",
                                     id,
                                     "--shard",
                                     Cat("", i % 3),
                                     "--num-shards",
                                     "3",
                                     "--coordinator",
                                     coordinator,
                                     "--data-endpoint",
                                     Cat("tcp://127.0.0.1:", FreeLoopbackPort()),
                                     "--summary",
                                     dir.File(Cat(id, ".json")),
                                     "--metrics",
                                     dir.File(Cat(id, ".jsonl"))};
    return std::make_unique<Subprocess>(Concat(Concat(args, IslandTlsArgs(pki_dir, id)), TinyModelArgs()),
                                        dir.File(Cat(id, ".log")));
  };
  std::vector<std::unique_ptr<Subprocess>> islands;
  for (int i = 0; i < 3; ++i) islands.push_back(start_island(i));

  auto wait_for_syncs = [&](const std::string& id, size_t n) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::minutes(4);
    while (CountLines(dir.File(Cat(id, ".jsonl")), "\"sync\"") < n && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return CountLines(dir.File(Cat(id, ".jsonl")), "\"sync\"");
  };
  ASSERT_GE(wait_for_syncs("island-0", 3), 3u) << ReadFile(dir.File("island-0.log"));
  islands[2]->Kill(SIGKILL);
  ASSERT_TRUE(islands[2]->Wait(std::chrono::seconds(10)).has_value());
  const size_t at_kill = CountLines(dir.File("island-0.jsonl"), "\"sync\"");
  // Training goes on without it, then a new island joins late.
  ASSERT_GE(wait_for_syncs("island-0", at_kill + 3), at_kill + 3) << ReadFile(dir.File("island-0.log"));
  islands.push_back(start_island(3));
  for (int i : {0, 1, 3}) {
    std::optional<int> rc = islands[i]->Wait(std::chrono::minutes(6));
    ASSERT_TRUE(rc.has_value()) << "island " << i << " did not finish";
    EXPECT_EQ(*rc, 0) << ReadFile(dir.File(Cat(Cat("island-", i), ".log")));
  }
  nlohmann::json a = ReadJson(dir.File("island-0.json")), b = ReadJson(dir.File("island-1.json")),
                 late = ReadJson(dir.File("island-3.json"));
  ASSERT_TRUE(a.is_object() && b.is_object() && late.is_object());
  EXPECT_EQ(a["outer_steps"], 150);
  EXPECT_EQ(a["state_hash"], b["state_hash"]);
  EXPECT_EQ(a["state_hash"], late["state_hash"]);
  EXPECT_EQ(late["late_joined"], true);
  EXPECT_GT(late["first_step"].get<uint64_t>(), 0u);
  EXPECT_LT(late["steps"].get<uint64_t>(), a["steps"].get<uint64_t>());

  // The coordinator's records: the last sync was committed by three members (0, 1 and the late joiner),
  // with the hash the islands report.
  server.Kill(SIGTERM);
  server.Wait(std::chrono::seconds(20));
  sqlite3* handle = nullptr;
  ASSERT_EQ(sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(handle,
                               "SELECT step, num_members, committed_hash FROM island_epochs WHERE outcome = "
                               "'committed' ORDER BY step DESC, epoch DESC LIMIT 1",
                               -1, &stmt, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(stmt, 0), 149);
  EXPECT_EQ(sqlite3_column_int64(stmt, 1), 3);
  const std::string committed = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 2));
  sqlite3_finalize(stmt);
  sqlite3_close(handle);
  EXPECT_NE(committed.find(a["state_hash"].get<std::string>()), std::string::npos)
      << committed << " vs " << a["state_hash"];
}

}  // namespace
