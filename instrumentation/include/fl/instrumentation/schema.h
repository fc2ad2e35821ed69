// The record store's schema, as an ordered list of migrations keyed by PRAGMA user_version.
//
// user_version N means "the schema of version N": migrations 1..N have been applied, or the file was created at
// version N from the column declarations (record_columns.h). Adding a schema change is adding one entry at the
// end of the list in schema.cc (version = previous + 1), declaring the same change in record_columns.cc, and
// documenting it in docs/records.md; never edit an entry that has shipped. Each migration runs in its own BEGIN
// IMMEDIATE transaction together with the user_version bump, so a failed migration leaves the database at the previous
// version.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation {

// PRAGMA application_id of a records database ("FLTB"), set with the first migration: lets the store refuse
// a file that belongs to another program instead of adding tables to it.
inline constexpr int64_t kRecordsApplicationId = 0x464C5442;

struct Migration {
  int version = 0;               // the user_version after this migration; 1, 2, 3, ... in order
  std::string_view description;  // one line, for errors and docs
  std::string_view sql;          // ;-separated statements; no BEGIN/COMMIT (the runner owns the transaction)
  // Table rebuilds (SQLite's 12-step ALTER TABLE procedure) need foreign key enforcement off while they run;
  // the runner turns it off outside the transaction, checks PRAGMA foreign_key_check before committing,
  // and turns it back on.
  bool foreign_keys_off = false;
};

// The migrations this code knows, in order.
std::span<const Migration> SchemaMigrations();
// The user_version this code writes and reads: the version of the last migration.
int LatestSchemaVersion();

// Brings `db` to the last version in `migrations` (SchemaMigrations() in production; tests pass their own).
// - an empty file (version 0) gets `newest_schema` in one step when it is given (in production
//   LatestSchemaSql(), the schema the migrations reach, generated from record_columns.h), else every migration;
// - a database already at that version is left untouched;
// - a database with a newer user_version is refused (FailedPrecondition naming both versions: upgrade
//   fl-server);
// - a file with another program's application_id, or with tables but no version, is refused;
// - an invalid list (versions not 1, 2, 3, ...) is an Internal error.
absl::Status MigrateSchema(sqlite::Database& db, std::span<const Migration> migrations,
                           std::string_view newest_schema = {});

// What RecordStore and IslandRecordWriter run on their write connection: a new file gets LatestSchemaSql(), an
// older one SchemaMigrations() from its version on.
absl::Status MigrateRecordsSchema(sqlite::Database& db);

// Checks, without changing anything, that `db` is at exactly the version `latest` (used by read-only
// connections, which cannot migrate).
absl::Status CheckSchemaVersion(sqlite::Database& db, int latest);

// The schema version of a records database that a read-only connection can read as it is: 1 to `latest`.
// FailedPrecondition naming the path and what to do for a file SQLite cannot read, another program's SQLite file
// (another application_id, or no version), and a newer version than `latest`.
absl::StatusOr<int> CheckReadableSchemaVersion(sqlite::Database& db, int latest);

}  // namespace fl::instrumentation
