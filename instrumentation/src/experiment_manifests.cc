#include "fl/instrumentation/experiment_manifests.h"

#include <sqlite3.h>

#include <memory>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_columns.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/instrumentation/record_store.h"
#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation {

absl::Status WriteExperimentManifest(const std::string& db_path, const ExperimentManifestRecord& record) {
  {
    // Creates the database and brings it to this build's schema.
    absl::StatusOr<std::unique_ptr<RecordStore>> store = RecordStore::Open(db_path);
    if (!store.ok()) return store.status();
    if (absl::Status s = (*store)->Close(); !s.ok()) return s;
  }
  absl::StatusOr<sqlite::Database> db = sqlite::Database::Open(db_path, SQLITE_OPEN_READWRITE);
  if (!db.ok()) return db.status();
  if (absl::Status s = db->Exec("PRAGMA busy_timeout = 5000"); !s.ok()) return s;
  const RowTable<ExperimentManifestRecord>& table = ExperimentManifestsTable();
  absl::StatusOr<sqlite::Statement> st = db->Prepare(InsertSql(table));
  if (!st.ok()) return st.status();
  BindRow(*st, table, record);
  absl::StatusOr<bool> row = st->Step(fl::StrCat("insert into ", table.spec.name, " of ", db_path));
  if (!row.ok()) return row.status();
  return absl::OkStatus();
}

absl::StatusOr<ExperimentManifestRecord> ReadExperimentManifest(const std::string& db_path,
                                                                std::string_view experiment_id) {
  // A regular file (a FIFO would block SQLite's first read forever, /dev/zero never ends), named in the error.
  if (absl::Status s = CheckRecordsFile(db_path); !s.ok()) return s;
  absl::StatusOr<sqlite::Database> db = sqlite::Database::Open(db_path, SQLITE_OPEN_READONLY);
  if (!db.ok()) return db.status();
  (void)db->Exec("PRAGMA busy_timeout = 5000");
  const RowTable<ExperimentManifestRecord>& table = ExperimentManifestsTable();
  absl::StatusOr<int64_t> has_table = db->QueryInt(
      fl::StrCat("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = '", table.spec.name, "'"));
  if (!has_table.ok()) return has_table.status();
  if (*has_table == 0) {
    return absl::FailedPreconditionError(
        fl::StrCat("records database ", db_path, " has no ", table.spec.name,
                   " table (written by an older build, or not by fl-experiment); only experiments run with "
                   "fl-experiment can be replayed"));
  }
  // The table has had all its columns since it was created (v4): read as the newest schema.
  const std::string select = fl::StrCat("SELECT ", SelectList(table, LatestSchemaVersion()), " FROM ", table.spec.name);
  absl::StatusOr<sqlite::Statement> st =
      db->Prepare(experiment_id.empty() ? fl::StrCat(select, " ORDER BY created_unix_ms DESC LIMIT 1")
                                        : fl::StrCat(select, " WHERE experiment_id = ?1"));
  if (!st.ok()) return st.status();
  if (!experiment_id.empty()) st->BindText(1, experiment_id);
  absl::StatusOr<bool> row = st->Step("read the recorded manifest");
  if (!row.ok()) return row.status();
  if (*row) return ReadRow(*st, table);
  std::string known;
  absl::StatusOr<sqlite::Statement> ids =
      db->Prepare(fl::StrCat("SELECT experiment_id FROM ", table.spec.name, " ORDER BY created_unix_ms"));
  if (ids.ok()) {
    for (absl::StatusOr<bool> r = ids->Step("list"); r.ok() && *r; r = ids->Step("list")) {
      known = fl::StrCat(known, known.empty() ? "" : ", ", ids->ColumnText(0));
    }
  }
  return absl::NotFoundError(fl::StrCat("records database ", db_path, " has no recorded manifest for experiment '",
                                        experiment_id, "'; recorded: ", known.empty() ? "(none)" : known));
}

}  // namespace fl::instrumentation
