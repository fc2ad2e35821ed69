#include "fl/server/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cmath>
#include <optional>
#include <span>

#include "fl/core/checksum.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "fl/sys/user_file.h"
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
  *header.mutable_spec() = proto::ToProto(ckpt.spec, ckpt.model_name);
  header.set_optimizer(ckpt.optimizer.optimizer);
  header.set_optimizer_steps(ckpt.optimizer.step_count);
  header.set_task(ckpt.task);
  if (ckpt.privacy.has_value()) *header.mutable_privacy() = *ckpt.privacy;
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

std::optional<std::string> FindNonFinite(std::span<const float> values, const core::ModelSpec* spec) {
  // Branch-free scan first: the common case (all finite) must stay at memory speed.
  bool all_finite = true;
  for (float v : values) all_finite &= std::isfinite(v);
  if (all_finite) return std::nullopt;
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::isfinite(values[i])) continue;
    if (spec != nullptr && i < spec->num_elements()) {
      const core::TensorSpec& t = spec->tensors()[spec->TensorIndexOfElement(i)];
      return fl::StrCat("tensor '", t.name, "' element ", i - t.offset, " is ", values[i]);
    }
    return fl::StrCat("element ", i, " is ", values[i]);
  }
  return std::nullopt;
}

absl::StatusOr<Checkpoint> LoadCheckpoint(const std::string& path) {
  // A regular file (a FIFO would block the read forever, a link to /dev/zero would be read until memory runs
  // out), of at most kMaxCheckpointBytes, before a byte is read.
  absl::StatusOr<sys::UserFile> file =
      sys::OpenUserFile(path, "checkpoint", kMaxCheckpointBytes,
                        "no model fl-server accepts makes a checkpoint this large: check that this is the right file");
  if (!file.ok()) return file.status();
  auto corrupt = [&](std::string_view why) {
    return absl::DataLossError(
        fl::StrCat("checkpoint ", path, " is corrupt (", why,
                   "); restore it from a copy, or resume from an older round's checkpoint with --resume-from-round"));
  };
  const uint64_t size = file->size();
  if (size < sizeof(kMagic) + 16) return corrupt("no FLCKPT01 magic: not an fl-server checkpoint or truncated");
  // Magic and header length first: the header must fit in the file and in kMaxCheckpointHeaderBytes, and then
  // say exactly how large the file is, before the body is read into memory.
  std::string head(sizeof(kMagic) + 8, '\0');
  if (absl::Status s = file->ReadAt(0, std::span<uint8_t>(reinterpret_cast<uint8_t*>(head.data()), head.size()));
      !s.ok()) {
    return s;
  }
  if (std::memcmp(head.data(), kMagic, sizeof(kMagic)) != 0) {
    return corrupt("no FLCKPT01 magic: not an fl-server checkpoint or truncated");
  }
  const uint64_t header_len = ReadU64(head.data() + sizeof(kMagic));
  const uint64_t body_start = sizeof(kMagic) + 8;
  if (header_len > size - body_start - 8) return corrupt("header length beyond the end of the file");
  if (header_len > kMaxCheckpointHeaderBytes) {
    return corrupt(fl::StrCat("header of ", header_len, " bytes, over the limit of ", kMaxCheckpointHeaderBytes));
  }
  std::string header_bytes(header_len, '\0');
  if (absl::Status s = file->ReadAt(
          body_start, std::span<uint8_t>(reinterpret_cast<uint8_t*>(header_bytes.data()), header_bytes.size()));
      !s.ok()) {
    return s;
  }
  fl::v1::CheckpointHeader header;
  if (!header.ParseFromString(header_bytes)) return corrupt("unreadable header");
  Checkpoint ckpt;
  auto spec = proto::FromProto(header.spec());
  if (!spec.ok()) return corrupt(fl::ToStd(spec.status().message()));
  ckpt.spec = *std::move(spec);
  // The size the header declares (checked arithmetic: counts near 2^64 cannot wrap into a small size).
  uint64_t expected = body_start + header_len + 8;
  auto add_floats = [&expected, size](uint64_t count) {
    if (count > size / 4 || expected > size || count * 4 > size - expected) return false;
    expected += count * 4;
    return true;
  };
  bool fits = add_floats(ckpt.spec.num_elements());
  for (const auto& b : header.state()) fits = fits && add_floats(b.num_values());
  if (!fits || expected != size) {
    return corrupt(fl::StrCat("its header declares ", fits ? fl::StrCat(expected, " bytes") : "more bytes",
                              " (model and optimizer state) but the file has ", size));
  }
  absl::StatusOr<std::string> all = file->ReadAll();
  if (!all.ok()) return all.status();
  const std::string& bytes = *all;
  if (bytes.size() != size) return corrupt("the file changed while it was read");
  const uint64_t stored_sum = ReadU64(bytes.data() + bytes.size() - 8);
  if (core::Checksum64(AsBytes(bytes).first(bytes.size() - 8)) != stored_sum) return corrupt("checksum mismatch");
  size_t pos = body_start + header_len;

  ckpt.model_name = header.spec().name();
  ckpt.experiment_id = header.experiment_id();
  ckpt.round = header.round();
  ckpt.model_version = header.model_version();
  ckpt.optimizer.optimizer = header.optimizer();
  ckpt.optimizer.step_count = header.optimizer_steps();
  ckpt.task = header.task();
  if (header.has_privacy()) ckpt.privacy = header.privacy();
  ckpt.created_unix_ms = header.created_unix_ms();

  auto take_floats = [&](uint64_t count, std::vector<float>* out) {
    out->resize(count);
    std::memcpy(out->data(), bytes.data() + pos, count * 4);
    pos += count * 4;
  };
  take_floats(ckpt.spec.num_elements(), &ckpt.values);
  for (const auto& b : header.state()) {
    core::NamedBuffer s{b.name(), {}};
    take_floats(b.num_values(), &s.values);
    ckpt.optimizer.buffers.push_back(std::move(s));
  }
  // fl-server never commits a non-finite model (every input is checked), so a NaN/Inf here was written by
  // something else; the model would poison every round, and no codec can send it to clients.
  if (std::optional<std::string> bad = FindNonFinite(ckpt.values, &ckpt.spec); bad.has_value()) {
    return absl::InvalidArgumentError(
        fl::StrCat("checkpoint ", path, ": ", *bad,
                   "; a model must hold finite values: resume from an older round's checkpoint with "
                   "--resume-from-round, or start from another model"));
  }
  for (const core::NamedBuffer& b : ckpt.optimizer.buffers) {
    if (std::optional<std::string> bad = FindNonFinite(b.values, nullptr); bad.has_value()) {
      return absl::InvalidArgumentError(
          fl::StrCat("checkpoint ", path, ": optimizer state '", b.name, "' ", *bad,
                     "; the server optimizer's state must be finite: resume from an older round's checkpoint with "
                     "--resume-from-round"));
    }
  }
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
