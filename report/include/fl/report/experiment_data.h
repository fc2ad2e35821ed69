// Loading one experiment out of a records database (the SQLite file fl-server --db writes) for fl-report.
//
// Reads through instrumentation's RecordReader (OpenAnyVersion) on a read-only connection of its own, in one
// snapshot, never blocks a running fl-server (WAL), and reads every schema version from 1 to this build's latest
// without migrating it: columns added by later migrations (clock offsets in v2, phase start times on the
// server's timeline in v3) read as NULL and tables added later (client events in v7, security events in v8,
// secure-aggregation stages in v11) as empty
// when the database predates them, so reports of old runs keep working (v6's task reads as classification: every
// experiment before it trained a classifier).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::report {

struct ExperimentInfo {
  std::string id;
  std::string name;
  std::string status;  // running, finished, failed, aborted
  std::string status_reason;
  int64_t started_unix_ms = 0;
  std::optional<int64_t> finished_unix_ms;
  std::string software_version;
  std::string host;
  int64_t num_rounds = 0;  // rows in `rounds` (all attempts)
  // experiments.task (v6): classification, regression or next-token; "classification" when NULL (not known
  // yet, or a database from before tasks, whose experiments were all classifiers).
  std::string task = "classification";
  // experiments.aggregation (v9): "synchronous" (rounds) or "buffered" (each rounds row is an aggregation step);
  // "synchronous" when NULL (a database from before v9, whose experiments were all synchronous).
  std::string aggregation = "synchronous";
};

struct ClientInfo {
  std::string client_id;
  std::string client_name;
  std::string device_class;
  std::string link_kind;  // "unknown" when the database has NULL
  std::string link_profile;
  // The name shown in tables and plots: the client's own name when it is unique in the experiment, else its id.
  std::string label;
};

// One row of client_rounds. Durations in ms; *_unix_ms on the server's clock.
struct ClientRoundRow {
  std::string client_id;
  std::string outcome;  // ok, late, dropped, rejected, cancelled, folded (schema v9)
  std::string reject_reason;
  std::optional<int64_t> dispatched_unix_ms;
  std::optional<double> downlink_ms;
  std::optional<double> train_ms;
  std::optional<double> eval_ms;
  std::optional<double> uplink_ms;         // client view (first byte sent -> ack)
  std::optional<double> uplink_server_ms;  // server view (first byte received -> last byte received)
  std::optional<double> idle_ms;
  std::optional<int64_t> downlink_bytes;
  std::optional<int64_t> uplink_bytes;
  std::string codec;
  std::optional<double> clock_offset_ms;  // v2
  // v3: phase starts already placed on the server's timeline (NULL in older databases).
  std::optional<double> downlink_start_unix_ms;
  std::optional<double> train_start_unix_ms;
  std::optional<double> eval_start_unix_ms;
  std::optional<double> uplink_start_unix_ms;
  std::optional<double> uplink_end_unix_ms;
  std::optional<double> uplink_server_start_unix_ms;
  // Rows of a round are written in the order the server decided their outcome, i.e. the order updates finished
  // arriving: this row's place in that order (increasing within a round attempt). Used only to break ties
  // between equal arrival estimates.
  int64_t write_order = 0;

  bool accepted() const { return outcome == "ok"; }
  // The uplink time the report uses: the client's view (to the server's ack, as the study measured it on the
  // node) when it was reported, else the server's view of the same transfer.
  std::optional<double> uplink() const { return uplink_ms.has_value() ? uplink_ms : uplink_server_ms; }
};

// One row of `rounds` (one attempt at a round) and its client rows.
struct RoundAttempt {
  int64_t round = 0;
  int64_t attempt = 0;
  std::string status;  // committed, failed, aborted
  std::string failure_reason;
  int64_t started_unix_ms = 0;
  int64_t ended_unix_ms = 0;
  double duration_ms = 0;
  std::optional<double> aggregation_ms;
  int64_t num_selected = 0;
  int64_t num_accepted = 0;
  int64_t num_late = 0;
  int64_t num_rejected = 0;
  int64_t num_dropped = 0;
  std::optional<double> eval_loss;
  std::optional<double> eval_accuracy;      // classification; next-token's token accuracy
  std::optional<double> eval_mae;           // regression (v6)
  std::optional<double> eval_perplexity;    // next-token (v6)
  std::optional<double> dp_epsilon;         // central differential privacy (v10): ε spent up to this round
  std::optional<double> dp_clip_norm;       // (v10) the C its updates were clipped to
  std::optional<int64_t> secagg_survivors;  // secure aggregation (v11): clients in the unmasked sum
  std::optional<int64_t> secagg_dropped;    // (v11) clients that dropped out of it
  std::vector<ClientRoundRow> clients;      // by write order

