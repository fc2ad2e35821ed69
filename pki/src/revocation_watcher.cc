#include "fl/pki/revocation_watcher.h"

#include <sys/stat.h>

#include <chrono>
#include <ctime>
#include <utility>

#include <spdlog/spdlog.h>

namespace fl::pki {
namespace {

// A list past its nextUpdate is still used (refusing every peer would stop the experiment), but said.
void WarnIfStale(const RevocationList& list, const std::string& path) {
  if (list.next_update() != 0 && list.next_update() < ::time(nullptr)) {
    spdlog::warn(
        "the revocation list {} is past its nextUpdate ({}); it is still used: run `fl-provision crl` on "
        "the CA host and copy the new list here",
        path, FormatTime(list.next_update()));
  }
}

}  // namespace

RevocationWatcher::FileStamp RevocationWatcher::Stamp(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  return FileStamp{int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec, static_cast<int64_t>(st.st_size),
                   static_cast<uint64_t>(st.st_ino)};
}

absl::StatusOr<std::unique_ptr<RevocationWatcher>> RevocationWatcher::Start(Options options, OnRevoked on_revoked) {
  const FileStamp stamp = Stamp(options.crl_file);
  absl::StatusOr<RevocationList> list = RevocationList::Load(options.crl_file, options.ca_cert_file);
  if (!list.ok()) return list.status();
  WarnIfStale(*list, options.crl_file);
  return std::unique_ptr<RevocationWatcher>(
      new RevocationWatcher(std::move(options), std::move(on_revoked), *std::move(list), stamp));
}

RevocationWatcher::RevocationWatcher(Options options, OnRevoked on_revoked, RevocationList list, FileStamp stamp)
    : options_(std::move(options)),
      on_revoked_(std::move(on_revoked)),
      list_(std::make_shared<const RevocationList>(std::move(list))),
      stamp_(stamp) {
  thread_ = std::thread([this] { Run(); });
}

RevocationWatcher::~RevocationWatcher() {
  {
    fl::MutexLock lock(mu_);
    stop_ = true;
  }
  stop_cv_.NotifyAll();
  thread_.join();
}

bool RevocationWatcher::IsRevoked(const std::string& serial_hex) const {
  fl::MutexLock lock(mu_);
  return list_->IsRevoked(serial_hex);
}

bool RevocationWatcher::ReloadIfChanged() {
  fl::MutexLock reload_lock(reload_mu_);
  const FileStamp now = Stamp(options_.crl_file);
  std::shared_ptr<const RevocationList> before;
  {
    fl::MutexLock lock(mu_);
    if (now == stamp_) return false;
    stamp_ = now;  // a list that fails to load is not retried until the file changes again
    before = list_;
  }
  absl::StatusOr<RevocationList> loaded = RevocationList::Load(options_.crl_file, options_.ca_cert_file);
  if (!loaded.ok()) {
    spdlog::error("revocation list not reloaded, the previous one ({} revoked) stays in force: {}",
                  before->serials().size(), std::string(loaded.status().message()));
    return false;
  }
  WarnIfStale(*loaded, options_.crl_file);
  auto next = std::make_shared<const RevocationList>(*std::move(loaded));
  std::set<std::string> added;
  for (const std::string& s : next->serials()) {
    if (!before->IsRevoked(s)) added.insert(s);
  }
  {
    fl::MutexLock lock(mu_);
    list_ = next;
  }
  spdlog::info("revocation list {} reloaded (CRL number {}): {} revoked, {} newly", options_.crl_file,
               next->crl_number(), next->serials().size(), added.size());
  if (!added.empty() && on_revoked_) on_revoked_(added);
  return true;
}

void RevocationWatcher::Run() {
  for (;;) {
    {
      fl::MutexLock lock(mu_);
      if (stop_cv_.WaitFor(mu_, std::chrono::milliseconds(options_.reload_ms),
                           [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; })) {
        return;
      }
    }
    ReloadIfChanged();  // outside mu_: it takes reload_mu_ first
  }
}

}  // namespace fl::pki
