// The columns of every records table, declared once (docs/records.md has what each one means).
//
// Each table of the newest schema is one TableSpec: its columns in order (name, SQL type, NOT NULL, the rest of
// the column definition, the schema version whose migration added it), its table constraints and its indexes.
// A table that a record struct fills is a RowTable<Row>, which adds to each column how to bind it from the struct
// and read it back into one. Everything else comes from these declarations:
//   - the newest schema's DDL (LatestSchemaSql(): a new database is created from it in one step; a database an
//     older build wrote reaches the same schema through the migrations of schema.cc, which stay as they shipped;
//     instrumentation_schema_test checks that both end alike, column by column, constraint by constraint);
//   - the INSERT, upsert and UPDATE statements of RecordStore and IslandRecordWriter and their binds (parameter
//     i + 1 is the i-th column or parameter of the declaration: no index is kept by hand);
//   - RecordReader's SELECT lists and row reads (a column newer than an old file reads as NULL).
//
// Adding a column: append it to its table here with the new schema version, add the migration that adds it to
// older files (schema.cc), and the field to the record struct (records.h) when a struct carries it.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "fl/instrumentation/experiment_manifests.h"
#include "fl/instrumentation/island_records.h"
#include "fl/instrumentation/records.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::instrumentation {

enum class SqlType { kInteger, kReal, kText };
std::string_view SqlTypeName(SqlType type);  // "INTEGER", "REAL", "TEXT"

// One column as the schema declares it.
struct ColumnSpec {
  std::string name;
  SqlType type = SqlType::kText;
  bool not_null = false;
  // The rest of the column definition after the type and NOT NULL: PRIMARY KEY, DEFAULT, CHECK, REFERENCES.
  std::string constraints;
  int since_version = 1;  // the schema version whose migration added the column
};

// "name TYPE [NOT NULL] [constraints]": the column's definition in CREATE TABLE.
std::string ColumnDefinition(const ColumnSpec& column);

// One table of the newest schema.
struct TableSpec {
  std::string name;
  int since_version = 1;                 // the schema version whose migration created the table
  std::vector<ColumnSpec> columns;       // in the order of the table (the order of the migrations that added them)
  std::vector<std::string> constraints;  // table constraints, in order: PRIMARY KEY (...), FOREIGN KEY ..., CHECK
  std::vector<std::string> indexes;      // complete CREATE [UNIQUE] INDEX statements

  // nullptr when the table has no such column.
  const ColumnSpec* Find(std::string_view column) const;
};

// CREATE TABLE for the table as the newest schema has it.
std::string CreateTableSql(const TableSpec& table);

// Every table of the newest schema, parents before the tables that reference them.
std::span<const TableSpec* const> RecordTables();
// nullptr for a name that is no records table.
const TableSpec* FindRecordTable(std::string_view name);
// The newest schema: every table's CREATE TABLE and CREATE INDEX statements, ;-separated.
std::string LatestSchemaSql();

// ---- binding record structs ---------------------------------------------------------------------------------

