// Records of cross-site islands (DiLoCo / Streaming DiLoCo; diloco/coord), in the tables of schema
// version 5: `islands`, `island_epochs`, `island_syncs` (columns and units: docs/records.md, "Islands").
//
// IslandRecordWriter owns a write connection of its own to the records database (beside RecordStore's:
// WAL lets both write, each waiting for the other's lock up to busy_timeout) and one writer thread; the
// coordinator enqueues from under its lock without waiting for SQLite. The experiment's row must exist
// (write it through RecordStore and Flush() first): every island row references it.
//
//   auto writer = IslandRecordWriter::Open("/data/records.db");   // migrates like RecordStore::Open
//   (*writer)->Enqueue(IslandRecord{...});
//   absl::Status s = (*writer)->Flush();                            // everything so far committed
//
// Parents before children: island and epoch rows before the island_syncs rows that reference them.
// A record that violates a constraint is dropped alone and reported by the next Flush()/Close().
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::instrumentation {

// One admission of an island (a rejoin is a new row with a new join_seq).
struct IslandRecord {
  std::string experiment_id;
  int64_t join_seq = 0;  // admission order within the experiment, from 1
  std::string island_id;
  std::string data_endpoint;   // ZeroMQ endpoint of its leader
  std::string state_endpoint;  // gRPC address of its state server
  int64_t num_ranks = 1;
  std::string model_fingerprint;  // 16 lowercase hex digits
  std::string software_version;   // "" = NULL
  std::string device_class;       // "" = NULL
  std::string accelerator;        // "" = NULL (CPU only)
  int64_t joined_unix_ms = 0;
  bool late_join = false;           // told to copy the state from a peer
  std::string state_source_island;  // the peer it copies from; "" = NULL (fresh start)
  std::optional<int64_t> state_source_step;
  std::optional<int64_t> state_source_fragment;
  // Set by an IslandLeftRecord; an admission is written without them (NULL while a member).
  std::optional<int64_t> left_unix_ms;
  std::string left_reason;  // "" = NULL

  bool operator==(const IslandRecord&) const = default;
};

// Sets left_unix_ms / left_reason of one admission.
struct IslandLeftRecord {
  std::string experiment_id;
  int64_t join_seq = 0;
  int64_t left_unix_ms = 0;
  std::string reason;  // "left: finished", "evicted: heartbeat lost", ...

  bool operator==(const IslandLeftRecord&) const = default;
};

// One membership epoch of one sync, written when it is resolved (or abandoned at shutdown).
struct IslandEpochRecord {
  std::string experiment_id;
  int64_t epoch = 0;
  int64_t step = 0;
  int64_t fragment = 0;
  int64_t attempt = 0;
  std::vector<std::string> members;  // ring order; stored comma-separated
  std::string outcome;               // "committed", "retried", "abandoned"
  std::string committed_hash;        // 16 hex digits; "" = NULL (not committed)
  int64_t num_applied = 0;
  int64_t num_failed = 0;
  int64_t num_mismatched = 0;
  std::optional<double> barrier_ms;  // first arrival at the barrier -> epoch formed
  int64_t formed_unix_ms = 0;
  int64_t resolved_unix_ms = 0;
  std::string reason;  // why retried/abandoned; "" = NULL

  bool operator==(const IslandEpochRecord&) const = default;
};

// One member of one epoch: what it reported and what it was told.
struct IslandSyncRecord {
  std::string experiment_id;
  int64_t epoch = 0;
  std::string island_id;
  int64_t join_seq = 0;
  int64_t step = 0;
  int64_t fragment = 0;
  int64_t ring_index = 0;
  std::string outcome;  // "applied" (majority hash), "mismatch" (applied, other hash), "failed", "missing"
  std::string verdict;  // "commit", "repair", "retry", "evicted"
  std::optional<double> inner_compute_ms;
  std::optional<double> exchange_ms;
  std::optional<double> wait_ms;
  std::optional<int64_t> bytes_sent;
  std::optional<int64_t> bytes_received;
  std::optional<int64_t> inner_steps;
  std::string state_hash;       // 16 hex digits; "" = NULL (not applied)
  std::string failure_reason;   // "" = NULL
  std::string vanished_island;  // "" = NULL
  std::string repair_source;    // island told to copy from; "" = NULL
  std::optional<int64_t> reported_unix_ms;
  std::optional<int64_t> repaired_unix_ms;  // set by an IslandRepairedRecord; NULL until then

  bool operator==(const IslandSyncRecord&) const = default;
};

// Sets repaired_unix_ms of a member's row: it copied the committed state and reported the right hash.
struct IslandRepairedRecord {
  std::string experiment_id;
  int64_t epoch = 0;
  std::string island_id;
  int64_t repaired_unix_ms = 0;

  bool operator==(const IslandRepairedRecord&) const = default;
};

using IslandRecordVariant =
    std::variant<IslandRecord, IslandLeftRecord, IslandEpochRecord, IslandSyncRecord, IslandRepairedRecord>;

// 16 lowercase hex digits, as every hash and fingerprint column stores them.
std::string HashHex(uint64_t value);

class IslandRecordWriter {
 public:
  // Opens `path` (created if missing), sets WAL / busy_timeout / foreign keys, migrates to the latest
  // schema, and starts the writer thread. Errors name the path.
  static absl::StatusOr<std::unique_ptr<IslandRecordWriter>> Open(const std::string& path, int busy_timeout_ms = 5000);
  ~IslandRecordWriter();  // Close(); an uncollected error is printed to stderr
  IslandRecordWriter(const IslandRecordWriter&) = delete;
  IslandRecordWriter& operator=(const IslandRecordWriter&) = delete;

  // Queues a record; never blocks on SQLite. FailedPrecondition after Close(). Thread-safe.
  absl::Status Enqueue(IslandRecordVariant record);
  // Waits until everything enqueued before is committed or dropped; the first error since the last
  // Flush/Close, OK if none.
  absl::Status Flush();
  // Flushes and stops the writer; idempotent.
  absl::Status Close();
  uint64_t written() const;

 private:
  struct Impl;
  explicit IslandRecordWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fl::instrumentation
