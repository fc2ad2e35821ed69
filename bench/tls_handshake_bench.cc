// tls_handshake_bench: what a fresh client's first Join costs, plaintext against mutual TLS (docs/security.md,
// "What security costs").
//
// BM_FirstJoin/<security>/<link>: one iteration = a new gRPC channel to a real fl-server (a child process) with
// the project's channel arguments and credentials (fl::proto::SessionChannelArguments, fl::rpc::ChannelCredentials:
// what fl-client builds), then one Join, answered (admitted). The time measured (manual time) is from channel
// creation to the Join's answer: TCP connect, the TLS 1.3 handshake with client certificate (mtls), HTTP/2
// set-up and the Join RPC with the server's admission work. The channel has its own subchannel pool and no TLS
// session cache, so every iteration opens a new connection and does a full handshake, as a client starting up.
//   security: plaintext (fl-server --insecure, insecure channel credentials) or mtls (a throwaway CA made with
//             fl::pki at start: a server certificate for 127.0.0.1 and the client certificate of `hs-0`, the name
//             every Join uses; fl-server --tls-cert/--tls-key/--tls-client-ca);
//   link:     loopback (straight to fl-server on 127.0.0.1) or 5g-sa (through fl::emulation::ShapingRelay with the
//             experiments/profiles/links/5g-sa.yaml profile: 15 Mbit/s up, 150 down, 12 +- 4 ms each way).
// Counters:
//   median_ms     the median iteration (the reported time is the mean);
//   x_plaintext   this benchmark's mean time over that of plaintext on the same link, measured just before in the
//                 same run (> 1: what mutual TLS adds);
//   client_cpu_ms CPU time of this process per iteration (getrusage: gRPC's threads; on 5g-sa the relay thread's
//                 copying too), channel teardown included;
//   server_cpu_ms fl-server's CPU time per iteration (/proc/<pid>/stat over the whole benchmark, 10 ms ticks);
//   bytes_up, bytes_down  bytes per iteration through the relay (5g-sa only): client -> server, server -> client.
// Rejoining under the same name without a session is admitted by fl-server (a name is held only while its session
// stream is open), and the Join rate limits are turned off (--join-per-s-per-peer=0 --join-per-s-per-identity=0)
// so that the benchmark's Joins are not refused as a flood.
//
// The relay terminates TCP (docs/testbed.md): the TCP handshake itself sees loopback, not the emulated 24 ms round
// trip; on a real 5G link both variants pay one more round trip for it.
// Run: tls_handshake_bench --benchmark_repetitions=3 (figures in docs/security.md).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>
#include <grpcpp/grpcpp.h>

#include "fl/client/synthetic_trainer.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/link_profile.h"
#include "fl/emulation/shaping_relay.h"
#include "fl/pki/pki.h"
#include "fl/proto/convert.h"
#include "fl/rpc/tls.h"
#include "fl/sys/process.h"
#include "fl/v1/federation.grpc.pb.h"

#ifndef FL_SERVER_PATH
#define FL_SERVER_PATH "fl-server"
#endif
#ifndef FL_SOURCE_DIR
#define FL_SOURCE_DIR "."
#endif

