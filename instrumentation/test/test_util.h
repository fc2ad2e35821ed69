// Helpers shared by the instrumentation tests: a scratch directory and record factories.
#pragma once

#include <sqlite3.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/records.h"
#include "fl/testing/scratch_dir.h"

namespace fl::instrumentation::testing_util {

// A fresh directory under testing::TempDir(), removed with everything in it on destruction.
using ScratchDir = fl::testing::ScratchDir;

// Runs `sql` on a plain connection of its own (to build files by hand); fails the test on error.
inline void ExecRaw(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(rc, SQLITE_OK) << (error != nullptr ? error : "") << " in: " << sql;
  sqlite3_free(error);
  sqlite3_close(db);
}

inline ExperimentRecord Experiment(const std::string& id) {
  ExperimentRecord e;
  e.id = id;
  e.name = "mnist-fedavg";
  e.started_unix_ms = 1'700'000'000'000;
  e.config_json = R"({"rounds":10})";
  e.software_version = "0.1.0";
  e.host = "aggregator";
  return e;
}

inline ClientRecord Client(const std::string& experiment_id, const std::string& client_id) {
  ClientRecord c;
  c.experiment_id = experiment_id;
  c.client_id = client_id;
  c.client_name = fl::StrCat("pi-", client_id);
  c.device_class = "rpi5";
  c.link_kind = "wifi";
  c.link_interface = "wlan0";
  c.cores = 4;
  c.memory_bytes = 8LL << 30;
  c.arch = "aarch64";
  c.joined_unix_ms = 1'700'000'000'100;
  return c;
}

inline RoundRecord Round(const std::string& experiment_id, int64_t round, int64_t attempt = 0,
                         RoundStatus status = RoundStatus::kCommitted) {
  RoundRecord r;
  r.experiment_id = experiment_id;
  r.round = round;
  r.attempt = attempt;
  r.status = status;
  if (status != RoundStatus::kCommitted) r.failure_reason = "too few updates";
  r.started_unix_ms = 1'700'000'001'000 + round * 1000;
  r.ended_unix_ms = r.started_unix_ms + 900;
  r.duration_ms = 900.5;
  r.aggregation_ms = 12.25;
  r.num_selected = 3;
  r.num_accepted = 2;
  r.num_late = 1;
  r.num_examples = 1200;
  if (status == RoundStatus::kCommitted) r.model_version = round + 1;
  r.train_loss = 0.5;
  return r;
}

inline ClientRoundRecord ClientRound(const std::string& experiment_id, int64_t round, int64_t attempt,
                                     const std::string& client_id) {
  ClientRoundRecord c;
  c.experiment_id = experiment_id;
  c.round = round;
  c.attempt = attempt;
  c.client_id = client_id;
  c.outcome = ClientOutcome::kOk;
  c.num_examples = 600;
  c.downlink_ms = 10.5;
  c.train_ms = 800;
  c.uplink_ms = 20;
  c.uplink_server_ms = 18.75;
  c.downlink_bytes = 1 << 20;
  c.uplink_bytes = 1 << 18;
  c.codec = "int8-blockwise";
  c.train_loss = 0.75;
  return c;
}

// Opens the store / a reader of `path`, failing the test (and returning null) on error.
inline std::unique_ptr<RecordStore> MustOpen(const std::string& path, RecordStoreOptions options = {}) {
  auto store = RecordStore::Open(path, std::move(options));
  EXPECT_TRUE(store.ok()) << store.status();
  return store.ok() ? *std::move(store) : nullptr;
}

inline std::unique_ptr<RecordReader> MustRead(const std::string& path) {
  auto reader = RecordReader::Open(path);
  EXPECT_TRUE(reader.ok()) << reader.status();
  return reader.ok() ? *std::move(reader) : nullptr;
}

inline int64_t Count(RecordReader& reader, const std::string& sql) {
  absl::StatusOr<int64_t> n = reader.QueryInt(sql);
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *n : -1;
}

}  // namespace fl::instrumentation::testing_util
