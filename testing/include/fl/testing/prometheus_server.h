// Test support: a real Prometheus server (Debian's /usr/bin/prometheus) on a free loopback port, scraping the
// targets a test names every second, answering PromQL through its HTTP API; stopped (SIGTERM, then SIGKILL)
// when the object goes away.
//
//   auto prom = PrometheusServer::Start({{"fl-server", {"127.0.0.1:9464"}}});
//   ASSERT_TRUE(prom.ok()) << prom.status();
//   auto data = (*prom)->Query("fl_current_round");  // the API's "data" object: resultType, result
//
// The HTTP client is a few lines of raw sockets (HTTP/1.1 GET, chunked or not): no new dependency for tests.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::testing {

// One scrape job of the generated prometheus.yml: its targets ("127.0.0.1:port") and labels added to every
// series scraped from them.
struct ScrapeJob {
  std::string name;
  std::vector<std::string> targets;
  std::map<std::string, std::string> labels;
};

struct HttpResponse {
  int status = 0;
  std::string body;
};

// GET `path` from 127.0.0.1:`port` over HTTP/1.1 (Connection: close), decoding a chunked body.
inline absl::StatusOr<HttpResponse> HttpGetLoopback(int port, const std::string& path,
                                                    std::chrono::seconds timeout = std::chrono::seconds(30)) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return absl::InternalError("socket() failed");
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count());
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return absl::UnavailableError("cannot connect to 127.0.0.1:" + std::to_string(port));
  }
  const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                          "\r\nAccept: application/json\r\nConnection: close\r\n\r\n";
  for (size_t off = 0; off < req.size();) {
    const ssize_t n = write(fd, req.data() + off, req.size() - off);
    if (n <= 0) {
      close(fd);
      return absl::UnavailableError("cannot send the request to 127.0.0.1:" + std::to_string(port));
    }
    off += static_cast<size_t>(n);
  }
  std::string raw;
  char buf[16384];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos) {
    return absl::DataLossError("not an HTTP response from 127.0.0.1:" + std::to_string(port) + " for " + path);
  }
  HttpResponse resp;
  resp.status = std::atoi(raw.c_str() + raw.find(' ') + 1);
  std::string head = raw.substr(0, head_end);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::string body = raw.substr(head_end + 4);
  if (head.find("\r\ntransfer-encoding: chunked") == std::string::npos) {
    resp.body = std::move(body);
    return resp;
  }
  // Chunked: <hex size>[;ext]\r\n<data>\r\n ... 0\r\n\r\n
  for (size_t pos = 0;;) {
    const size_t eol = body.find("\r\n", pos);
    if (eol == std::string::npos) return absl::DataLossError("truncated chunked body for " + path);
    const size_t size = std::strtoul(body.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (size == 0) break;
    if (eol + 2 + size > body.size()) return absl::DataLossError("truncated chunk for " + path);
    resp.body.append(body, eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  return resp;
}

inline std::string UrlEncode(const std::string& s) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

class PrometheusServer {
 public:
  static constexpr const char* kBinary = "/usr/bin/prometheus";

  // Writes prometheus.yml (every job scraped each second), starts Prometheus with its own TSDB in a scratch
  // directory and waits until /-/ready answers. Unavailable with the tail of Prometheus' log when it does not.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::vector<ScrapeJob>& jobs, std::chrono::seconds ready_timeout = std::chrono::seconds(60)) {
    if (access(kBinary, X_OK) != 0) {
      return absl::FailedPreconditionError(std::string(kBinary) +
                                           " not found: install Debian's prometheus package (deploy/install-deps.sh)");
    }
    std::unique_ptr<PrometheusServer> p(new PrometheusServer());
    {
      std::ofstream yml(p->config_path());
      yml << "# Generated by fl::testing::PrometheusServer\n"
             "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n"
             "scrape_configs:\n";
      for (const ScrapeJob& job : jobs) {
        yml << "  - job_name: " << nlohmann::json(job.name).dump() << "\n    static_configs:\n      - targets: [";
        for (size_t i = 0; i < job.targets.size(); ++i) yml << (i ? ", " : "") << nlohmann::json(job.targets[i]).dump();
        yml << "]\n";
        if (!job.labels.empty()) {
          yml << "        labels:\n";
          for (const auto& [k, v] : job.labels) yml << "          " << k << ": " << nlohmann::json(v).dump() << "\n";
        }
      }
      if (!yml) return absl::InternalError("cannot write " + p->config_path());
    }
    // A port free a moment ago may be taken by the time Prometheus binds: try a few.
    absl::Status last = absl::UnknownError("not started");
    for (int attempt = 0; attempt < 3; ++attempt) {
      last = p->Launch(ready_timeout);
      if (last.ok()) return p;
    }
    return last;
  }

  ~PrometheusServer() {
    if (process_ != nullptr && process_->running()) {
      process_->Kill(SIGTERM);
      if (!process_->Wait(std::chrono::seconds(10)).has_value()) process_->Kill(SIGKILL);
    }
    process_.reset();  // waits for the process
  }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  int port() const { return port_; }
  std::string config_path() const { return dir_.File("prometheus.yml"); }
  std::string log_path() const { return dir_.File("prometheus.log"); }
  bool running() const { return process_ != nullptr && process_->running(); }

  // The last `bytes` of Prometheus' log, for failure messages.
  std::string LogTail(size_t bytes = 4000) const {
    std::ifstream in(log_path());
    std::string all((std::istreambuf_iterator<char>(in)), {});
    return all.size() > bytes ? all.substr(all.size() - bytes) : all;
  }

  // GET an API path ("/api/v1/targets") and parse the JSON envelope: its "data" on status "success";
  // otherwise an error carrying Prometheus' errorType and error.
  absl::StatusOr<nlohmann::json> Api(const std::string& path_and_query) const {
    auto resp = HttpGetLoopback(port_, path_and_query);
    if (!resp.ok()) return resp.status();
    nlohmann::json doc = nlohmann::json::parse(resp->body, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded() || !doc.is_object()) {
      return absl::DataLossError("Prometheus answered " + path_and_query + " with HTTP " +
                                 std::to_string(resp->status) + " and no JSON: " + resp->body.substr(0, 300));
    }
    if (doc.value("status", "") != "success") {
      return absl::InvalidArgumentError("Prometheus refused " + path_and_query + " (HTTP " +
                                        std::to_string(resp->status) + "): " + doc.value("errorType", "?") + ": " +
                                        doc.value("error", "?"));
    }
    return doc["data"];
  }

  // An instant query (/api/v1/query), at `unix_time` seconds when given, else now. Returns the "data" object
  // ({"resultType": ..., "result": [...]}).
  absl::StatusOr<nlohmann::json> Query(const std::string& promql,
                                       std::optional<double> unix_time = std::nullopt) const {
    std::string path = "/api/v1/query?query=" + UrlEncode(promql);
    if (unix_time.has_value()) {
      char t[64];
      std::snprintf(t, sizeof(t), "%.3f", *unix_time);
      path += std::string("&time=") + t;
    }
    return Api(path);
  }

  // Waits until Prometheus has `targets` active targets and has tried to scrape each of them at least once
  // (successfully or not). Its discovery hands new targets to the scrapers some seconds after start, so a test
  // that starts what it scrapes only after this sees it from its first second.
  absl::Status WaitUntilScraping(size_t targets, std::chrono::seconds timeout) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    std::string last;
    while (std::chrono::steady_clock::now() < end) {
      auto data = Api("/api/v1/targets?state=active");
      if (data.ok()) {
        const nlohmann::json& active = (*data)["activeTargets"];
        size_t scraped = 0;
        for (const auto& t : active) scraped += !t.value("lastScrape", "").starts_with("0001-");
        if (active.size() == targets && scraped == targets) return absl::OkStatus();
        last = active.dump();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return absl::DeadlineExceededError("Prometheus did not scrape " + std::to_string(targets) + " targets within " +
                                       std::to_string(timeout.count()) + " s; its targets: " + last);
  }

  // Polls Query(promql) every 250 ms until `done(data)` or `timeout`; returns the last answer either way (the
  // caller asserts on it) or the last error.
  absl::StatusOr<nlohmann::json> QueryUntil(const std::string& promql,
                                            const std::function<bool(const nlohmann::json&)>& done,
                                            std::chrono::seconds timeout) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto data = Query(promql);
      if ((data.ok() && done(*data)) || std::chrono::steady_clock::now() >= end) return data;
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }

 private:
  PrometheusServer() : dir_("fl_prometheus") {}

  absl::Status Launch(std::chrono::seconds ready_timeout) {
    port_ = FreeLoopbackPort();
    process_ = std::make_unique<Subprocess>(
        std::vector<std::string>{kBinary, "--config.file=" + config_path(), "--storage.tsdb.path=" + dir_.File("tsdb"),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port_),
                                 "--storage.tsdb.retention.time=1d", "--log.level=info"},
        log_path());
    const auto end = std::chrono::steady_clock::now() + ready_timeout;
    while (std::chrono::steady_clock::now() < end) {
      if (!process_->running()) {
        process_.reset();
        return absl::UnavailableError("prometheus exited at start on port " + std::to_string(port_) + "; its log:\n" +
                                      LogTail());
      }
      auto ready = HttpGetLoopback(port_, "/-/ready", std::chrono::seconds(2));
      if (ready.ok() && ready->status == 200) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    process_->Kill(SIGKILL);
    process_.reset();
    return absl::UnavailableError("prometheus on port " + std::to_string(port_) + " was not ready after " +
                                  std::to_string(ready_timeout.count()) + " s; its log:\n" + LogTail());
  }

  ScratchDir dir_;
  int port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

}  // namespace fl::testing
