// Every records table, declared once. The spelling of each column and constraint is the one its migration
// (schema.cc) shipped with, so that a new database and a migrated one hold the same schema
// (instrumentation_schema_test compares them); `since` is the version of that migration.
#include "fl/instrumentation/record_columns.h"

#include "fl/core/str_cat.h"

namespace fl::instrumentation {
namespace {

using E = ExperimentRecord;
using C = ClientRecord;
using R = RoundRecord;
using CR = ClientRoundRecord;
using Ev = EvaluationRecord;
using Ck = CheckpointRecord;
using CE = ClientEventRecord;
using SE = SecurityEventRecord;
using SA = SecAggStageRecord;
using I = IslandRecord;
using IE = IslandEpochRecord;
using IS = IslandSyncRecord;

constexpr std::string_view kCascadeToExperiment = "REFERENCES experiments (id) ON DELETE CASCADE";
constexpr std::string_view kToRoundAttempt =
    "FOREIGN KEY (experiment_id, round, attempt) REFERENCES rounds (experiment_id, round, attempt) ON DELETE CASCADE";
constexpr std::string_view kToClient =
    "FOREIGN KEY (experiment_id, client_id) REFERENCES clients (experiment_id, client_id) ON DELETE CASCADE";

// A column the database fills or a record does not carry: declared for the schema only.
template <class Row>
Column<Row> SchemaOnly(std::string_view name, SqlType type, bool not_null, std::string_view constraints,
                       int since_version) {
  return {ColumnSpec{std::string(name), type, not_null, std::string(constraints), since_version}, nullptr, nullptr};
}

std::string JoinIds(const std::vector<std::string>& ids) {
  std::string out;
  for (const std::string& id : ids) out += (out.empty() ? "" : ",") + id;
  return out;
}

std::vector<std::string> SplitIds(std::string_view joined) {
  std::vector<std::string> out;
  if (joined.empty()) return out;
  size_t start = 0;
  while (true) {
    const size_t comma = joined.find(',', start);
    out.emplace_back(joined.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start));
    if (comma == std::string_view::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

std::string_view SqlTypeName(SqlType type) {
  switch (type) {
    case SqlType::kInteger: return "INTEGER";
    case SqlType::kReal: return "REAL";
    case SqlType::kText: return "TEXT";
  }
  return "BLOB";
}

std::string ColumnDefinition(const ColumnSpec& column) {
  return fl::StrCat(column.name, " ", SqlTypeName(column.type), column.not_null ? " NOT NULL" : "",
                    column.constraints.empty() ? "" : " ", column.constraints);
}

const ColumnSpec* TableSpec::Find(std::string_view column) const {
  for (const ColumnSpec& c : columns) {
    if (c.name == column) return &c;
  }
  return nullptr;
}

std::string CreateTableSql(const TableSpec& table) {
  std::string body;
  for (const ColumnSpec& c : table.columns) body += (body.empty() ? "\n  " : ",\n  ") + ColumnDefinition(c);
  for (const std::string& c : table.constraints) body += ",\n  " + c;
  return fl::StrCat("CREATE TABLE ", table.name, " (", body, "\n)");
}

const RowTable<ExperimentRecord>& ExperimentsTable() {
  static const RowTable<E>* const table = [] {
    Column<E> config_json = Col<&E::config_json>("config_json", "DEFAULT '{}'");
    // A record without a configuration stores the column's default rather than an empty text.
    config_json.bind = [](sqlite::Statement& st, int index, const E& row, const ColumnSpec&) {
      st.BindText(index, row.config_json.empty() ? std::string_view("{}") : std::string_view(row.config_json));
    };
    return new RowTable<E>(
        "experiments", 1,
        {Col<&E::id>("id", "PRIMARY KEY"), Col<&E::name>("name"), Col<&E::status>("status", "DEFAULT 'running'"),
         OptText<&E::status_reason>("status_reason"), Col<&E::started_unix_ms>("started_unix_ms"),
         Col<&E::finished_unix_ms>("finished_unix_ms"), config_json, Col<&E::software_version>("software_version"),
         OptText<&E::host>("host"),
         OptText<&E::task>("task", "CHECK (task IS NULL OR task IN ('classification', 'regression', 'next-token'))", 6),
         OptText<&E::aggregation>("aggregation",
                                  "CHECK (aggregation IS NULL OR aggregation IN ('synchronous', 'buffered'))", 9)});
  }();
  return *table;
}

const RowTable<ClientRecord>& ClientsTable() {
  static const RowTable<C>* const table = new RowTable<C>(
      "clients", 1,
      {Col<&C::experiment_id>("experiment_id", kCascadeToExperiment), Col<&C::client_id>("client_id"),
       OptText<&C::client_name>("client_name"), OptText<&C::device_class>("device_class"),
       OptText<&C::link_kind>("link_kind"), OptText<&C::link_interface>("link_interface"),
       OptText<&C::link_profile>("link_profile"), Col<&C::cores>("cores", "CHECK (cores IS NULL OR cores >= 0)"),
       Col<&C::memory_bytes>("memory_bytes", "CHECK (memory_bytes IS NULL OR memory_bytes >= 0)"),
       OptText<&C::accelerator>("accelerator"), OptText<&C::os>("os"), OptText<&C::arch>("arch"),
       OptText<&C::client_version>("client_version"), Col<&C::joined_unix_ms>("joined_unix_ms"),
       Col<&C::left_unix_ms>("left_unix_ms"), OptText<&C::left_reason>("left_reason")},
      {"PRIMARY KEY (experiment_id, client_id)"});
  return *table;
}

const RowTable<RoundRecord>& RoundsTable() {
  static const RowTable<R>* const table = new RowTable<R>(
      "rounds", 1,
      {Col<&R::experiment_id>("experiment_id", kCascadeToExperiment),
       Col<&R::round>("round", "CHECK (round >= 0)"),
       Col<&R::attempt>("attempt", "DEFAULT 0 CHECK (attempt >= 0)"),
       Col<&R::status>("status"),
       OptText<&R::failure_reason>("failure_reason"),
       Col<&R::started_unix_ms>("started_unix_ms"),
       Col<&R::ended_unix_ms>("ended_unix_ms"),
       Col<&R::duration_ms>("duration_ms", "CHECK (duration_ms >= 0)"),
       Col<&R::aggregation_ms>("aggregation_ms", "CHECK (aggregation_ms IS NULL OR aggregation_ms >= 0)"),
       Col<&R::num_selected>("num_selected", "DEFAULT 0 CHECK (num_selected >= 0)"),
       Col<&R::num_accepted>("num_accepted", "DEFAULT 0 CHECK (num_accepted >= 0)"),
       Col<&R::num_late>("num_late", "DEFAULT 0 CHECK (num_late >= 0)"),
       Col<&R::num_rejected>("num_rejected", "DEFAULT 0 CHECK (num_rejected >= 0)"),
       Col<&R::num_dropped>("num_dropped", "DEFAULT 0 CHECK (num_dropped >= 0)"),
       Col<&R::num_examples>("num_examples", "DEFAULT 0 CHECK (num_examples >= 0)"),
       Col<&R::model_version>("model_version"),
       Col<&R::train_loss>("train_loss"),
       Col<&R::eval_loss>("eval_loss"),
       Col<&R::eval_accuracy>("eval_accuracy"),
       Col<&R::eval_num_examples>("eval_num_examples"),
       Col<&R::eval_mae>("eval_mae", "CHECK (eval_mae IS NULL OR eval_mae >= 0)", 6),
       Col<&R::eval_perplexity>("eval_perplexity", "CHECK (eval_perplexity IS NULL OR eval_perplexity >= 1)", 6),
       Col<&R::dp_epsilon>("dp_epsilon", "CHECK (dp_epsilon IS NULL OR dp_epsilon >= 0)", 10),
       Col<&R::dp_clip_norm>("dp_clip_norm", "CHECK (dp_clip_norm IS NULL OR dp_clip_norm > 0)", 10),
       Col<&R::dp_noise_multiplier>("dp_noise_multiplier",
                                    "CHECK (dp_noise_multiplier IS NULL OR dp_noise_multiplier >= 0)", 10),
       Col<&R::secagg_survivors>("secagg_survivors", "CHECK (secagg_survivors IS NULL OR secagg_survivors >= 0)", 11),
       Col<&R::secagg_dropped>("secagg_dropped", "CHECK (secagg_dropped IS NULL OR secagg_dropped >= 0)", 11)},
      {"PRIMARY KEY (experiment_id, round, attempt)", "CHECK (status <> 'committed' OR model_version IS NOT NULL)"},
      // A round is committed at most once; failed/aborted attempts of it may be many.
      {"CREATE UNIQUE INDEX rounds_committed_once ON rounds (experiment_id, round) WHERE status = 'committed'"});
  return *table;
}

// v9 rebuilt the table (the outcome CHECK gained 'cancelled' and 'folded'), listing its four columns where any
// CREATE TABLE lists them: after the others, before the table constraints.
const RowTable<ClientRoundRecord>& ClientRoundsTable() {
  static const RowTable<CR>* const table = new RowTable<CR>(
      "client_rounds", 1,
      {Col<&CR::experiment_id>("experiment_id"),
       Col<&CR::round>("round"),
       Col<&CR::attempt>("attempt"),
       Col<&CR::client_id>("client_id"),
       Col<&CR::outcome>("outcome"),
       OptText<&CR::reject_reason>("reject_reason", "CHECK (reject_reason IS NULL OR outcome = 'rejected')"),
       Col<&CR::dispatched_unix_ms>("dispatched_unix_ms"),
       Col<&CR::num_examples>("num_examples", "CHECK (num_examples IS NULL OR num_examples >= 0)"),
       Col<&CR::num_steps>("num_steps", "CHECK (num_steps IS NULL OR num_steps >= 0)"),
       Col<&CR::downlink_ms>("downlink_ms"),
       Col<&CR::train_ms>("train_ms"),
       Col<&CR::eval_ms>("eval_ms"),
       Col<&CR::uplink_ms>("uplink_ms"),
       Col<&CR::uplink_server_ms>("uplink_server_ms"),
       Col<&CR::idle_ms>("idle_ms"),
       Col<&CR::downlink_bytes>("downlink_bytes", "CHECK (downlink_bytes IS NULL OR downlink_bytes >= 0)"),
       Col<&CR::uplink_bytes>("uplink_bytes", "CHECK (uplink_bytes IS NULL OR uplink_bytes >= 0)"),
       OptText<&CR::codec>("codec"),
       Col<&CR::train_loss>("train_loss"),
       Col<&CR::clock_offset_ms>("clock_offset_ms", "", 2),
       Col<&CR::clock_rtt_ms>("clock_rtt_ms", "CHECK (clock_rtt_ms IS NULL OR clock_rtt_ms >= 0)", 2),
       Col<&CR::downlink_start_unix_ms>("downlink_start_unix_ms", "", 3),
       Col<&CR::train_start_unix_ms>("train_start_unix_ms", "", 3),
       Col<&CR::eval_start_unix_ms>("eval_start_unix_ms", "", 3),
       Col<&CR::uplink_start_unix_ms>("uplink_start_unix_ms", "", 3),
       Col<&CR::uplink_end_unix_ms>("uplink_end_unix_ms", "", 3),
       Col<&CR::uplink_server_start_unix_ms>("uplink_server_start_unix_ms", "", 3),
       Col<&CR::downlink_server_start_unix_ms>("downlink_server_start_unix_ms", "", 3),
       Col<&CR::downlink_server_ms>("downlink_server_ms",
                                    "CHECK (downlink_server_ms IS NULL OR downlink_server_ms >= 0)", 3),
       Col<&CR::base_model_version>("base_model_version",
                                    "CHECK (base_model_version IS NULL OR base_model_version >= 0)", 9),
       Col<&CR::staleness>("staleness", "CHECK (staleness IS NULL OR staleness >= 0)", 9),
       Col<&CR::staleness_weight>("staleness_weight", "CHECK (staleness_weight IS NULL OR staleness_weight >= 0)", 9),
       Col<&CR::folded_into_round>("folded_into_round",
                                   "CHECK (folded_into_round IS NULL OR folded_into_round > round)", 9)},
      {"PRIMARY KEY (experiment_id, round, attempt, client_id)", std::string(kToRoundAttempt), std::string(kToClient)},
      {"CREATE INDEX client_rounds_by_client ON client_rounds (experiment_id, client_id)"});
  return *table;
}

const RowTable<EvaluationRecord>& EvaluationsTable() {
  static const RowTable<Ev>* const table = new RowTable<Ev>(
      "evaluations", 1,
      {Col<&Ev::experiment_id>("experiment_id"), Col<&Ev::round>("round"), Col<&Ev::attempt>("attempt"),
       Col<&Ev::client_id>("client_id"), Col<&Ev::num_examples>("num_examples", "CHECK (num_examples >= 0)"),
       Col<&Ev::loss>("loss"), Col<&Ev::accuracy>("accuracy"), Col<&Ev::eval_ms>("eval_ms"),
       Col<&Ev::mae>("mae", "CHECK (mae IS NULL OR mae >= 0)", 6), OptText<&Ev::reject_reason>("reject_reason", "", 6)},
      {"PRIMARY KEY (experiment_id, round, attempt, client_id)", std::string(kToRoundAttempt), std::string(kToClient)},
      {"CREATE INDEX evaluations_by_client ON evaluations (experiment_id, client_id)"});
  return *table;
}

const RowTable<CheckpointRecord>& CheckpointsTable() {
  static const RowTable<Ck>* const table = new RowTable<Ck>(
      "checkpoints", 1,
      {Col<&Ck::experiment_id>("experiment_id", kCascadeToExperiment), Col<&Ck::round>("round", "CHECK (round >= 0)"),
       Col<&Ck::model_version>("model_version"), Col<&Ck::path>("path"), Col<&Ck::bytes>("bytes", "CHECK (bytes >= 0)"),
       Col<&Ck::fingerprint>("fingerprint"), OptText<&Ck::checksum>("checksum"),
       Col<&Ck::created_unix_ms>("created_unix_ms")},
      {"PRIMARY KEY (experiment_id, round)"});
  return *table;
}

const RowTable<ExperimentManifestRecord>& ExperimentManifestsTable() {
  using Mf = ExperimentManifestRecord;
  static const RowTable<Mf>* const table = new RowTable<Mf>(
      "experiment_manifests", 4,
      {Col<&Mf::experiment_id>("experiment_id", "PRIMARY KEY", 4), Col<&Mf::manifest_path>("manifest_path", "", 4),
       Col<&Mf::manifest_yaml>("manifest_yaml", "", 4), Col<&Mf::resolved_json>("resolved_json", "", 4),
       Col<&Mf::seed>("seed", "", 4), Col<&Mf::backend>("backend", "", 4),
       Col<&Mf::software_version>("software_version", "", 4), OptText<&Mf::replay_of>("replay_of", "", 4),
       Col<&Mf::created_unix_ms>("created_unix_ms", "", 4)});
  return *table;
}

const RowTable<IslandRecord>& IslandsTable() {
  static const RowTable<I>* const table = new RowTable<I>(
      "islands", 5,
      {Col<&I::experiment_id>("experiment_id", "REFERENCES experiments(id)", 5),
       Col<&I::join_seq>("join_seq", "CHECK (join_seq >= 1)", 5), Col<&I::island_id>("island_id", "", 5),
       Col<&I::data_endpoint>("data_endpoint", "", 5), Col<&I::state_endpoint>("state_endpoint", "", 5),
       Col<&I::num_ranks>("num_ranks", "CHECK (num_ranks >= 1)", 5),
       Col<&I::model_fingerprint>("model_fingerprint", "", 5), OptText<&I::software_version>("software_version", "", 5),
       OptText<&I::device_class>("device_class", "", 5), OptText<&I::accelerator>("accelerator", "", 5),
       Col<&I::joined_unix_ms>("joined_unix_ms", "", 5),
       Col<&I::late_join>("late_join", "CHECK (late_join IN (0, 1))", 5),
       OptText<&I::state_source_island>("state_source_island", "", 5),
       Col<&I::state_source_step>("state_source_step", "", 5),
       Col<&I::state_source_fragment>("state_source_fragment", "", 5), Col<&I::left_unix_ms>("left_unix_ms", "", 5),
       OptText<&I::left_reason>("left_reason", "", 5)},
      {"PRIMARY KEY (experiment_id, join_seq)"},
      {"CREATE INDEX islands_by_island ON islands(experiment_id, island_id)"});
  return *table;
}

const RowTable<IslandEpochRecord>& IslandEpochsTable() {
  static const RowTable<IE>* const table = [] {
    // Ring order, stored comma-separated; num_members is derived from it.
    Column<IE> members{ColumnSpec{"members", SqlType::kText, true, "", 5},
                       [](sqlite::Statement& st, int index, const IE& row, const ColumnSpec&) {
                         st.BindText(index, JoinIds(row.members));
                       },
                       [](const sqlite::Statement& st, int column, IE& row) {
                         row.members = SplitIds(st.ColumnText(column));
                         return absl::OkStatus();
                       }};
    Column<IE> num_members{ColumnSpec{"num_members", SqlType::kInteger, true, "CHECK (num_members >= 1)", 5},
                           [](sqlite::Statement& st, int index, const IE& row, const ColumnSpec&) {
                             st.BindInt64(index, static_cast<int64_t>(row.members.size()));
                           },
                           nullptr};
    return new RowTable<IE>(
        "island_epochs", 5,
        {Col<&IE::experiment_id>("experiment_id", "REFERENCES experiments(id)", 5),
         Col<&IE::epoch>("epoch", "CHECK (epoch >= 1)", 5), Col<&IE::step>("step", "CHECK (step >= 0)", 5),
         Col<&IE::fragment>("fragment", "CHECK (fragment >= 0)", 5),
         Col<&IE::attempt>("attempt", "CHECK (attempt >= 0)", 5), members, num_members,
         Col<&IE::outcome>("outcome", "CHECK (outcome IN ('committed', 'retried', 'abandoned'))", 5),
         OptText<&IE::committed_hash>("committed_hash", "", 5),
         Col<&IE::num_applied>("num_applied", "CHECK (num_applied >= 0)", 5),
         Col<&IE::num_failed>("num_failed", "CHECK (num_failed >= 0)", 5),
         Col<&IE::num_mismatched>("num_mismatched", "CHECK (num_mismatched >= 0)", 5),
         Col<&IE::barrier_ms>("barrier_ms", "CHECK (barrier_ms IS NULL OR barrier_ms >= 0)", 5),
         Col<&IE::formed_unix_ms>("formed_unix_ms", "", 5), Col<&IE::resolved_unix_ms>("resolved_unix_ms", "", 5),
         OptText<&IE::reason>("reason", "", 5)},
        {"PRIMARY KEY (experiment_id, epoch)", "CHECK (outcome <> 'committed' OR committed_hash IS NOT NULL)"},
        {"CREATE INDEX island_epochs_by_sync ON island_epochs(experiment_id, step, fragment)"});
  }();
  return *table;
}

const RowTable<IslandSyncRecord>& IslandSyncsTable() {
  static const RowTable<IS>* const table = new RowTable<IS>(
      "island_syncs", 5,
      {Col<&IS::experiment_id>("experiment_id", "", 5),
       Col<&IS::epoch>("epoch", "", 5),
       Col<&IS::island_id>("island_id", "", 5),
       Col<&IS::join_seq>("join_seq", "", 5),
       Col<&IS::step>("step", "CHECK (step >= 0)", 5),
       Col<&IS::fragment>("fragment", "CHECK (fragment >= 0)", 5),
       Col<&IS::ring_index>("ring_index", "CHECK (ring_index >= 0)", 5),
       Col<&IS::outcome>("outcome", "CHECK (outcome IN ('applied', 'mismatch', 'failed', 'missing'))", 5),
       Col<&IS::verdict>("verdict", "CHECK (verdict IN ('commit', 'repair', 'retry', 'evicted'))", 5),
       Col<&IS::inner_compute_ms>("inner_compute_ms", "CHECK (inner_compute_ms IS NULL OR inner_compute_ms >= 0)", 5),
       Col<&IS::exchange_ms>("exchange_ms", "CHECK (exchange_ms IS NULL OR exchange_ms >= 0)", 5),
       Col<&IS::wait_ms>("wait_ms", "CHECK (wait_ms IS NULL OR wait_ms >= 0)", 5),
       Col<&IS::bytes_sent>("bytes_sent", "CHECK (bytes_sent IS NULL OR bytes_sent >= 0)", 5),
       Col<&IS::bytes_received>("bytes_received", "CHECK (bytes_received IS NULL OR bytes_received >= 0)", 5),
       Col<&IS::inner_steps>("inner_steps", "CHECK (inner_steps IS NULL OR inner_steps >= 0)", 5),
       OptText<&IS::state_hash>("state_hash", "", 5),
       OptText<&IS::failure_reason>("failure_reason", "", 5),
       OptText<&IS::vanished_island>("vanished_island", "", 5),
       OptText<&IS::repair_source>("repair_source", "", 5),
       Col<&IS::repaired_unix_ms>("repaired_unix_ms", "", 5),
       Col<&IS::reported_unix_ms>("reported_unix_ms", "", 5)},
      {"PRIMARY KEY (experiment_id, epoch, island_id)",
       "FOREIGN KEY (experiment_id, epoch) REFERENCES island_epochs(experiment_id, epoch)",
       "FOREIGN KEY (experiment_id, join_seq) REFERENCES islands(experiment_id, join_seq)"},
      {"CREATE INDEX island_syncs_by_island ON island_syncs(experiment_id, island_id, step, fragment)"});
  return *table;
}

const RowTable<ClientEventRecord>& ClientEventsTable() {
  static const RowTable<CE>* const table = [] {
    Column<CE> reason = Col<&CE::reason>("reason", "", 7);
    // A client's figures end up in reasons: the row stays bounded whatever the client sent.
    reason.bind = [](sqlite::Statement& st, int index, const CE& row, const ColumnSpec&) {
      st.BindText(index, BoundClientEventReason(row.reason));
    };
    return new RowTable<CE>(
        "client_events", 7,
        {SchemaOnly<CE>("id", SqlType::kInteger, false, "PRIMARY KEY", 7),
         Col<&CE::experiment_id>("experiment_id", "", 7), Col<&CE::client_id>("client_id", "", 7),
         Col<&CE::kind>("kind", "", 7), Col<&CE::round>("round", "CHECK (round IS NULL OR round >= 0)", 7),
         OptText<&CE::task_id>("task_id", "", 7), reason, Col<&CE::at_unix_ms>("at_unix_ms", "", 7)},
        {std::string(kToClient)}, {"CREATE INDEX client_events_by_client ON client_events (experiment_id, client_id)"});
  }();
  return *table;
}

// v11 rebuilt the table (the reason CHECK gained 'secagg'): its columns and their versions are unchanged.
const RowTable<SecurityEventRecord>& SecurityEventsTable() {
  static const RowTable<SE>* const table = [] {
    // The database numbers the rows; the record reads its number back but never writes it.
    Column<SE> id = Col<&SE::id>("id", "PRIMARY KEY", 8);
    id.spec.not_null = false;
    id.bind = nullptr;
    // What a peer controls is bounded: a hostile peer must not make the rows it causes unbounded.
    Column<SE> peer = Col<&SE::peer>("peer", "", 8);
    peer.bind = [](sqlite::Statement& st, int index, const SE& row, const ColumnSpec&) {
      st.BindText(index, BoundText(row.peer, kMaxSecurityEventPeerBytes));
    };
    Column<SE> claimed = OptText<&SE::claimed>("claimed", "", 8);
    claimed.bind = [](sqlite::Statement& st, int index, const SE& row, const ColumnSpec&) {
      st.BindTextOrNull(index, BoundText(row.claimed, kMaxSecurityEventPeerBytes));
    };
    Column<SE> detail = Col<&SE::detail>("detail", "", 8);
    detail.bind = [](sqlite::Statement& st, int index, const SE& row, const ColumnSpec&) {
      st.BindText(index, BoundText(row.detail, kMaxSecurityEventDetailBytes));
    };
    return new RowTable<SE>(
        "security_events", 8,
        {id, Col<&SE::experiment_id>("experiment_id", kCascadeToExperiment, 8), Col<&SE::reason>("reason", "", 8), peer,
         OptText<&SE::identity>("identity", "", 8), claimed, detail, Col<&SE::at_unix_ms>("at_unix_ms", "", 8)},
        {}, {"CREATE INDEX security_events_by_reason ON security_events (experiment_id, reason)"});
  }();
  return *table;
}

// One client's part in one stage of a secure-aggregation round attempt; children of the attempt's rounds row and of
// the client's row, like client_rounds.
const RowTable<SecAggStageRecord>& SecAggStagesTable() {
  static const RowTable<SA>* const table = [] {
    // The reason a client gave or caused is bounded like a client event's.
    Column<SA> detail = OptText<&SA::detail>("detail", "", 11);
    detail.bind = [](sqlite::Statement& st, int index, const SA& row, const ColumnSpec&) {
      st.BindTextOrNull(index, BoundText(row.detail, kMaxSecAggDetailBytes));
    };
    return new RowTable<SA>(
        "secagg_stages", 11,
        {Col<&SA::experiment_id>("experiment_id", "", 11), Col<&SA::round>("round", "", 11),
         Col<&SA::attempt>("attempt", "", 11), Col<&SA::client_id>("client_id", "", 11),
         Col<&SA::stage>("stage", "", 11), Col<&SA::outcome>("outcome", "", 11),
         Col<&SA::started_unix_ms>("started_unix_ms", "", 11),
         Col<&SA::duration_ms>("duration_ms", "CHECK (duration_ms IS NULL OR duration_ms >= 0)", 11),
         Col<&SA::bytes_down>("bytes_down", "CHECK (bytes_down >= 0)", 11),
         Col<&SA::bytes_up>("bytes_up", "CHECK (bytes_up >= 0)", 11), detail},
        {"PRIMARY KEY (experiment_id, round, attempt, client_id, stage)", std::string(kToRoundAttempt),
         std::string(kToClient), "CHECK (outcome <> 'ok' OR detail IS NULL)"},
        {"CREATE INDEX secagg_stages_by_client ON secagg_stages (experiment_id, client_id)"});
  }();
  return *table;
}

std::span<const TableSpec* const> RecordTables() {
  static const std::array<const TableSpec*, 13> tables = {
      &ExperimentsTable().spec,         &ClientsTable().spec,      &RoundsTable().spec,
      &ClientRoundsTable().spec,        &EvaluationsTable().spec,  &CheckpointsTable().spec,
      &ExperimentManifestsTable().spec, &IslandsTable().spec,      &IslandEpochsTable().spec,
      &IslandSyncsTable().spec,         &ClientEventsTable().spec, &SecurityEventsTable().spec,
      &SecAggStagesTable().spec};
  return tables;
}

const TableSpec* FindRecordTable(std::string_view name) {
  for (const TableSpec* t : RecordTables()) {
    if (t->name == name) return t;
  }
  return nullptr;
}

std::string LatestSchemaSql() {
  std::string sql;
  for (const TableSpec* t : RecordTables()) {
    sql += CreateTableSql(*t) + ";\n";
    for (const std::string& index : t->indexes) sql += index + ";\n";
  }
  return sql;
}

}  // namespace fl::instrumentation