namespace {

using Clock = std::chrono::steady_clock;
constexpr char kClientName[] = "hs-0";

// One fl-server child, plaintext or mutual TLS, and the relay in front of it.
struct Server {
  std::optional<fl::sys::Child> child;
  std::string address;  // 127.0.0.1:<port>
  std::unique_ptr<fl::emulation::ShapingRelay> relay_5g;
};

struct Setup {
  std::string dir;
  std::string ca_cert, server_cert, server_key, client_cert, client_key;
  Server plaintext, mtls;
  fl::v1::JoinRequest join;
  std::string error;  // why the set-up failed; every benchmark then reports it
};

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::Status StartServer(const Setup& s, bool tls, const fl::emulation::LinkProfile& profile, Server* out) {
  const std::string dir = fl::StrCat(s.dir, tls ? "/mtls" : "/plaintext");
  std::filesystem::create_directories(dir);
  fl::sys::SpawnOptions o;
  o.argv = {FL_SERVER_PATH, "--listen=127.0.0.1:0", "--port-file=" + dir + "/port", "--db=" + dir + "/records.db",
            "--experiment-name=tls-handshake-bench", "--rounds=1",
            // No round ever starts: the benchmark only joins.
            "--min-fit-clients=1000", "--min-available-clients=1000", "--join-per-s-per-peer=0",
            "--join-per-s-per-identity=0", "--log-level=error"};
  if (tls) {
    o.argv.push_back("--tls-cert=" + s.server_cert);
    o.argv.push_back("--tls-key=" + s.server_key);
    o.argv.push_back("--tls-client-ca=" + s.ca_cert);
  } else {
    o.argv.push_back("--insecure");
  }
  o.stdout_to = fl::sys::Stdio::File(dir + "/server.log", /*append_to_it=*/true);
  o.stderr_to = fl::sys::Stdio::ToStdout();
  o.death_signal = SIGKILL;
  o.stop_grace = std::chrono::milliseconds(2000);
  auto child = fl::sys::Child::Spawn(o);
  if (!child.ok()) return child.status();
  out->child.emplace(*std::move(child));
  int port = 0;
  const auto start = Clock::now();
  while (port == 0) {
    if (out->child->Poll().has_value()) {
      return absl::InternalError(fl::StrCat("fl-server ", out->child->exit_status()->Describe(),
                                            " before listening; see ", dir, "/server.log"));
    }
    if (Clock::now() - start > std::chrono::seconds(60)) {
      return absl::DeadlineExceededError(fl::StrCat("fl-server did not listen within 60 s; see ", dir, "/server.log"));
    }
    if (auto text = ReadFile(dir + "/port"); text.ok() && !text->empty()) port = std::atoi(text->c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  out->address = fl::StrCat("127.0.0.1:", port);
  auto relay = fl::emulation::ShapingRelay::Start(
      {.target_addr = out->address, .uplink = profile.uplink, .downlink = profile.downlink, .seed = 7});
  if (!relay.ok()) return relay.status();
  out->relay_5g = *std::move(relay);
  return absl::OkStatus();
}

Setup* MakeSetup() {
  auto* s = new Setup;
  char tmpl[] = "/tmp/tls_handshake_bench.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    s->error = "mkdtemp failed";
    return s;
  }
  s->dir = tmpl;
  const std::string pki = s->dir + "/pki";
  fl::pki::IssueOptions server;
  server.ip_addresses = {"127.0.0.1"};
  absl::Status st = fl::pki::CreateCa(pki, {});
  if (st.ok()) st = fl::pki::Issue(pki, fl::pki::Kind::kServer, "server", server).status();
  if (st.ok()) st = fl::pki::Issue(pki, fl::pki::Kind::kClient, kClientName, {}).status();
  const fl::pki::Paths paths{pki};
  s->ca_cert = paths.CaCert();
  s->server_cert = paths.Cert(fl::pki::Kind::kServer, "server");
  s->server_key = paths.Key(fl::pki::Kind::kServer, "server");
  s->client_cert = paths.Cert(fl::pki::Kind::kClient, kClientName);
  s->client_key = paths.Key(fl::pki::Kind::kClient, kClientName);
  auto profile = fl::emulation::LoadLinkProfile(FL_SOURCE_DIR "/experiments/profiles/links/5g-sa.yaml");
  if (st.ok() && !profile.ok()) st = profile.status();
  if (st.ok()) st = StartServer(*s, false, *profile, &s->plaintext);
  if (st.ok()) st = StartServer(*s, true, *profile, &s->mtls);
  if (!st.ok()) {
    s->error = fl::ToStd(st.message());
    return s;
  }
  // What fl-client --model synthetic:1000 sends (the spec's size does not matter to the handshake).
  fl::client::SyntheticTrainer trainer(1000, 100, 1, 0, "classification");
  s->join.set_protocol_version(fl::v1::PROTOCOL_VERSION_3);
  s->join.set_client_name(kClientName);
  *s->join.mutable_model_spec() = fl::proto::ToProto(trainer.spec(), trainer.model_name());
  s->join.set_task(trainer.task());
  s->join.set_num_train_examples(trainer.num_train_examples());
  s->join.set_num_test_examples(trainer.num_test_examples());
  s->join.mutable_device()->set_device_class("bench");
  return s;
}

Setup& GetSetup() {
  static Setup* setup = MakeSetup();  // the servers live until the process exits (SIGKILL on our death)
  return *setup;
}

double ProcessCpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
}

// utime + stime of a process from /proc/<pid>/stat, ms.
double ChildCpuMs(pid_t pid) {
  auto text = ReadFile(fl::StrCat("/proc/", pid, "/stat"));
  if (!text.ok()) return NAN;
  const size_t close = text->rfind(')');  // the command name may contain spaces
  std::istringstream in(text->substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {  // fields 3.. after "pid (comm)"
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) stime = std::strtod(field.c_str(), nullptr);
  }
  return (utime + stime) * 1e3 / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Mean seconds of each plaintext repetition, by link, for x_plaintext (against their median).
std::map<std::string, std::vector<double>> g_plaintext_mean_s;

double MedianOf(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void BM_FirstJoin(benchmark::State& state, bool tls, bool via_5g) {
  Setup& s = GetSetup();
  if (!s.error.empty()) {
    state.SkipWithError(s.error.c_str());
    return;
  }
  Server& server = tls ? s.mtls : s.plaintext;
  const std::string target = via_5g ? server.relay_5g->address() : server.address;
  std::optional<fl::rpc::ClientTls> client_tls;
  if (tls) client_tls = fl::rpc::ClientTls{s.ca_cert, s.client_cert, s.client_key, ""};
  auto credentials = fl::rpc::ChannelCredentials(client_tls);
  if (!credentials.ok()) {
    state.SkipWithError(std::string(credentials.status().message()).c_str());
    return;
  }
  std::vector<double> samples;
  const fl::emulation::RelayStats relay_before = server.relay_5g->stats();
  const double server_cpu_before = ChildCpuMs(server.child->pid());
  double client_cpu_ms = 0;
  for (auto _ : state) {
    const double cpu_before = ProcessCpuMs();
    const auto start = Clock::now();
    grpc::ChannelArguments args = fl::proto::SessionChannelArguments();
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own, never one of an earlier channel
    auto channel = grpc::CreateCustomChannel(target, *credentials, args);
    auto stub = fl::v1::Federation::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    fl::v1::JoinResponse resp;
    const grpc::Status status = stub->Join(&ctx, s.join, &resp);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (!status.ok() || !resp.admitted()) {
      state.SkipWithError(fl::StrCat("Join: ", status.error_message(), " ", resp.error().message()).c_str());
      return;
    }
    state.SetIterationTime(seconds);
    samples.push_back(seconds);
    stub.reset();
    channel.reset();
    client_cpu_ms += ProcessCpuMs() - cpu_before;
  }
  const double n = static_cast<double>(samples.size());
  const double mean_s = [&] {
    double sum = 0;
    for (double v : samples) sum += v;
    return sum / n;
  }();
  state.counters["median_ms"] = MedianOf(samples) * 1e3;
  state.counters["client_cpu_ms"] = client_cpu_ms / n;
  state.counters["server_cpu_ms"] = (ChildCpuMs(server.child->pid()) - server_cpu_before) / n;
  if (via_5g) {
    const fl::emulation::RelayStats after = server.relay_5g->stats();
    state.counters["bytes_up"] = static_cast<double>(after.uplink_bytes - relay_before.uplink_bytes) / n;
    state.counters["bytes_down"] = static_cast<double>(after.downlink_bytes - relay_before.downlink_bytes) / n;
  }
  const std::string link = via_5g ? "5g-sa" : "loopback";
  if (!tls) g_plaintext_mean_s[link].push_back(mean_s);
  if (auto it = g_plaintext_mean_s.find(link); it != g_plaintext_mean_s.end()) {
    state.counters["x_plaintext"] = mean_s / MedianOf(it->second);
  }
}

}  // namespace

int main(int argc, char** argv) {
  // Plaintext before mTLS on each link (all repetitions of one before the next): x_plaintext compares with the
  // plaintext runs just before.
  for (const bool via_5g : {false, true}) {
    for (const bool tls : {false, true}) {
      const std::string name =
          fl::StrCat("BM_FirstJoin/", tls ? "mtls" : "plaintext", "/", via_5g ? "5g-sa" : "loopback");
      benchmark::RegisterBenchmark(name.c_str(), BM_FirstJoin, tls, via_5g)
          ->UseManualTime()
          ->Iterations(via_5g ? 50 : 200)
          ->Unit(benchmark::kMillisecond);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