// The stored names of an enumeration, for its column's CHECK and its binds and reads.
template <class Enum>
struct EnumTraits;
template <>
struct EnumTraits<ExperimentStatus> {
  static constexpr std::array kValues = {ExperimentStatus::kRunning, ExperimentStatus::kFinished,
                                         ExperimentStatus::kFailed, ExperimentStatus::kAborted};
  static std::string_view Name(ExperimentStatus v) { return ExperimentStatusName(v); }
  static absl::StatusOr<ExperimentStatus> Parse(std::string_view s) { return ParseExperimentStatus(s); }
};
template <>
struct EnumTraits<RoundStatus> {
  static constexpr std::array kValues = {RoundStatus::kCommitted, RoundStatus::kFailed, RoundStatus::kAborted};
  static std::string_view Name(RoundStatus v) { return RoundStatusName(v); }
  static absl::StatusOr<RoundStatus> Parse(std::string_view s) { return ParseRoundStatus(s); }
};
template <>
struct EnumTraits<ClientOutcome> {
  static constexpr std::array kValues = {ClientOutcome::kOk,       ClientOutcome::kLate,      ClientOutcome::kDropped,
                                         ClientOutcome::kRejected, ClientOutcome::kCancelled, ClientOutcome::kFolded};
  static std::string_view Name(ClientOutcome v) { return ClientOutcomeName(v); }
  static absl::StatusOr<ClientOutcome> Parse(std::string_view s) { return ParseClientOutcome(s); }
};
template <>
struct EnumTraits<ClientEventKind> {
  static constexpr std::array kValues = {ClientEventKind::kReportRefused, ClientEventKind::kUploadRevoked,
                                         ClientEventKind::kInitialModelReasked, ClientEventKind::kSessionClosed};
  static std::string_view Name(ClientEventKind v) { return ClientEventKindName(v); }
  static absl::StatusOr<ClientEventKind> Parse(std::string_view s) { return ParseClientEventKind(s); }
};
template <>
struct EnumTraits<SecurityRefusal> {
  static constexpr std::array kValues = {
      SecurityRefusal::kNameMismatch, SecurityRefusal::kWrongIdentity,  SecurityRefusal::kRevokedCertificate,
      SecurityRefusal::kBadToken,     SecurityRefusal::kJoinRate,       SecurityRefusal::kSessionLimit,
      SecurityRefusal::kUploadLimit,  SecurityRefusal::kStreamDeadline, SecurityRefusal::kSecAgg};
  static std::string_view Name(SecurityRefusal v) { return SecurityRefusalName(v); }
  static absl::StatusOr<SecurityRefusal> Parse(std::string_view s) { return ParseSecurityRefusal(s); }
};
template <>
struct EnumTraits<SecAggStage> {
  static constexpr std::array kValues = {SecAggStage::kAdvertiseKeys, SecAggStage::kShareKeys,
                                         SecAggStage::kMaskedUpload, SecAggStage::kUnmask};
  static std::string_view Name(SecAggStage v) { return SecAggStageName(v); }
  static absl::StatusOr<SecAggStage> Parse(std::string_view s) { return ParseSecAggStage(s); }
};
template <>
struct EnumTraits<SecAggStageOutcome> {
  static constexpr std::array kValues = {SecAggStageOutcome::kOk, SecAggStageOutcome::kDropped,
                                         SecAggStageOutcome::kRefused};
  static std::string_view Name(SecAggStageOutcome v) { return SecAggStageOutcomeName(v); }
  static absl::StatusOr<SecAggStageOutcome> Parse(std::string_view s) { return ParseSecAggStageOutcome(s); }
};

// "CHECK (column IN ('a', 'b'))" for an enumeration's stored names.
template <class Enum>
std::string EnumCheck(std::string_view column) {
  std::string names;
  for (Enum v : EnumTraits<Enum>::kValues) {
    names += names.empty() ? "'" : ", '";
    names += EnumTraits<Enum>::Name(v);
    names += "'";
  }
  return std::string("CHECK (").append(column).append(" IN (").append(names).append("))");
}

namespace columns_internal {

template <class T>
struct IsOptional : std::false_type {};
template <class T>
struct IsOptional<std::optional<T>> : std::true_type {};

template <class MemberPointer>
struct Member;
template <class R, class F>
struct Member<F R::*> {
  using Row = R;
  using Field = F;
};

template <class T>
constexpr SqlType SqlTypeOf() {
  using V = typename std::conditional_t<IsOptional<T>::value, T, std::optional<T>>::value_type;
  if constexpr (std::is_same_v<V, double>) {
    return SqlType::kReal;
  } else if constexpr (std::is_same_v<V, int64_t> || std::is_same_v<V, bool>) {
    return SqlType::kInteger;
  } else {
    static_assert(std::is_same_v<V, std::string> || std::is_enum_v<V>, "no column type for this member type");
    return SqlType::kText;
  }
}

}  // namespace columns_internal

