// The manifests table through its declared columns: what fl-experiment writes is what replay reads back, the
// newest run when no experiment is named, and a missing experiment named with those that are recorded.
#include "fl/instrumentation/experiment_manifests.h"

#include <string>

#include <gtest/gtest.h>

#include "fl/instrumentation/record_columns.h"
#include "test_util.h"

namespace fl::instrumentation {
namespace {

using testing_util::ScratchDir;

ExperimentManifestRecord Manifest(const std::string& id, int64_t created_unix_ms) {
  ExperimentManifestRecord r;
  r.experiment_id = id;
  r.manifest_path = "experiments/quickstart.yaml";
  r.manifest_yaml = "name: quickstart\n";
  r.resolved_json = R"({"name":"quickstart"})";
  r.seed = -3;  // a uint64 seed past INT64_MAX is stored as its bit pattern
  r.backend = "userspace";
  r.software_version = "0.1.0";
  r.created_unix_ms = created_unix_ms;
  return r;
}

TEST(ExperimentManifestsTest, WhatIsWrittenIsReadBackColumnForColumn) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  ExperimentManifestRecord original = Manifest("run-1", 100);
  ExperimentManifestRecord replay = Manifest("run-2", 200);
  replay.replay_of = "run-1";
  ASSERT_TRUE(WriteExperimentManifest(path, original).ok());
  ASSERT_TRUE(WriteExperimentManifest(path, replay).ok());

  absl::StatusOr<ExperimentManifestRecord> one = ReadExperimentManifest(path, "run-1");
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, original);  // replay_of "" stored as NULL and read back as ""
  absl::StatusOr<ExperimentManifestRecord> newest = ReadExperimentManifest(path, "");
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(*newest, replay);
}

TEST(ExperimentManifestsTest, AMissingExperimentIsNotFoundNamingTheRecordedOnes) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  ASSERT_TRUE(WriteExperimentManifest(path, Manifest("run-1", 100)).ok());
  absl::StatusOr<ExperimentManifestRecord> r = ReadExperimentManifest(path, "run-9");
  ASSERT_TRUE(absl::IsNotFound(r.status())) << r.status();
  EXPECT_NE(std::string(r.status().message()).find("'run-9'; recorded: run-1"), std::string::npos) << r.status();
}

TEST(ExperimentManifestsTest, TheSameIdTwiceIsRefused) {
  ScratchDir dir;
  const std::string path = dir.File("records.db");
  ASSERT_TRUE(WriteExperimentManifest(path, Manifest("run-1", 100)).ok());
  EXPECT_FALSE(WriteExperimentManifest(path, Manifest("run-1", 200)).ok());  // experiment_id is the primary key
}

TEST(ExperimentManifestsTest, TheTableIsDeclaredWithTheRecordColumns) {
  const TableSpec* table = FindRecordTable("experiment_manifests");
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table, &ExperimentManifestsTable().spec);
  EXPECT_EQ(InsertSql(ExperimentManifestsTable()),
            "INSERT INTO experiment_manifests (experiment_id, manifest_path, manifest_yaml, resolved_json, seed, "
            "backend, software_version, replay_of, created_unix_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)");
}

}  // namespace
}  // namespace fl::instrumentation
