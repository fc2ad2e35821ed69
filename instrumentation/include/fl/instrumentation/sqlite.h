// Thin RAII wrappers over the SQLite C API, with errors as absl::Status.
//
// Every error names the database path and SQLite's own message, e.g.
//   records database /data/run.db: insert into rounds: UNIQUE constraint failed: rounds.experiment_id,
//   rounds.round (SQLITE_CONSTRAINT_UNIQUE)
// A Database or Statement is not safe for concurrent use; give each thread its own, or guard one with a mutex.
#pragma once

#include <sqlite3.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::instrumentation::sqlite {

// Maps an (extended) SQLite result code to the closest absl status code: UNIQUE/PRIMARY KEY -> AlreadyExists,
// FOREIGN KEY -> FailedPrecondition, other constraints -> InvalidArgument, BUSY/LOCKED -> Unavailable,
// CANTOPEN -> NotFound, CORRUPT/NOTADB -> DataLoss, FULL -> ResourceExhausted, READONLY/PERM -> PermissionDenied.
absl::StatusCode StatusCodeFor(int sqlite_code);

class Statement {
 public:
  Statement() = default;
  Statement(sqlite3_stmt* stmt, sqlite3* db, std::string path);
  Statement(Statement&& other) noexcept;
  Statement& operator=(Statement&& other) noexcept;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  ~Statement();

  sqlite3_stmt* get() const { return stmt_; }
  std::string_view sql() const;

  // Parameters are 1-based, as in SQLite. Bind errors (index out of range, out of memory) are kept and
  // returned by the next Step(), so a chain of binds needs no checks of its own.
  void BindInt64(int index, int64_t value);
  void BindDouble(int index, double value);
  void BindText(int index, std::string_view value);  // copied (SQLITE_TRANSIENT)
  void BindNull(int index);
  void BindOptionalInt64(int index, const std::optional<int64_t>& value);
  void BindOptionalDouble(int index, const std::optional<double>& value);
  // An empty string is stored as NULL: for text columns where "unknown" is a legitimate value.
  void BindTextOrNull(int index, std::string_view value);

  // The index of the named parameter (":name", including its prefix) for the Bind* calls; 0 when the statement
  // has none by that name, which the next Step() reports as a failed bind.
  int ParameterIndex(std::string_view name) const;

  // true: a row is ready; false: done. The error names the database path, `what` and SQLite's message.
  absl::StatusOr<bool> Step(std::string_view what);
  // Runs the statement to completion, discarding rows.
  absl::Status Run(std::string_view what);
  // Resets the statement and clears its bindings so that it can be reused.
  void Reset();

  int ColumnCount() const;
  bool ColumnIsNull(int column) const;  // 0-based, as in SQLite
  int64_t ColumnInt64(int column) const;
  double ColumnDouble(int column) const;
  std::string ColumnText(int column) const;  // "" for NULL
  std::optional<int64_t> ColumnOptionalInt64(int column) const;
  std::optional<double> ColumnOptionalDouble(int column) const;

 private:
  void NoteBind(int rc, int index);

  sqlite3_stmt* stmt_ = nullptr;
  sqlite3* db_ = nullptr;
  std::string path_;
  int bind_error_ = SQLITE_OK;
  int bind_error_index_ = 0;
};

class Database {
 public:
  // `flags` as for sqlite3_open_v2 (SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, SQLITE_OPEN_READONLY, ...).
  // Extended result codes are turned on.
  static absl::StatusOr<Database> Open(const std::string& path, int flags);

  Database() = default;
  Database(Database&& other) noexcept;
  Database& operator=(Database&& other) noexcept;
  Database(const Database&) = delete;
  Database& operator=(const Database&) = delete;
  ~Database();

  sqlite3* get() const { return db_; }
  const std::string& path() const { return path_; }
  bool is_open() const { return db_ != nullptr; }

  // Runs one or more ;-separated statements.
  absl::Status Exec(std::string_view sql);
  // `persistent`: a hint that the statement is kept and reused many times (SQLITE_PREPARE_PERSISTENT).
  absl::StatusOr<Statement> Prepare(std::string_view sql, bool persistent = false);
  // The first column of the first row of `sql` (e.g. "PRAGMA user_version"); NotFound when there is no row.
  absl::StatusOr<int64_t> QueryInt(std::string_view sql);
  absl::StatusOr<std::string> QueryText(std::string_view sql);
  // false while a transaction is open (sqlite3_get_autocommit == 0).
  bool in_transaction() const;

  // The status for a failed call with result code `rc`: "records database <path>: <what>: <message> (<code>)".
  absl::Status Error(std::string_view what, int rc) const;

 private:
  Database(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}

  sqlite3* db_ = nullptr;
  std::string path_;
};

}  // namespace fl::instrumentation::sqlite