// Binds `value` as parameter `index` of a column declared as `column`: integers, reals, bools (0/1) and
// enumerations (their stored names) as themselves, std::nullopt as NULL, text as itself where the column is NOT
// NULL and "" as NULL where it is nullable (docs/records.md: optional text stores NULL for "unknown").
template <class T>
void BindValue(sqlite::Statement& st, int index, const T& value, const ColumnSpec& column) {
  if constexpr (std::is_same_v<T, bool>) {
    st.BindInt64(index, value ? 1 : 0);
  } else if constexpr (std::is_same_v<T, int64_t>) {
    st.BindInt64(index, value);
  } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
    st.BindOptionalInt64(index, value);
  } else if constexpr (std::is_same_v<T, double>) {
    st.BindDouble(index, value);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    st.BindOptionalDouble(index, value);
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (column.not_null) {
      st.BindText(index, value);
    } else {
      st.BindTextOrNull(index, value);
    }
  } else {
    static_assert(std::is_enum_v<T>, "no binding for this member type");
    st.BindText(index, EnumTraits<T>::Name(value));
  }
}

// Reads result column `column` into `out` (NULL: std::nullopt, or "" for text); an enumeration's unknown name is
// an error naming it.
template <class T>
absl::Status ReadValue(const sqlite::Statement& st, int column, T& out) {
  if constexpr (std::is_same_v<T, bool>) {
    out = st.ColumnInt64(column) != 0;
  } else if constexpr (std::is_same_v<T, int64_t>) {
    out = st.ColumnInt64(column);
  } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
    out = st.ColumnOptionalInt64(column);
  } else if constexpr (std::is_same_v<T, double>) {
    out = st.ColumnDouble(column);
  } else if constexpr (std::is_same_v<T, std::optional<double>>) {
    out = st.ColumnOptionalDouble(column);
  } else if constexpr (std::is_same_v<T, std::string>) {
    out = st.ColumnText(column);
  } else {
    static_assert(std::is_enum_v<T>, "no reading for this member type");
    absl::StatusOr<T> parsed = EnumTraits<T>::Parse(st.ColumnText(column));
    if (!parsed.ok()) return parsed.status();
    out = *parsed;
  }
  return absl::OkStatus();
}

// One column of a table filled from `Row`, or one parameter of a statement that binds a `Row`.
template <class Row>
struct Column {
  using BindFn = void (*)(sqlite::Statement& st, int index, const Row& row, const ColumnSpec& column);
  using ReadFn = absl::Status (*)(const sqlite::Statement& st, int column, Row& row);
  ColumnSpec spec;
  BindFn bind = nullptr;  // nullptr: not written from Row (the database fills it: client_events.id, security_events.id)
  ReadFn read = nullptr;  // nullptr: not read back into Row (derived: island_epochs.num_members)
};

// The column `name` holding member M of its struct. The SQL type follows the member's type (int64_t and bool:
// INTEGER, double: REAL, std::string and enumerations: TEXT, with a CHECK on an enumeration's names after
// `constraints`); NOT NULL unless the member is a std::optional. For nullable text see OptText.
template <auto M>
Column<typename columns_internal::Member<decltype(M)>::Row> Col(std::string_view name,
                                                                std::string_view constraints = {},
                                                                int since_version = 1) {
  using Row = typename columns_internal::Member<decltype(M)>::Row;
  using Field = typename columns_internal::Member<decltype(M)>::Field;
  ColumnSpec spec{std::string(name), columns_internal::SqlTypeOf<Field>(), !columns_internal::IsOptional<Field>::value,
                  std::string(constraints), since_version};
  if constexpr (std::is_enum_v<Field>) {
    spec.constraints =
        spec.constraints.empty() ? EnumCheck<Field>(name) : spec.constraints + " " + EnumCheck<Field>(name);
  }
  return {std::move(spec),
          [](sqlite::Statement& st, int index, const Row& row, const ColumnSpec& column) {
            BindValue(st, index, row.*M, column);
          },
          [](const sqlite::Statement& st, int column, Row& row) { return ReadValue(st, column, row.*M); }};
}

