#include "fl/instrumentation/sqlite.h"

#include <algorithm>
#include <utility>

#include "fl/core/str_cat.h"

namespace fl::instrumentation::sqlite {
namespace {

absl::Status MakeError(std::string_view path, std::string_view what, int rc, std::string_view message) {
  const char* code_name = sqlite3_errstr(rc);
  return absl::Status(StatusCodeFor(rc), fl::StrCat("records database ", path, ": ", what, ": ", message, " (",
                                                    code_name != nullptr ? code_name : "?", ", code ", rc, ")"));
}

}  // namespace

absl::StatusCode StatusCodeFor(int sqlite_code) {
  switch (sqlite_code) {
    case SQLITE_OK: return absl::StatusCode::kOk;
    case SQLITE_CONSTRAINT_UNIQUE:
    case SQLITE_CONSTRAINT_PRIMARYKEY: return absl::StatusCode::kAlreadyExists;
    case SQLITE_CONSTRAINT_FOREIGNKEY: return absl::StatusCode::kFailedPrecondition;
    default: break;
  }
  switch (sqlite_code & 0xff) {
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG: return absl::StatusCode::kInvalidArgument;
    case SQLITE_BUSY:
    case SQLITE_LOCKED: return absl::StatusCode::kUnavailable;
    case SQLITE_CANTOPEN: return absl::StatusCode::kNotFound;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return absl::StatusCode::kDataLoss;
    case SQLITE_FULL:
    case SQLITE_NOMEM: return absl::StatusCode::kResourceExhausted;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_AUTH: return absl::StatusCode::kPermissionDenied;
    case SQLITE_ABORT:
    case SQLITE_INTERRUPT: return absl::StatusCode::kAborted;
    default: return absl::StatusCode::kInternal;
  }
}

// ---- Statement -------------------------------------------------------------------------------------------

Statement::Statement(sqlite3_stmt* stmt, sqlite3* db, std::string path)
    : stmt_(stmt), db_(db), path_(std::move(path)) {}

Statement::Statement(Statement&& other) noexcept
    : stmt_(std::exchange(other.stmt_, nullptr)),
      db_(std::exchange(other.db_, nullptr)),
      path_(std::move(other.path_)),
      bind_error_(std::exchange(other.bind_error_, SQLITE_OK)),
      bind_error_index_(other.bind_error_index_) {}

Statement& Statement::operator=(Statement&& other) noexcept {
  if (this != &other) {
    if (stmt_ != nullptr) sqlite3_finalize(stmt_);
    stmt_ = std::exchange(other.stmt_, nullptr);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
    bind_error_ = std::exchange(other.bind_error_, SQLITE_OK);
    bind_error_index_ = other.bind_error_index_;
  }
  return *this;
}

Statement::~Statement() {
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

std::string_view Statement::sql() const {
  const char* s = stmt_ != nullptr ? sqlite3_sql(stmt_) : nullptr;
  return s != nullptr ? std::string_view(s) : std::string_view();
}

void Statement::NoteBind(int rc, int index) {
  if (rc != SQLITE_OK && bind_error_ == SQLITE_OK) {
    bind_error_ = rc;
    bind_error_index_ = index;
  }
}

void Statement::BindInt64(int index, int64_t value) { NoteBind(sqlite3_bind_int64(stmt_, index, value), index); }
void Statement::BindDouble(int index, double value) { NoteBind(sqlite3_bind_double(stmt_, index, value), index); }
void Statement::BindText(int index, std::string_view value) {
  NoteBind(sqlite3_bind_text64(stmt_, index, value.data(), value.size(), SQLITE_TRANSIENT, SQLITE_UTF8), index);
}
void Statement::BindNull(int index) { NoteBind(sqlite3_bind_null(stmt_, index), index); }
void Statement::BindOptionalInt64(int index, const std::optional<int64_t>& value) {
  if (value.has_value()) {
    BindInt64(index, *value);
  } else {
    BindNull(index);
  }
}
void Statement::BindOptionalDouble(int index, const std::optional<double>& value) {
  if (value.has_value()) {
    BindDouble(index, *value);
  } else {
    BindNull(index);
  }
}
void Statement::BindTextOrNull(int index, std::string_view value) {
  if (value.empty()) {
    BindNull(index);
  } else {
    BindText(index, value);
  }
}

int Statement::ParameterIndex(std::string_view name) const {
  return stmt_ != nullptr ? sqlite3_bind_parameter_index(stmt_, std::string(name).c_str()) : 0;
}

absl::StatusOr<bool> Statement::Step(std::string_view what) {
  if (bind_error_ != SQLITE_OK) {
    const int rc = bind_error_;
    bind_error_ = SQLITE_OK;
    return MakeError(path_, what, rc, fl::StrCat("binding parameter ", bind_error_index_, " failed"));
  }
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  // sqlite3_errmsg still describes this failure: nothing else ran on the connection in between.
  return MakeError(path_, what, sqlite3_extended_errcode(db_), sqlite3_errmsg(db_));
}

absl::Status Statement::Run(std::string_view what) {
  while (true) {
    absl::StatusOr<bool> row = Step(what);
    if (!row.ok()) return row.status();
    if (!*row) return absl::OkStatus();
  }
}

void Statement::Reset() {
  sqlite3_reset(stmt_);
  sqlite3_clear_bindings(stmt_);
  bind_error_ = SQLITE_OK;
}

int Statement::ColumnCount() const { return sqlite3_column_count(stmt_); }
bool Statement::ColumnIsNull(int column) const { return sqlite3_column_type(stmt_, column) == SQLITE_NULL; }
int64_t Statement::ColumnInt64(int column) const { return sqlite3_column_int64(stmt_, column); }
double Statement::ColumnDouble(int column) const { return sqlite3_column_double(stmt_, column); }
std::string Statement::ColumnText(int column) const {
  const unsigned char* text = sqlite3_column_text(stmt_, column);
  if (text == nullptr) return std::string();
  return std::string(reinterpret_cast<const char*>(text), static_cast<size_t>(sqlite3_column_bytes(stmt_, column)));
}
std::optional<int64_t> Statement::ColumnOptionalInt64(int column) const {
  if (ColumnIsNull(column)) return std::nullopt;
  return ColumnInt64(column);
}
std::optional<double> Statement::ColumnOptionalDouble(int column) const {
  if (ColumnIsNull(column)) return std::nullopt;
  return ColumnDouble(column);
}

// ---- Database --------------------------------------------------------------------------------------------

absl::StatusOr<Database> Database::Open(const std::string& path, int flags) {
  sqlite3* db = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &db, flags, nullptr);
  if (rc != SQLITE_OK) {
    std::string message = db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    const int code = db != nullptr ? sqlite3_extended_errcode(db) : rc;
    sqlite3_close_v2(db);  // a handle is returned even on failure (nullptr is harmless)
    return MakeError(path, "open", code, message);
  }
  sqlite3_extended_result_codes(db, 1);
  return Database(db, path);
}

Database::Database(Database&& other) noexcept : db_(std::exchange(other.db_, nullptr)), path_(std::move(other.path_)) {}

Database& Database::operator=(Database&& other) noexcept {
  if (this != &other) {
    if (db_ != nullptr) sqlite3_close_v2(db_);
    db_ = std::exchange(other.db_, nullptr);
    path_ = std::move(other.path_);
  }
  return *this;
}

Database::~Database() {
  // close_v2 defers the close until outstanding statements are finalized, so destruction order of a
  // Database and its Statements does not matter.
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

absl::Status Database::Exec(std::string_view sql) {
  const std::string text(sql);
  char* message = nullptr;
  const int rc = sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &message);
  if (rc == SQLITE_OK) return absl::OkStatus();
  std::string what = message != nullptr ? message : sqlite3_errmsg(db_);
  sqlite3_free(message);
  std::string_view head = sql.substr(std::min(sql.size(), sql.find_first_not_of(" \t\r\n")));
  head = head.substr(0, head.find('\n'));
  if (head.size() > 60) head = head.substr(0, 60);
  return MakeError(path_, fl::StrCat("'", head, "'"), sqlite3_extended_errcode(db_), what);
}

absl::StatusOr<Statement> Database::Prepare(std::string_view sql, bool persistent) {
  sqlite3_stmt* stmt = nullptr;
  const int rc = sqlite3_prepare_v3(db_, sql.data(), static_cast<int>(sql.size()),
                                    persistent ? SQLITE_PREPARE_PERSISTENT : 0, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    return MakeError(path_, fl::StrCat("prepare '", sql.substr(0, 80), "'"), sqlite3_extended_errcode(db_),
                     sqlite3_errmsg(db_));
  }
  return Statement(stmt, db_, path_);
}

absl::StatusOr<int64_t> Database::QueryInt(std::string_view sql) {
  absl::StatusOr<Statement> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step(sql);
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(fl::StrCat("records database ", path_, ": '", sql, "' returned no row"));
  return stmt->ColumnInt64(0);
}

absl::StatusOr<std::string> Database::QueryText(std::string_view sql) {
  absl::StatusOr<Statement> stmt = Prepare(sql);
  if (!stmt.ok()) return stmt.status();
  absl::StatusOr<bool> row = stmt->Step(sql);
  if (!row.ok()) return row.status();
  if (!*row) return absl::NotFoundError(fl::StrCat("records database ", path_, ": '", sql, "' returned no row"));
  return stmt->ColumnText(0);
}

bool Database::in_transaction() const { return db_ != nullptr && sqlite3_get_autocommit(db_) == 0; }

absl::Status Database::Error(std::string_view what, int rc) const {
  return MakeError(path_, what, rc, db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc));
}

}  // namespace fl::instrumentation::sqlite
