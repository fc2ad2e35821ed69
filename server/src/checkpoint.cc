#include "fl/server/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>

#include "fl/core/checksum.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/v1/checkpoint.pb.h"

namespace fl::server {
namespace {

constexpr char kMagic[8] = {'F', 'L', 'C', 'K', 'P', 'T', '0', '1'};

void AppendU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t ReadU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

void AppendFloats(std::string* out, const std::vector<float>& values) {
  // The format is little-endian; every platform we build for (amd64, arm64) is too.
  static_assert(std::endian::native == std::endian::little, "checkpoint I/O assumes a little-endian host");
  out->append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

std::span<const uint8_t> AsBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

absl::Status Errno(std::string_view what, const std::string& path) {
  return absl::InternalError(fl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAllAndSync(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("cannot create checkpoint", path);
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      absl::Status s = Errno("cannot write checkpoint", path);
      ::close(fd);
      return s;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    absl::Status s = Errno("cannot fsync checkpoint", path);
    ::close(fd);
    return s;
  }
  if (::close(fd) != 0) return Errno("cannot close checkpoint", path);
  return absl::OkStatus();
}

}  // namespace

std::string CheckpointPath(std::string_view dir, uint64_t round) {
  char name[32];
  std::snprintf(name, sizeof(name), "round-%06llu.ckpt", static_cast<unsigned long long>(round));
  return (std::filesystem::path(dir) / name).string();
}

absl::Status SaveCheckpoint(const Checkpoint& ckpt, const std::string& path) {
  if (ckpt.values.size() != ckpt.spec.num_elements()) {
    return absl::InvalidArgumentError(fl::StrCat("checkpoint of round ", ckpt.round, " has ", ckpt.values.size(),
                                                 " values for a model of ", ckpt.spec.num_elements()));
  }
  fl::v1::CheckpointHeader header;
  header.set_experiment_id(ckpt.experiment_id);
  header.set_round(ckpt.round);
  header.set_model_version(ckpt.model_version);
  *header.mutable_spec() = wire::ToProto(ckpt.spec, ckpt.model_name);
  header.set_optimizer(ckpt.optimizer.optimizer);
  header.set_optimizer_steps(ckpt.optimizer.step_count);
  header.set_task(ckpt.task);
  for (const core::NamedBuffer& s : ckpt.optimizer.buffers) {
    auto* b = header.add_state();
    b->set_name(s.name);
    b->set_num_values(s.values.size());
  }
  header.set_created_unix_ms(ckpt.created_unix_ms);
  const std::string header_bytes = header.SerializeAsString();

  std::string bytes;
  size_t total = sizeof(kMagic) + 8 + header_bytes.size() + ckpt.values.size() * 4 + 8;
  for (const core::NamedBuffer& s : ckpt.optimizer.buffers) total += s.values.size() * 4;
  bytes.reserve(total);
  bytes.append(kMagic, sizeof(kMagic));
  AppendU64(&bytes, header_bytes.size());
  bytes += header_bytes;
  AppendFloats(&bytes, ckpt.values);
  for (const core::NamedBuffer& s : ckpt.optimizer.buffers) AppendFloats(&bytes, s.values);
  AppendU64(&bytes, core::Checksum64(AsBytes(bytes)));

  std::error_code ec;
  const std::filesystem::path final_path(path);
  if (final_path.has_parent_path()) std::filesystem::create_directories(final_path.parent_path(), ec);
  if (ec) return absl::InternalError(fl::StrCat("cannot create checkpoint directory for ", path, ": ", ec.message()));
  const std::string tmp = path + ".tmp";
  if (absl::Status s = WriteAllAndSync(tmp, bytes); !s.ok()) return s;
  if (::rename(tmp.c_str(), path.c_str()) != 0) return Errno("cannot rename checkpoint to", path);
  // fsync the directory so that the rename itself survives a power cut.
  const std::string dir = final_path.has_parent_path() ? final_path.parent_path().string() : ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(fl::StrCat("cannot open checkpoint ", path, ": ", std::strerror(errno)));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto corrupt = [&](std::string_view why) {
    return absl::DataLossError(
        fl::StrCat("checkpoint ", path, " is corrupt (", why,
                   "); restore it from a copy, or resume from an older round's checkpoint with --resume-from-round"));
  };
  if (bytes.size() < sizeof(kMagic) + 16 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("no FLCKPT01 magic: not an fl-server checkpoint or truncated");
  }
  const uint64_t stored_sum = ReadU64(bytes.data() + bytes.size() - 8);
  if (core::Checksum64(AsBytes(bytes).first(bytes.size() - 8)) != stored_sum) return corrupt("checksum mismatch");
  const uint64_t header_len = ReadU64(bytes.data() + sizeof(kMagic));
  size_t pos = sizeof(kMagic) + 8;
  if (header_len > bytes.size() - pos - 8) return corrupt("header length beyond the end of the file");
  fl::v1::CheckpointHeader header;
  if (!header.ParseFromArray(bytes.data() + pos, static_cast<int>(header_len))) return corrupt("unreadable header");
  pos += header_len;

  Checkpoint ckpt;
  auto spec = wire::FromProto(header.spec());
  if (!spec.ok()) return corrupt(fl::ToStd(spec.status().message()));
  ckpt.spec = *std::move(spec);
  ckpt.model_name = header.spec().name();
  ckpt.experiment_id = header.experiment_id();
  ckpt.round = header.round();
  ckpt.model_version = header.model_version();
  ckpt.optimizer.optimizer = header.optimizer();
  ckpt.optimizer.step_count = header.optimizer_steps();
  ckpt.task = header.task();
  ckpt.created_unix_ms = header.created_unix_ms();

  auto take_floats = [&](uint64_t count, std::vector<float>* out) -> bool {
    if (count > (bytes.size() - 8 - pos) / 4) return false;
    out->resize(count);
    std::memcpy(out->data(), bytes.data() + pos, count * 4);
    pos += count * 4;
    return true;
  };
  if (!take_floats(ckpt.spec.num_elements(), &ckpt.values)) return corrupt("model values truncated");
  for (const auto& b : header.state()) {
    core::NamedBuffer s{b.name(), {}};
    if (!take_floats(b.num_values(), &s.values))
      return corrupt(fl::StrCat("optimizer state '", b.name(), "' truncated"));
    ckpt.optimizer.buffers.push_back(std::move(s));
  }
  if (pos != bytes.size() - 8) return corrupt("trailing bytes after the last state buffer");
  return ckpt;
}

absl::Status PruneCheckpoints(std::string_view dir, uint64_t keep_from_round) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    unsigned long long round = 0;
    char tail[8] = {0};
    if (std::sscanf(name.c_str(), "round-%6llu.%4s", &round, tail) == 2 && std::string(tail) == "ckpt" &&
        round < keep_from_round) {
      std::filesystem::remove(entry.path(), ec);
    }
  }
  if (ec) return absl::InternalError(fl::StrCat("cannot prune checkpoints in ", dir, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace fl::server