// A nullable TEXT column holding the std::string member M: "" is stored as NULL and NULL reads as "".
template <auto M>
Column<typename columns_internal::Member<decltype(M)>::Row> OptText(std::string_view name,
                                                                    std::string_view constraints = {},
                                                                    int since_version = 1) {
  static_assert(std::is_same_v<typename columns_internal::Member<decltype(M)>::Field, std::string>);
  auto column = Col<M>(name, constraints, since_version);
  column.spec.not_null = false;
  return column;
}

// A table filled from `Row`: its TableSpec and, column by column, how Row is bound and read.
template <class Row>
struct RowTable {
  RowTable(std::string_view name, int since_version, std::vector<Column<Row>> row_columns,
           std::vector<std::string> constraints = {}, std::vector<std::string> indexes = {})
      : columns(std::move(row_columns)) {
    spec.name = std::string(name);
    spec.since_version = since_version;
    for (const Column<Row>& c : columns) spec.columns.push_back(c.spec);
    spec.constraints = std::move(constraints);
    spec.indexes = std::move(indexes);
  }

  TableSpec spec;
  std::vector<Column<Row>> columns;  // columns[i].spec == spec.columns[i]
};

// The tables a record struct fills (records.h, island_records.h).
const RowTable<ExperimentRecord>& ExperimentsTable();
const RowTable<ClientRecord>& ClientsTable();
const RowTable<RoundRecord>& RoundsTable();
const RowTable<ClientRoundRecord>& ClientRoundsTable();
const RowTable<EvaluationRecord>& EvaluationsTable();
const RowTable<CheckpointRecord>& CheckpointsTable();
const RowTable<ClientEventRecord>& ClientEventsTable();
const RowTable<SecurityEventRecord>& SecurityEventsTable();
const RowTable<SecAggStageRecord>& SecAggStagesTable();  // schema v11
const RowTable<IslandRecord>& IslandsTable();
const RowTable<IslandEpochRecord>& IslandEpochsTable();
const RowTable<IslandSyncRecord>& IslandSyncsTable();
// What fl-experiment ran, for replay (experiment_manifests.h writes and reads it).
const RowTable<ExperimentManifestRecord>& ExperimentManifestsTable();

// ---- statements ---------------------------------------------------------------------------------------------

// INSERT INTO t (every bound column) VALUES (?1, ...): parameter i + 1 binds the i-th bound column. With
// `upsert_keys`, ON CONFLICT (keys) DO UPDATE SET every other bound column not in `keep` to the new row's value.
template <class Row>
std::string InsertSql(const RowTable<Row>& table, std::vector<std::string_view> upsert_keys = {},
                      std::vector<std::string_view> keep = {});

// Binds every bound column of `row` in the order of InsertSql.
template <class Row>
void BindRow(sqlite::Statement& st, const RowTable<Row>& table, const Row& row) {
  int index = 0;
  for (const Column<Row>& c : table.columns) {
    if (c.bind != nullptr) c.bind(st, ++index, row, c.spec);
  }
}

// An UPDATE of some columns of the rows a key matches, from a struct `Row` that carries the new values and the
// key. Each parameter is built with Col/OptText on Row's member and names the table's column it sets or matches;
// it is bound as that column is declared (e.g. "" as NULL in a nullable text column).
template <class Row>
struct UpdateSpec {
  const TableSpec* table = nullptr;
  std::vector<Column<Row>> set;    // SET column = ?
  std::vector<Column<Row>> where;  // WHERE column = ? AND ...
};

// UPDATE t SET a = ?1, ... WHERE k = ?n AND ...; parameters in the order of `set`, then `where`. Internal error
// for a parameter that names no column of the table.
template <class Row>
absl::StatusOr<std::string> UpdateSql(const UpdateSpec<Row>& update);

