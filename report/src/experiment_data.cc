#include "fl/report/experiment_data.h"

#include <filesystem>
#include <map>
#include <set>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/schema.h"
#include "fl/instrumentation/sqlite.h"

namespace fl::report {
namespace {

namespace sqlite = fl::instrumentation::sqlite;

// Opens `path` read-only and checks that it is a records database this build can read.
absl::StatusOr<sqlite::Database> OpenRecords(const std::string& path, int* schema_version) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(fl::StrCat("records database ", path,
                                          " does not exist: give the file fl-server wrote with --db"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        fl::StrCat(path, " is a directory, not a records database: give the file fl-server wrote with --db"));
  }
  absl::StatusOr<sqlite::Database> db = sqlite::Database::Open(path, SQLITE_OPEN_READONLY);
  if (!db.ok()) return db.status();
  (void)db->Exec("PRAGMA busy_timeout = 5000");
  absl::StatusOr<int64_t> app_id = db->QueryInt("PRAGMA application_id");
  if (!app_id.ok()) {
    // SQLite opens any file lazily; the first read of a file that is not SQLite fails with SQLITE_NOTADB.
    return absl::FailedPreconditionError(fl::StrCat(
        path, " is not a records database (SQLite cannot read it: ", fl::ToStd(app_id.status().message()),
        "); give the file fl-server wrote with --db"));
  }
  absl::StatusOr<int64_t> version = db->QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*app_id != fl::instrumentation::kRecordsApplicationId || *version < 1) {
    return absl::FailedPreconditionError(fl::StrCat(
        path, " is an SQLite database but not an fl-testbed records database (application_id ", *app_id,
        ", schema version ", *version, "); give the file fl-server wrote with --db"));
  }
  const int latest = fl::instrumentation::LatestSchemaVersion();
  if (*version > latest) {
    return absl::FailedPreconditionError(fl::StrCat(
        "records database ", path, " has schema version ", *version, ", newer than this fl-report knows (", latest,
        "): it was written by a newer fl-server; upgrade fl-report"));
  }
  *schema_version = static_cast<int>(*version);
  return db;
}

absl::StatusOr<std::set<std::string>> ColumnsOf(sqlite::Database& db, std::string_view table) {
  absl::StatusOr<sqlite::Statement> st = db.Prepare(fl::StrCat("SELECT name FROM pragma_table_info('", table, "')"));
  if (!st.ok()) return st.status();
  std::set<std::string> names;
  while (true) {
    absl::StatusOr<bool> row = st->Step(fl::StrCat("read the columns of ", table));
    if (!row.ok()) return row.status();
    if (!*row) break;
    names.insert(st->ColumnText(0));
  }
  return names;
}

// `name` when `columns` has it, else NULL under that name: columns of later schema versions read as NULL in
// databases that predate them.
std::string ColumnOrNull(const std::set<std::string>& columns, std::string_view name, std::string_view prefix = "") {
  return columns.count(std::string(name)) > 0 ? fl::StrCat(prefix, name) : fl::StrCat("NULL AS ", name);
}

absl::StatusOr<std::string> ExperimentSelect(sqlite::Database& db) {
  absl::StatusOr<std::set<std::string>> columns = ColumnsOf(db, "experiments");
  if (!columns.ok()) return columns.status();
  return fl::StrCat(
      "SELECT e.id, e.name, e.status, e.status_reason, e.started_unix_ms, e.finished_unix_ms, e.software_version, "
      "e.host, (SELECT count(*) FROM rounds r WHERE r.experiment_id = e.id), ",
      ColumnOrNull(*columns, "task", "e."), " FROM experiments e ");
}

ExperimentInfo ReadExperiment(const sqlite::Statement& st) {
  ExperimentInfo e;
  e.id = st.ColumnText(0);
  e.name = st.ColumnText(1);
  e.status = st.ColumnText(2);
  e.status_reason = st.ColumnText(3);
  e.started_unix_ms = st.ColumnInt64(4);
  e.finished_unix_ms = st.ColumnOptionalInt64(5);
  e.software_version = st.ColumnText(6);
  e.host = st.ColumnText(7);
  e.num_rounds = st.ColumnInt64(8);
  // NULL: not known yet, or a database from before tasks (v6), whose experiments were classifiers.
  if (std::string task = st.ColumnText(9); !task.empty()) e.task = std::move(task);
  return e;
}

