// A revocation list that a server checks every call's certificate against, reloaded when its file changes
// (fl-server for its clients; usable by any gRPC server of the project).
//
// gRPC checks a client certificate's chain and validity at the handshake, once per connection; a certificate
// revoked afterwards would keep its connection (HTTP/2 keeps it open for every later call). So the service
// checks the serial of each call's certificate here, and the watcher tells the engine which serials became
// revoked so that their sessions are closed at once (docs/security.md, "Revocation").
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "fl/core/mutex.h"
#include "fl/pki/revocation.h"

namespace fl::pki {

class RevocationWatcher {
 public:
  struct Options {
    std::string crl_file;       // fl-provision's <dir>/ca/crl.pem
    std::string ca_cert_file;   // the CA that signed it (and the client certificates): --tls-client-ca
    uint32_t reload_ms = 1000;  // how often the file is checked for a change (its size, mtime, inode)
  };
  // Called (on the watcher's thread) with the serials a reload found newly revoked.
  using OnRevoked = std::function<void(const std::set<std::string>& serials)>;

  // Loads the list now: a missing, malformed or foreign list is an error (fl-server does not start with a
  // revocation list it cannot trust); then watches the file. A later reload that fails keeps the current list and
  // logs why (fl-provision replaces the file atomically, so that means someone wrote it by hand).
  static absl::StatusOr<std::unique_ptr<RevocationWatcher>> Start(Options options, OnRevoked on_revoked);
  ~RevocationWatcher();
  RevocationWatcher(const RevocationWatcher&) = delete;
  RevocationWatcher& operator=(const RevocationWatcher&) = delete;

  bool IsRevoked(const std::string& serial_hex) const;
  // Checks the file now instead of at the next period (tests); true when a changed list was loaded.
  bool ReloadIfChanged();
  const Options& options() const { return options_; }

 private:
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = 0;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };
  RevocationWatcher(Options options, OnRevoked on_revoked, RevocationList list, FileStamp stamp);
  static FileStamp Stamp(const std::string& path);
  void Run();

  const Options options_;
  const OnRevoked on_revoked_;
  mutable fl::Mutex mu_;
  std::shared_ptr<const RevocationList> list_ ABSL_GUARDED_BY(mu_);
  FileStamp stamp_ ABSL_GUARDED_BY(mu_);
  fl::Mutex reload_mu_;  // one reload at a time (the thread's and ReloadIfChanged's); taken before mu_
  fl::CondVar stop_cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace fl::pki