  bool committed() const { return status == "committed"; }
};

// One row of `evaluations`: a client's evaluation of the global model (federated evaluation, after a commit).
struct EvaluationRow {
  int64_t round = 0;
  int64_t attempt = 0;
  std::string client_id;
  std::optional<double> eval_ms;
  std::optional<double> accuracy;
  std::optional<double> loss;
  std::optional<double> mae;  // v6
  std::string reject_reason;  // v6: why fl-server refused the result; "" = accepted
};

// One row of `client_events` (v7): something fl-server refused from or did to a client outside its round rows.
struct ClientEventRow {
  std::string client_id;
  std::string kind;  // report_refused, upload_revoked, initial_model_reasked, session_closed
  std::optional<int64_t> round;
  std::string task_id;  // "" when none
  std::string reason;
  int64_t at_unix_ms = 0;
};

// One row of `security_events` (v8): a call fl-server refused, or a stream it cut, on the secure federation
// channel. Most refused peers never became clients, so the row names the peer, not a client.
struct SecurityEventRow {
  std::string reason;    // name_mismatch, wrong_identity, revoked_certificate, bad_token, join_rate, session_limit,
                         // upload_limit, stream_deadline
  std::string peer;      // gRPC's peer string: "ipv4:127.0.0.1:50514"
  std::string identity;  // the certificate's name; "" over plaintext
  std::string claimed;   // the client name or id the call claimed; "" when none
  std::string detail;    // what the peer was told
  int64_t at_unix_ms = 0;
};

// One row of `secagg_stages` (v11): one client's part in one stage of a secure-aggregation round attempt.
struct SecAggStageRow {
  int64_t round = 0;
  int64_t attempt = 0;
  std::string client_id;
  std::string stage;    // advertise_keys, share_keys, masked_upload, unmask
  std::string outcome;  // ok, dropped, refused
  std::optional<double> started_unix_ms;
  std::optional<double> duration_ms;  // server clock, message sent -> answer; none without an answer
  int64_t bytes_down = 0;
  int64_t bytes_up = 0;
  std::string detail;  // why dropped/refused; "" for ok
};

struct ExperimentData {
  std::string db_path;
  int schema_version = 0;
  bool has_phase_starts = false;  // the database has the v3 phase start columns
  ExperimentInfo experiment;
  std::vector<ClientInfo> clients;                // by join time
  std::vector<RoundAttempt> rounds;               // by (round, attempt)
  std::vector<EvaluationRow> evaluations;         // by (round, attempt, client_id)
  std::vector<ClientEventRow> client_events;      // by time (empty before v7)
  std::vector<SecurityEventRow> security_events;  // by time (empty before v8)
  std::vector<SecAggStageRow> secagg_stages;      // by (round, attempt, client, stage order) (empty before v11)

  // nullptr for an id not in `clients`.
  const ClientInfo* FindClient(std::string_view client_id) const;
};

// Whether `db_path` can be read as a records database at all (exists, a regular file: not a FIFO or a device,
// SQLite, a records schema this build reads), with the error naming the file; fl-report exits 2 (bad input) on
// it before reading anything else.
absl::Status CheckRecordsDatabase(const std::string& db_path);

// Every experiment in the database, oldest first. Errors: NotFound (no such file), FailedPrecondition (not a
// records database, or a newer schema than this build's).
absl::StatusOr<std::vector<ExperimentInfo>> ListExperiments(const std::string& db_path);

// Loads one experiment; `experiment_id` empty = the latest one (the last started). Errors name the path and
// what to do: NotFound for a missing file or an unknown experiment (listing the ones there are);
// FailedPrecondition for a file that is not a records database, a database with no experiments, and an
// experiment with no rounds recorded.
absl::StatusOr<ExperimentData> LoadExperiment(const std::string& db_path, std::string_view experiment_id = "");

}  // namespace fl::report