absl::StatusOr<std::vector<ExperimentInfo>> ReadExperiments(sqlite::Database& db) {
  absl::StatusOr<std::string> select = ExperimentSelect(db);
  if (!select.ok()) return select.status();
  absl::StatusOr<sqlite::Statement> st = db.Prepare(fl::StrCat(*select, "ORDER BY e.started_unix_ms, e.rowid"));
  if (!st.ok()) return st.status();
  std::vector<ExperimentInfo> out;
  while (true) {
    absl::StatusOr<bool> row = st->Step("list experiments");
    if (!row.ok()) return row.status();
    if (!*row) break;
    out.push_back(ReadExperiment(*st));
  }
  return out;
}

std::string DescribeExperiments(const std::vector<ExperimentInfo>& all) {
  std::string out;
  for (const ExperimentInfo& e : all) {
    out += fl::StrCat("\n  ", e.id, "  (name ", e.name, ", ", e.status, ", ", e.num_rounds, " round rows)");
  }
  return out;
}

absl::Status LoadClients(sqlite::Database& db, ExperimentData& data) {
  absl::StatusOr<sqlite::Statement> st = db.Prepare(
      "SELECT client_id, client_name, device_class, link_kind, link_profile FROM clients WHERE experiment_id = ?1 "
      "ORDER BY joined_unix_ms, client_id");
  if (!st.ok()) return st.status();
  st->BindText(1, data.experiment.id);
  std::map<std::string, int> name_count;
  while (true) {
    absl::StatusOr<bool> row = st->Step("read clients");
    if (!row.ok()) return row.status();
    if (!*row) break;
    ClientInfo c;
    c.client_id = st->ColumnText(0);
    c.client_name = st->ColumnText(1);
    c.device_class = st->ColumnText(2);
    c.link_kind = st->ColumnText(3);
    if (c.link_kind.empty()) c.link_kind = "unknown";
    c.link_profile = st->ColumnText(4);
    ++name_count[c.client_name];
    data.clients.push_back(std::move(c));
  }
  for (ClientInfo& c : data.clients) {
    c.label = (!c.client_name.empty() && name_count[c.client_name] == 1) ? c.client_name : c.client_id;
  }
  return absl::OkStatus();
}

absl::Status LoadRounds(sqlite::Database& db, ExperimentData& data) {
  absl::StatusOr<std::set<std::string>> columns = ColumnsOf(db, "rounds");
  if (!columns.ok()) return columns.status();
  absl::StatusOr<sqlite::Statement> st = db.Prepare(fl::StrCat(
      "SELECT round, attempt, status, failure_reason, started_unix_ms, ended_unix_ms, duration_ms, aggregation_ms, "
      "num_selected, num_accepted, num_late, num_rejected, num_dropped, eval_loss, eval_accuracy, ",
      ColumnOrNull(*columns, "eval_mae"), ", ", ColumnOrNull(*columns, "eval_perplexity"),
      " FROM rounds WHERE experiment_id = ?1 ORDER BY round, attempt"));
  if (!st.ok()) return st.status();
  st->BindText(1, data.experiment.id);
  while (true) {
    absl::StatusOr<bool> row = st->Step("read rounds");
    if (!row.ok()) return row.status();
    if (!*row) break;
    RoundAttempt r;
    r.round = st->ColumnInt64(0);
    r.attempt = st->ColumnInt64(1);
    r.status = st->ColumnText(2);
    r.failure_reason = st->ColumnText(3);
    r.started_unix_ms = st->ColumnInt64(4);
    r.ended_unix_ms = st->ColumnInt64(5);
    r.duration_ms = st->ColumnDouble(6);
    r.aggregation_ms = st->ColumnOptionalDouble(7);
    r.num_selected = st->ColumnInt64(8);
    r.num_accepted = st->ColumnInt64(9);
    r.num_late = st->ColumnInt64(10);
    r.num_rejected = st->ColumnInt64(11);
    r.num_dropped = st->ColumnInt64(12);
    r.eval_loss = st->ColumnOptionalDouble(13);
    r.eval_accuracy = st->ColumnOptionalDouble(14);
    r.eval_mae = st->ColumnOptionalDouble(15);
    r.eval_perplexity = st->ColumnOptionalDouble(16);
    data.rounds.push_back(std::move(r));
  }
  return absl::OkStatus();
}