// Binds `row` in the order of UpdateSql (the spec was checked by UpdateSql).
template <class Row>
void BindUpdate(sqlite::Statement& st, const UpdateSpec<Row>& update, const Row& row) {
  int index = 0;
  for (const auto* list : {&update.set, &update.where}) {
    for (const Column<Row>& p : *list) {
      const ColumnSpec* column = update.table->Find(p.spec.name);
      p.bind(st, ++index, row, column != nullptr ? *column : p.spec);
    }
  }
}

// "a, b, NULL AS c": the read columns of `table` for a file at `schema_version` (a column added after it reads as
// NULL). Read with ReadRow.
template <class Row>
std::string SelectList(const RowTable<Row>& table, int schema_version);

// Reads the columns of SelectList from the current row of `st`.
template <class Row>
absl::StatusOr<Row> ReadRow(const sqlite::Statement& st, const RowTable<Row>& table) {
  Row row{};
  int index = 0;
  for (const Column<Row>& c : table.columns) {
    if (c.read == nullptr) continue;
    if (absl::Status s = c.read(st, index++, row); !s.ok()) {
      return absl::Status(
          s.code(),
          std::string(table.spec.name).append(".").append(c.spec.name).append(": ").append(std::string(s.message())));
    }
  }
  return row;
}

// ---- definitions of the statement templates ----------------------------------------------------------------

template <class Row>
std::string InsertSql(const RowTable<Row>& table, std::vector<std::string_view> upsert_keys,
                      std::vector<std::string_view> keep) {
  std::string names, values, updates;
  int index = 0;
  auto listed = [](const std::vector<std::string_view>& list, std::string_view name) {
    for (std::string_view n : list) {
      if (n == name) return true;
    }
    return false;
  };
  for (const Column<Row>& c : table.columns) {
    if (c.bind == nullptr) continue;
    ++index;
    names += (index == 1 ? "" : ", ") + c.spec.name;
    values += (index == 1 ? "?" : ", ?") + std::to_string(index);
    if (!upsert_keys.empty() && !listed(upsert_keys, c.spec.name) && !listed(keep, c.spec.name)) {
      updates += (updates.empty() ? "" : ", ") + c.spec.name + " = excluded." + c.spec.name;
    }
  }
  std::string sql = "INSERT INTO " + table.spec.name + " (" + names + ") VALUES (" + values + ")";
  if (!upsert_keys.empty()) {
    std::string keys;
    for (std::string_view k : upsert_keys) keys.append(keys.empty() ? "" : ", ").append(k);
    sql += " ON CONFLICT (" + keys + ") DO UPDATE SET " + updates;
  }
  return sql;
}

template <class Row>
absl::StatusOr<std::string> UpdateSql(const UpdateSpec<Row>& update) {
  std::string set, where;
  int index = 0;
  for (const auto* list : {&update.set, &update.where}) {
    for (const Column<Row>& p : *list) {
      if (update.table->Find(p.spec.name) == nullptr) {
        return absl::InternalError("records statement: table " + update.table->name + " has no column '" + p.spec.name +
                                   "'");
      }
      std::string term = p.spec.name + " = ?" + std::to_string(++index);
      if (list == &update.set) {
        set += (set.empty() ? "" : ", ") + term;
      } else {
        where += (where.empty() ? "" : " AND ") + term;
      }
    }
  }
  return "UPDATE " + update.table->name + " SET " + set + " WHERE " + where;
}

template <class Row>
std::string SelectList(const RowTable<Row>& table, int schema_version) {
  std::string out;
  for (const Column<Row>& c : table.columns) {
    if (c.read == nullptr) continue;
    if (!out.empty()) out += ", ";
    out += c.spec.since_version <= schema_version ? c.spec.name : "NULL AS " + c.spec.name;
  }
  return out;
}

}  // namespace fl::instrumentation
