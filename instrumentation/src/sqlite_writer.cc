#include "sqlite_writer.h"

#include "fl/core/str_cat.h"
#include "fl/instrumentation/schema.h"

namespace fl::instrumentation::internal {

absl::StatusOr<sqlite::Database> OpenWriteConnection(const std::string& path, int busy_timeout_ms) {
  if (path.empty()) return absl::InvalidArgumentError("records database: empty path");
  absl::StatusOr<sqlite::Database> opened =
      sqlite::Database::Open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX);
  if (!opened.ok()) return opened.status();
  sqlite::Database db = *std::move(opened);

  // busy_timeout first, so that switching the journal mode and migrating wait for other connections' locks.
  if (absl::Status s = db.Exec(fl::StrCat("PRAGMA busy_timeout = ", std::max(busy_timeout_ms, 0))); !s.ok()) return s;
  absl::StatusOr<std::string> mode = db.QueryText("PRAGMA journal_mode = WAL");
  if (!mode.ok()) return mode.status();
  if (*mode != "wal") {
    return absl::FailedPreconditionError(
        fl::StrCat("records database ", path, ": journal_mode=WAL is not available here (SQLite kept '", *mode,
                   "'); records need a database file on a local filesystem (not :memory:, not a network share)"));
  }
  if (absl::Status s = db.Exec("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON"); !s.ok()) return s;
  absl::StatusOr<int64_t> foreign_keys = db.QueryInt("PRAGMA foreign_keys");
  if (!foreign_keys.ok()) return foreign_keys.status();
  if (*foreign_keys != 1) {
    return absl::FailedPreconditionError(fl::StrCat(
        "records database ", path, ": this SQLite build cannot enforce foreign keys (PRAGMA foreign_keys stays 0)"));
  }
  if (absl::Status s = MigrateRecordsSchema(db); !s.ok()) return s;
  return db;
}

absl::Status PrepareStatements(sqlite::Database& db, std::initializer_list<StatementSql> statements) {
  for (const StatementSql& e : statements) {
    absl::StatusOr<sqlite::Statement> prepared = db.Prepare(e.sql, /*persistent=*/true);
    if (!prepared.ok()) return prepared.status();
    *e.statement = *std::move(prepared);
  }
  return absl::OkStatus();
}

absl::Status RunStatement(sqlite::Database& db, sqlite::Statement& statement, std::string_view what,
                          bool expect_change) {
  absl::Status s = statement.Run(what);
  statement.Reset();
  if (s.ok() && expect_change && sqlite3_changes(db.get()) == 0) {
    return absl::NotFoundError(fl::StrCat("records database ", db.path(), ": ", what, ": no such row"));
  }
  return s;
}

namespace {

void RollbackIfOpen(sqlite::Database& db) {
  if (db.in_transaction()) (void)db.Exec("ROLLBACK");
}

}  // namespace

BatchResult WriteBatch(sqlite::Database& db, size_t count, absl::FunctionRef<absl::Status(size_t)> write_one,
                       absl::FunctionRef<absl::Status(size_t, const absl::Status&)> annotate) {
  BatchResult result;
  if (db.Exec("BEGIN IMMEDIATE").ok()) {
    bool transaction_lost = false;
    for (size_t i = 0; i < count; ++i) {
      absl::Status s = write_one(i);
      if (s.ok()) continue;
      if (!db.in_transaction()) {
        transaction_lost = true;
        break;
      }
      result.errors.push_back(std::move(s));
    }
    if (!transaction_lost && db.Exec("COMMIT").ok()) return result;
    RollbackIfOpen(db);
  }
  result.errors.clear();
  result.fell_back = true;
  for (size_t i = 0; i < count; ++i) {
    if (absl::Status s = db.Exec("BEGIN IMMEDIATE"); !s.ok()) {
      result.errors.push_back(annotate(i, s));
      continue;
    }
    absl::Status s = write_one(i);
    if (s.ok()) {
      s = db.Exec("COMMIT");
      if (!s.ok()) s = annotate(i, s);
    }
    if (!s.ok()) {
      RollbackIfOpen(db);
      result.errors.push_back(std::move(s));
    }
  }
  return result;
}

}  // namespace fl::instrumentation::internal
