#include "fl/report/experiment_data.h"

#include <filesystem>
#include <map>
#include <memory>
#include <utility>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"

namespace fl::report {
namespace {

namespace ins = fl::instrumentation;

// Opens `path` read-only through the records reader, whatever its schema version (1 to this build's): the
// reader refuses what is no records database, or a newer one, naming the file and what to do.
absl::StatusOr<std::unique_ptr<ins::RecordReader>> OpenRecords(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(
        fl::StrCat("records database ", path, " does not exist: give the file fl-server wrote with --db"));
  }
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        fl::StrCat(path, " is a directory, not a records database: give the file fl-server wrote with --db"));
  }
  return ins::RecordReader::OpenAnyVersion(path);
}

absl::StatusOr<std::vector<ExperimentInfo>> ReadExperiments(ins::RecordReader& reader) {
  absl::StatusOr<std::vector<ins::ExperimentRecord>> rows = reader.ListExperiments();
  if (!rows.ok()) return rows.status();
  std::vector<ExperimentInfo> out;
  for (ins::ExperimentRecord& r : *rows) {
    ExperimentInfo e;
    e.id = std::move(r.id);
    e.name = std::move(r.name);
    e.status = std::string(ins::ExperimentStatusName(r.status));
    e.status_reason = std::move(r.status_reason);
    e.started_unix_ms = r.started_unix_ms;
    e.finished_unix_ms = r.finished_unix_ms;
    e.software_version = std::move(r.software_version);
    e.host = std::move(r.host);
    absl::StatusOr<int64_t> num_rounds = reader.CountRounds(e.id);
    if (!num_rounds.ok()) return num_rounds.status();
    e.num_rounds = *num_rounds;
    // "": not known yet, or a database from before tasks (v6), whose experiments were classifiers.
    if (!r.task.empty()) e.task = std::move(r.task);
    if (!r.aggregation.empty()) e.aggregation = std::move(r.aggregation);
    out.push_back(std::move(e));
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

absl::Status LoadClients(ins::RecordReader& reader, ExperimentData& data) {
  absl::StatusOr<std::vector<ins::ClientRecord>> rows = reader.ListClients(data.experiment.id);
  if (!rows.ok()) return rows.status();
  std::map<std::string, int> name_count;
  for (ins::ClientRecord& r : *rows) {
    ClientInfo c;
    c.client_id = std::move(r.client_id);
    c.client_name = std::move(r.client_name);
    c.device_class = std::move(r.device_class);
    c.link_kind = r.link_kind.empty() ? "unknown" : std::move(r.link_kind);
    c.link_profile = std::move(r.link_profile);
    ++name_count[c.client_name];
    data.clients.push_back(std::move(c));
  }
  for (ClientInfo& c : data.clients) {
    c.label = (!c.client_name.empty() && name_count[c.client_name] == 1) ? c.client_name : c.client_id;
  }
  return absl::OkStatus();
}

absl::Status LoadRounds(ins::RecordReader& reader, ExperimentData& data) {
  absl::StatusOr<std::vector<ins::RoundRecord>> rows = reader.ListRounds(data.experiment.id);
  if (!rows.ok()) return rows.status();
  for (ins::RoundRecord& r : *rows) {
    RoundAttempt a;
    a.round = r.round;
    a.attempt = r.attempt;
    a.status = std::string(ins::RoundStatusName(r.status));
    a.failure_reason = std::move(r.failure_reason);
    a.started_unix_ms = r.started_unix_ms;
    a.ended_unix_ms = r.ended_unix_ms;
    a.duration_ms = r.duration_ms;
    a.aggregation_ms = r.aggregation_ms;
    a.num_selected = r.num_selected;
    a.num_accepted = r.num_accepted;
    a.num_late = r.num_late;
    a.num_rejected = r.num_rejected;
    a.num_dropped = r.num_dropped;
    a.eval_loss = r.eval_loss;
    a.eval_accuracy = r.eval_accuracy;
    a.eval_mae = r.eval_mae;
    a.eval_perplexity = r.eval_perplexity;
    a.dp_epsilon = r.dp_epsilon;
    a.dp_clip_norm = r.dp_clip_norm;
    a.secagg_survivors = r.secagg_survivors;
    a.secagg_dropped = r.secagg_dropped;
    data.rounds.push_back(std::move(a));
  }
  return absl::OkStatus();
}

absl::Status LoadClientRounds(ins::RecordReader& reader, ExperimentData& data) {
  // The phase starts on the server's timeline came with v3; before, phases are laid end to end from dispatch.
  data.has_phase_starts = true;
  for (const char* name : {"downlink_start_unix_ms", "train_start_unix_ms", "eval_start_unix_ms",
                           "uplink_start_unix_ms", "uplink_end_unix_ms"}) {
    data.has_phase_starts = data.has_phase_starts && reader.HasColumn("client_rounds", name);
  }
  // In the order they were written within each round attempt: write_order counts them.
  absl::StatusOr<std::vector<ins::ClientRoundRecord>> rows = reader.ListClientRounds(data.experiment.id);
  if (!rows.ok()) return rows.status();
  std::map<std::pair<int64_t, int64_t>, RoundAttempt*> by_key;
  for (RoundAttempt& r : data.rounds) by_key[{r.round, r.attempt}] = &r;
  int64_t write_order = 0;
  for (ins::ClientRoundRecord& r : *rows) {
    auto it = by_key.find({r.round, r.attempt});
    if (it == by_key.end()) continue;  // the foreign key makes this impossible in a database fl-server wrote
    ClientRoundRow c;
    c.client_id = std::move(r.client_id);
    c.outcome = std::string(ins::ClientOutcomeName(r.outcome));
    c.reject_reason = std::move(r.reject_reason);
    c.dispatched_unix_ms = r.dispatched_unix_ms;
    c.downlink_ms = r.downlink_ms;
    c.train_ms = r.train_ms;
    c.eval_ms = r.eval_ms;
    c.uplink_ms = r.uplink_ms;
    c.uplink_server_ms = r.uplink_server_ms;
    c.idle_ms = r.idle_ms;
    c.downlink_bytes = r.downlink_bytes;
    c.uplink_bytes = r.uplink_bytes;
    c.codec = std::move(r.codec);
    c.write_order = write_order++;
    c.clock_offset_ms = r.clock_offset_ms;
    c.downlink_start_unix_ms = r.downlink_start_unix_ms;
    c.train_start_unix_ms = r.train_start_unix_ms;
    c.eval_start_unix_ms = r.eval_start_unix_ms;
    c.uplink_start_unix_ms = r.uplink_start_unix_ms;
    c.uplink_end_unix_ms = r.uplink_end_unix_ms;
    c.uplink_server_start_unix_ms = r.uplink_server_start_unix_ms;
    it->second->clients.push_back(std::move(c));
  }
  return absl::OkStatus();
}

absl::Status LoadEvaluations(ins::RecordReader& reader, ExperimentData& data) {
  absl::StatusOr<std::vector<ins::EvaluationRecord>> rows = reader.ListEvaluations(data.experiment.id);
  if (!rows.ok()) return rows.status();
  for (ins::EvaluationRecord& r : *rows) {
    EvaluationRow e;
    e.round = r.round;
    e.attempt = r.attempt;
    e.client_id = std::move(r.client_id);
    e.eval_ms = r.eval_ms;
    e.accuracy = r.accuracy;
    e.loss = r.loss;
    e.mae = r.mae;
    e.reject_reason = std::move(r.reject_reason);
    data.evaluations.push_back(std::move(e));
  }
  return absl::OkStatus();
}

absl::Status LoadClientEvents(ins::RecordReader& reader, ExperimentData& data) {
  absl::StatusOr<std::vector<ins::ClientEventRecord>> rows = reader.ListClientEvents(data.experiment.id);
  if (!rows.ok()) return rows.status();
  for (ins::ClientEventRecord& r : *rows) {
    data.client_events.push_back(ClientEventRow{std::move(r.client_id), std::string(ins::ClientEventKindName(r.kind)),
                                                r.round, std::move(r.task_id), std::move(r.reason), r.at_unix_ms});
  }
  return absl::OkStatus();
}

absl::Status LoadSecurityEvents(ins::RecordReader& reader, ExperimentData& data) {
  absl::StatusOr<std::vector<ins::SecurityEventRecord>> rows = reader.ListSecurityEvents(data.experiment.id);
  if (!rows.ok()) return rows.status();
  for (ins::SecurityEventRecord& r : *rows) {
    data.security_events.push_back(SecurityEventRow{std::string(ins::SecurityRefusalName(r.reason)), std::move(r.peer),
                                                    std::move(r.identity), std::move(r.claimed), std::move(r.detail),
                                                    r.at_unix_ms});
  }
  return absl::OkStatus();
}

absl::Status LoadSecAggStages(ins::RecordReader& reader, ExperimentData& data) {
  absl::StatusOr<std::vector<ins::SecAggStageRecord>> rows = reader.ListSecAggStages(data.experiment.id);
  if (!rows.ok()) return rows.status();
  for (ins::SecAggStageRecord& r : *rows) {
    data.secagg_stages.push_back(SecAggStageRow{r.round, r.attempt, std::move(r.client_id),
                                                std::string(ins::SecAggStageName(r.stage)),
                                                std::string(ins::SecAggStageOutcomeName(r.outcome)), r.started_unix_ms,
                                                r.duration_ms, r.bytes_down, r.bytes_up, std::move(r.detail)});
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

absl::Status CheckRecordsDatabase(const std::string& db_path) { return OpenRecords(db_path).status(); }

absl::StatusOr<std::vector<ExperimentInfo>> ListExperiments(const std::string& db_path) {
  absl::StatusOr<std::unique_ptr<ins::RecordReader>> reader = OpenRecords(db_path);
  if (!reader.ok()) return reader.status();
  return ReadExperiments(**reader);
}

absl::StatusOr<ExperimentData> LoadExperiment(const std::string& db_path, std::string_view experiment_id) {
  ExperimentData data;
  data.db_path = db_path;
  absl::StatusOr<std::unique_ptr<ins::RecordReader>> opened = OpenRecords(db_path);
  if (!opened.ok()) return opened.status();
  ins::RecordReader& reader = **opened;
  data.schema_version = reader.schema_version();
  // One read transaction: every table comes from the same snapshot while fl-server may be writing.
  absl::StatusOr<ins::RecordReader::Snapshot> snapshot = reader.ReadSnapshot();
  if (!snapshot.ok()) return snapshot.status();
  absl::StatusOr<std::vector<ExperimentInfo>> all = ReadExperiments(reader);
  if (!all.ok()) return all.status();
  if (all->empty()) {
    return absl::FailedPreconditionError(fl::StrCat("records database ", db_path,
                                                    " holds no experiments yet: start fl-server with --db ", db_path,
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
  if (absl::Status s = LoadClients(reader, data); !s.ok()) return s;
  if (absl::Status s = LoadRounds(reader, data); !s.ok()) return s;
  if (data.rounds.empty()) {
    return absl::FailedPreconditionError(
        fl::StrCat("experiment '", data.experiment.id, "' in ", db_path, " has no rounds recorded (status ",
                   data.experiment.status, ", ", data.clients.size(),
                   " clients joined): nothing to report yet; wait for its first round to end, or pick another with "
                   "--experiment:",
                   DescribeExperiments(*all)));
  }
  if (absl::Status s = LoadClientRounds(reader, data); !s.ok()) return s;
  if (absl::Status s = LoadEvaluations(reader, data); !s.ok()) return s;
  if (absl::Status s = LoadClientEvents(reader, data); !s.ok()) return s;
  if (absl::Status s = LoadSecurityEvents(reader, data); !s.ok()) return s;
  if (absl::Status s = LoadSecAggStages(reader, data); !s.ok()) return s;
  return data;
}

}  // namespace fl::report