absl::Status LoadClientRounds(sqlite::Database& db, ExperimentData& data) {
  absl::StatusOr<std::set<std::string>> columns = ColumnsOf(db, "client_rounds");
  if (!columns.ok()) return columns.status();
  // Columns of later schema versions: read as NULL where the database predates them.
  auto col = [&](std::string_view name) { return ColumnOrNull(*columns, name); };
  const char* const kPhaseStarts[] = {"downlink_start_unix_ms", "train_start_unix_ms", "eval_start_unix_ms",
                                      "uplink_start_unix_ms", "uplink_end_unix_ms"};
  data.has_phase_starts = true;
  for (const char* name : kPhaseStarts) data.has_phase_starts = data.has_phase_starts && columns->count(name) > 0;

  absl::StatusOr<sqlite::Statement> st = db.Prepare(fl::StrCat(
      "SELECT round, attempt, client_id, outcome, reject_reason, dispatched_unix_ms, downlink_ms, train_ms, eval_ms, "
      "uplink_ms, uplink_server_ms, idle_ms, downlink_bytes, uplink_bytes, codec, rowid, ",
      col("clock_offset_ms"), ", ", col("downlink_start_unix_ms"), ", ", col("train_start_unix_ms"), ", ",
      col("eval_start_unix_ms"), ", ", col("uplink_start_unix_ms"), ", ", col("uplink_end_unix_ms"), ", ",
      col("uplink_server_start_unix_ms"),
      " FROM client_rounds WHERE experiment_id = ?1 ORDER BY round, attempt, rowid"));
  if (!st.ok()) return st.status();
  st->BindText(1, data.experiment.id);
  std::map<std::pair<int64_t, int64_t>, RoundAttempt*> by_key;
  for (RoundAttempt& r : data.rounds) by_key[{r.round, r.attempt}] = &r;
  while (true) {
    absl::StatusOr<bool> row = st->Step("read client_rounds");
    if (!row.ok()) return row.status();
    if (!*row) break;
    auto it = by_key.find({st->ColumnInt64(0), st->ColumnInt64(1)});
    if (it == by_key.end()) continue;  // the foreign key makes this impossible in a database fl-server wrote
    ClientRoundRow c;
    c.client_id = st->ColumnText(2);
    c.outcome = st->ColumnText(3);
    c.reject_reason = st->ColumnText(4);
    c.dispatched_unix_ms = st->ColumnOptionalInt64(5);
    c.downlink_ms = st->ColumnOptionalDouble(6);
    c.train_ms = st->ColumnOptionalDouble(7);
    c.eval_ms = st->ColumnOptionalDouble(8);
    c.uplink_ms = st->ColumnOptionalDouble(9);
    c.uplink_server_ms = st->ColumnOptionalDouble(10);
    c.idle_ms = st->ColumnOptionalDouble(11);
    c.downlink_bytes = st->ColumnOptionalInt64(12);
    c.uplink_bytes = st->ColumnOptionalInt64(13);
    c.codec = st->ColumnText(14);
    c.write_order = st->ColumnInt64(15);
    c.clock_offset_ms = st->ColumnOptionalDouble(16);
    c.downlink_start_unix_ms = st->ColumnOptionalDouble(17);
    c.train_start_unix_ms = st->ColumnOptionalDouble(18);
    c.eval_start_unix_ms = st->ColumnOptionalDouble(19);
    c.uplink_start_unix_ms = st->ColumnOptionalDouble(20);
    c.uplink_end_unix_ms = st->ColumnOptionalDouble(21);
    c.uplink_server_start_unix_ms = st->ColumnOptionalDouble(22);
    it->second->clients.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status LoadEvaluations(sqlite::Database& db, ExperimentData& data) {
  absl::StatusOr<std::set<std::string>> columns = ColumnsOf(db, "evaluations");
  if (!columns.ok()) return columns.status();
  absl::StatusOr<sqlite::Statement> st = db.Prepare(fl::StrCat(
      "SELECT round, attempt, client_id, eval_ms, accuracy, loss, ", ColumnOrNull(*columns, "mae"), ", ",
      ColumnOrNull(*columns, "reject_reason"),
      " FROM evaluations WHERE experiment_id = ?1 ORDER BY round, attempt, client_id"));
  if (!st.ok()) return st.status();
  st->BindText(1, data.experiment.id);
  while (true) {
    absl::StatusOr<bool> row = st->Step("read evaluations");
    if (!row.ok()) return row.status();
    if (!*row) break;
    EvaluationRow e;
    e.round = st->ColumnInt64(0);
    e.attempt = st->ColumnInt64(1);
    e.client_id = st->ColumnText(2);
    e.eval_ms = st->ColumnOptionalDouble(3);
    e.accuracy = st->ColumnOptionalDouble(4);
    e.loss = st->ColumnOptionalDouble(5);
    e.mae = st->ColumnOptionalDouble(6);
    e.reject_reason = st->ColumnText(7);
    data.evaluations.push_back(std::move(e));
  }
  return absl::OkStatus();
}

}  // namespace

const ClientInfo* ExperimentData::FindClient(std::string_view client_id) const {
  for (const ClientInfo& c : clients) {
    if (c.client_id == client_id) return &c;
  }
  return nullptr;
}

absl::StatusOr<std::vector<ExperimentInfo>> ListExperiments(const std::string& db_path) {
  int version = 0;
  absl::StatusOr<sqlite::Database> db = OpenRecords(db_path, &version);
  if (!db.ok()) return db.status();
  return ReadExperiments(*db);
}

absl::StatusOr<ExperimentData> LoadExperiment(const std::string& db_path, std::string_view experiment_id) {
  ExperimentData data;
  data.db_path = db_path;
  absl::StatusOr<sqlite::Database> db = OpenRecords(db_path, &data.schema_version);
  if (!db.ok()) return db.status();
  // One read transaction: every table comes from the same snapshot while fl-server may be writing.
  if (absl::Status s = db->Exec("BEGIN"); !s.ok()) return s;
  absl::StatusOr<std::vector<ExperimentInfo>> all = ReadExperiments(*db);
  if (!all.ok()) return all.status();
  if (all->empty()) {
    return absl::FailedPreconditionError(fl::StrCat(
        "records database ", db_path, " holds no experiments yet: start fl-server with --db ", db_path,
        " and let it run a round"));
  }
  if (experiment_id.empty()) {
    data.experiment = all->back();
  } else {
    bool found = false;
    for (const ExperimentInfo& e : *all) {
      if (e.id == experiment_id) {
        data.experiment = e;
        found = true;
      }
    }
    if (!found) {
      return absl::NotFoundError(fl::StrCat("experiment '", experiment_id, "' is not in ", db_path,
                                            "; the experiments there are:", DescribeExperiments(*all)));
    }
  }
  if (absl::Status s = LoadClients(*db, data); !s.ok()) return s;
  if (absl::Status s = LoadRounds(*db, data); !s.ok()) return s;
  if (data.rounds.empty()) {
    return absl::FailedPreconditionError(fl::StrCat(
        "experiment '", data.experiment.id, "' in ", db_path, " has no rounds recorded (status ",
        data.experiment.status, ", ", data.clients.size(),
        " clients joined): nothing to report yet; wait for its first round to end, or pick another with "
        "--experiment:",
        DescribeExperiments(*all)));
  }
  if (absl::Status s = LoadClientRounds(*db, data); !s.ok()) return s;
  if (absl::Status s = LoadEvaluations(*db, data); !s.ok()) return s;
  (void)db->Exec("COMMIT");
  return data;
}

}  // namespace fl::report
