// The typed records that fl-server writes for every experiment, one struct per kind.
//
// Units are in the field names and match the columns of docs/records.md: `*_unix_ms` are wall-clock
// timestamps in milliseconds since the Unix epoch (server clock unless said otherwise), `*_ms` are
// durations in milliseconds measured with a monotonic clock where they happen, `*_bytes` are bytes.
// std::optional fields are NULL in the database when not set ("not measured" / "does not apply"); for the
// optional text fields an empty string means NULL.
//
// Parents must be enqueued before their children (experiment -> client/round -> client_round/evaluation):
// foreign keys are checked per row, in the order rows were enqueued.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace fl::instrumentation {

enum class ExperimentStatus { kRunning, kFinished, kFailed, kAborted };
enum class RoundStatus { kCommitted, kFailed, kAborted };
// kCancelled (schema v9): over-commitment cancelled the task once the round had its updates; whatever work the
// client reported is kept in the row. kFolded (schema v9): a late update folded into a later round's aggregate
// (ClientRoundRecord::folded_into_round names that round).
enum class ClientOutcome { kOk, kLate, kDropped, kRejected, kCancelled, kFolded };

// The spelling stored in the database: "running", "committed", "late", ...
std::string_view ExperimentStatusName(ExperimentStatus status);
std::string_view RoundStatusName(RoundStatus status);
std::string_view ClientOutcomeName(ClientOutcome outcome);
absl::StatusOr<ExperimentStatus> ParseExperimentStatus(std::string_view name);
absl::StatusOr<RoundStatus> ParseRoundStatus(std::string_view name);
absl::StatusOr<ClientOutcome> ParseClientOutcome(std::string_view name);

// One row of `experiments`, inserted when the experiment starts.
struct ExperimentRecord {
  std::string id;  // unique across databases: e.g. "<name>-<utc timestamp>-<random>"
  std::string name;
  ExperimentStatus status = ExperimentStatus::kRunning;
  std::string status_reason;  // why it failed / was aborted; "" = none
  int64_t started_unix_ms = 0;
  std::optional<int64_t> finished_unix_ms;
  std::string config_json = "{}";  // the resolved manifest/configuration, as JSON
  std::string software_version;    // fl-server version (and git revision when known)
  std::string host;                // where fl-server ran; "" = unknown
  // Schema v6: "classification", "regression" or "next-token" (fl::core::TaskName); "" = not known yet (no
  // client admitted; fl-server sets it with an ExperimentTaskUpdate when its first client joins).
  std::string task;
  // Schema v9: "synchronous" (rounds) or "buffered" (FedBuff: each `rounds` row is one aggregation step); "" =
  // NULL, which experiments recorded before v9 hold and which reads as synchronous (kAggregation* below).
  std::string aggregation;

  bool operator==(const ExperimentRecord&) const = default;
};

// The stored names of experiments.aggregation (schema v9).
inline constexpr std::string_view kAggregationSynchronous = "synchronous";
inline constexpr std::string_view kAggregationBuffered = "buffered";

// Sets the experiment's learning task once the first client has been admitted (the experiment row is
// written before any client joins). The experiment must exist.
struct ExperimentTaskUpdate {
  std::string experiment_id;
  std::string task;  // fl::core::TaskName

  bool operator==(const ExperimentTaskUpdate&) const = default;
};

// Updates an experiment's status (finish, fail, abort, or back to running on --resume). The experiment
// must exist; an update of an unknown experiment is reported as NotFound.
struct ExperimentStatusUpdate {
  std::string experiment_id;
  ExperimentStatus status = ExperimentStatus::kFinished;
  std::string status_reason;
  std::optional<int64_t> finished_unix_ms;  // NULL while running

  bool operator==(const ExperimentStatusUpdate&) const = default;
};

// One row of `clients`: a client admitted to an experiment, with what it reported about itself. A client
// that joins again (a restart, a resumed server) updates its row: what it reports now replaces what it
// reported before, and left_* is cleared.
struct ClientRecord {
  std::string experiment_id;
  std::string client_id;       // the server-assigned id, unique within the experiment
  std::string client_name;     // the name the client registered with (host name, manifest name)
  std::string device_class;    // rpi4, rpi5, gpu, cpu, ...
  std::string link_kind;       // ethernet, wifi, 5g, loopback, ...
  std::string link_interface;  // the network interface, e.g. eth0, wlan0, veth-c3
  std::string link_profile;    // the emulated link profile name; "" = a real, unshaped link
  std::optional<int64_t> cores;
  std::optional<int64_t> memory_bytes;
  std::string accelerator;     // e.g. "cuda:NVIDIA H100 80GB HBM3"; "" = none (CPU only)
  std::string os;              // e.g. "Debian GNU/Linux 12"
  std::string arch;            // e.g. aarch64, x86_64
  std::string client_version;  // fl-client version
  int64_t joined_unix_ms = 0;
  std::optional<int64_t> left_unix_ms;
  std::string left_reason;

  bool operator==(const ClientRecord&) const = default;
};

// Marks a client as gone (disconnect, eviction, end of experiment). The client must exist.
struct ClientLeftRecord {
  std::string experiment_id;
  std::string client_id;
  int64_t left_unix_ms = 0;
  std::string reason;

  bool operator==(const ClientLeftRecord&) const = default;
};

// Deletes the row of a client that joined but never had a task, when fl-server forgets it (it keeps at most
// --max-idle-newcomers such clients: docs/security.md, "Abuse limits"). Its client_events rows go with it (ON DELETE
// CASCADE). A client with client_rounds, evaluations or secagg_stages rows is never deleted: the statement checks,
// and deletes nothing then. Deleting nothing is not an error (the row may already be gone).
struct ClientForgottenRecord {
  std::string experiment_id;
  std::string client_id;

  bool operator==(const ClientForgottenRecord&) const = default;
};

// One row of `rounds`: one attempt at one round, written when the attempt ends. A failed or aborted
// attempt is retried as attempt + 1; a round is committed at most once (the database enforces both).
struct RoundRecord {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  RoundStatus status = RoundStatus::kCommitted;
  std::string failure_reason;            // "" when committed
  int64_t started_unix_ms = 0;           // dispatch of the first task
  int64_t ended_unix_ms = 0;             // commit, or when the attempt was given up
  double duration_ms = 0;                // dispatch -> commit (or -> given up), monotonic
  std::optional<double> aggregation_ms;  // finishing the aggregate + server optimizer step
  int64_t num_selected = 0;
  int64_t num_accepted = 0;
  int64_t num_late = 0;
  int64_t num_rejected = 0;
  int64_t num_dropped = 0;
  int64_t num_examples = 0;              // sum over accepted updates
  std::optional<int64_t> model_version;  // the global model version this attempt produced (required if committed)
  std::optional<double> train_loss;      // mean client train loss weighted by num_examples
  std::optional<double> eval_loss;       // global model, after the commit
  std::optional<double> eval_accuracy;   // in [0, 1]; classification and next-token (token accuracy)
  std::optional<int64_t> eval_num_examples;
  std::optional<double> eval_mae;         // schema v6: regression's mean absolute error, >= 0
  std::optional<double> eval_perplexity;  // schema v6: next-token's exp(eval_loss), >= 1
  // Schema v10, central differential privacy (docs/privacy.md); NULL without it. ε spent by the run up to and
  // including this round at the configured δ (RDP accountant), the clip norm C its updates were clipped to, and
  // the noise multiplier of the noise added to its aggregate (adaptive clipping: σ_Δ, less than the whole σ).
  std::optional<double> dp_epsilon;
  std::optional<double> dp_clip_norm;
  std::optional<double> dp_noise_multiplier;
  // Schema v11, secure aggregation (SecAgg+, docs/privacy.md); NULL without it. The clients whose masked updates
  // the unmasked sum holds, and the clients that took part in the round's first stage but are not in that sum
  // (dropped or refused at some stage, cancelled by over-commitment).
  std::optional<int64_t> secagg_survivors;
  std::optional<int64_t> secagg_dropped;

  bool operator==(const RoundRecord&) const = default;
};

// Sets the global evaluation of a round attempt (federated evaluation runs after the commit, so the round's
// row exists before its evaluation is known). The row must exist.
struct RoundEvaluationUpdate {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  double eval_loss = 0;
  std::optional<double> eval_accuracy;  // in [0, 1]; none for regression
  int64_t eval_num_examples = 0;
  std::optional<double> eval_mae;         // regression (schema v6)
  std::optional<double> eval_perplexity;  // next-token (schema v6)

  bool operator==(const RoundEvaluationUpdate&) const = default;
};

// One row of `client_rounds`: one client's part in one round attempt.
struct ClientRoundRecord {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  std::string client_id;
  ClientOutcome outcome = ClientOutcome::kOk;
  std::string reject_reason;                  // only with outcome kRejected; "" otherwise
  std::optional<int64_t> dispatched_unix_ms;  // server clock
  std::optional<int64_t> num_examples;
  std::optional<int64_t> num_steps;        // local optimizer steps
  std::optional<double> downlink_ms;       // client view: request -> last byte of the model received
  std::optional<double> train_ms;          // client view
  std::optional<double> eval_ms;           // client view, local evaluation when asked
  std::optional<double> uplink_ms;         // client view: first byte sent -> server ack
  std::optional<double> uplink_server_ms;  // server view: first byte received -> last byte received
  std::optional<double> idle_ms;           // client waited on the server or the link, not computing
  std::optional<int64_t> downlink_bytes;   // on the wire, server -> client
  std::optional<int64_t> uplink_bytes;     // on the wire, client -> server
  std::string codec;                       // update codec, e.g. fp32, int8-blockwise; "" = unknown
  std::optional<double> train_loss;        // mean local train loss over this round's steps
  std::optional<double> clock_offset_ms;   // client clock minus server clock (min-rtt exchange); schema v2
  std::optional<double> clock_rtt_ms;      // round trip of that exchange: the offset is good to +- rtt/2
  // Schema v3: phase starts on the server's timeline (unix ms with a fraction; client monotonic time minus
  // its clock offset, mapped to the server's wall clock). A phase ends at its start plus its *_ms duration.
  std::optional<double> downlink_start_unix_ms;
  std::optional<double> train_start_unix_ms;
  std::optional<double> eval_start_unix_ms;
  std::optional<double> uplink_start_unix_ms;           // client: first byte of the update sent
  std::optional<double> uplink_end_unix_ms;             // client: the server's ack received
  std::optional<double> uplink_server_start_unix_ms;    // server: first byte of the update received
  std::optional<double> downlink_server_start_unix_ms;  // server: the download request arrived
  std::optional<double> downlink_server_ms;             // server: request -> last message handed to gRPC
  // Schema v9 (stragglers, asynchrony): the global model version the update was trained from; the versions
  // between it and the model the update was applied to (>= 0); the discount its weight was multiplied by (NULL =
  // none); for outcome kFolded, the round whose aggregate took the late update (NULL otherwise).
  std::optional<int64_t> base_model_version;
  std::optional<int64_t> staleness;
  std::optional<double> staleness_weight;
  std::optional<int64_t> folded_into_round;

  bool operator==(const ClientRoundRecord&) const = default;
};

// Sets the client's own view of the uplink of a client round already written (the client can only measure
// it after the server acknowledged the update, so it arrives after the row). The row must exist.
struct ClientRoundUplinkUpdate {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  std::string client_id;
  double uplink_ms = 0;                        // client view: first byte of the update sent -> server ack
  std::optional<double> uplink_start_unix_ms;  // the same phase on the server's timeline (schema v3)
  std::optional<double> uplink_end_unix_ms;

  bool operator==(const ClientRoundUplinkUpdate&) const = default;
};

// One row of `evaluations`: one client's evaluation of the global model in one round attempt.
struct EvaluationRecord {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  std::string client_id;
  int64_t num_examples = 0;
  std::optional<double> loss;
  std::optional<double> accuracy;  // in [0, 1]
  std::optional<double> eval_ms;   // client view
  std::optional<double> mae;       // schema v6: regression's mean absolute error
  // Schema v6: why the server refused the result (a non-finite or out-of-range figure); "" = accepted. A
  // refused result is recorded with its eval_ms and without figures, and counts in no round's evaluation.
  std::string reject_reason;

  bool operator==(const EvaluationRecord&) const = default;
};

// One row of `checkpoints`: a global model saved after a committed round.
struct CheckpointRecord {
  std::string experiment_id;
  int64_t round = 0;
  int64_t model_version = 0;
  std::string path;         // as written by fl-server (absolute, or relative to its working directory)
  int64_t bytes = 0;        // file size
  std::string fingerprint;  // ModelSpec fingerprint, 16 lowercase hex digits (fl::core::FingerprintToHex)
  std::string checksum;     // Checksum64 of the file's bytes, hex; "" = not computed
  int64_t created_unix_ms = 0;

  bool operator==(const CheckpointRecord&) const = default;
};

// A round's commit: its `rounds` row, its `client_rounds` rows and the `checkpoints` row of the model it produced,
// stored as ONE unit (a savepoint inside the writer's transaction): all of them land, or none does and the
// whole commit is reported as one error. So the records never hold a committed round whose client rows or
// checkpoint row are missing, and --resume never finds a checkpoint row of a round that did not commit.
struct RoundCommitRecord {
  RoundRecord round;
  std::vector<ClientRoundRecord> client_rounds;
  std::optional<CheckpointRecord> checkpoint;  // none when fl-server writes no checkpoints
  // Schema v9: rows of EARLIER rounds replaced whole in the same unit: the late updates this round's aggregate
  // folded in (outcome kFolded, folded_into_round = this round), whose rows their own round's commit wrote as
  // kLate. Written after the checkpoint; a row is inserted if its round's commit wrote none.
  std::vector<ClientRoundRecord> folded_rows;
};

// A committed round's federated evaluation, stored as one unit like RoundCommitRecord: every client's
// `evaluations` row and the round's figures (absent when no result was accepted). --resume redoes an
// evaluation that has neither.
struct EvaluationCommitRecord {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  std::vector<EvaluationRecord> evaluations;
  std::optional<RoundEvaluationUpdate> figures;
};

// fl-server --resume-from-round N: rounds after N that were committed are re-run from N's checkpoint, so their
// committed attempts become `aborted` with `reason` (the rows stay; the re-run commits a new attempt).
struct RoundsSupersededUpdate {
  std::string experiment_id;
  int64_t after_round = 0;
  std::string reason;
};

// What fl-server refused or took from a client outside its client_rounds row (schema v7, table client_events).
enum class ClientEventKind {
  kReportRefused,        // a client-reported figure failed validation (clock pong, uplink report, ...)
  kUploadRevoked,        // an upload lost its slot (too slow, stalled)
  kInitialModelReasked,  // the client asked for the initial model did not deliver; another was asked
  kSessionClosed,        // the server closed the client's session for a limit (rate, queue, hello timeout)
};
std::string_view ClientEventKindName(
    ClientEventKind kind);  // "report_refused", "upload_revoked", "initial_model_reasked", "session_closed"
absl::StatusOr<ClientEventKind> ParseClientEventKind(std::string_view name);

// The most bytes of ClientEventRecord::reason the store keeps: a longer reason is cut at a UTF-8 character
// boundary and ends in "..." (a client's figures in it must not make the row unbounded).
inline constexpr size_t kMaxClientEventReasonBytes = 1024;

// One row of `client_events` (schema v7): something fl-server refused from or did to a client, recorded with
// why, so that a refusal is never only a log line. The client must exist in `clients`.
struct ClientEventRecord {
  std::string experiment_id;
  std::string client_id;  // must exist in clients
  ClientEventKind kind = ClientEventKind::kReportRefused;
  std::optional<int64_t> round;  // the round it concerns, if any
  std::string task_id;           // "" when none
  std::string reason;            // human-readable; the store bounds it to 1024 bytes
  int64_t at_unix_ms = 0;

  bool operator==(const ClientEventRecord&) const = default;
};

// Why fl-server refused a peer on the secure federation channel (schema v8, table security_events). The stored
// names (and the Prometheus label) are the snake_case after each.
enum class SecurityRefusal {
  kNameMismatch,        // "name_mismatch": a Join claiming another name than the client's certificate
  kWrongIdentity,       // "wrong_identity": a call acting for another client than the certificate's (session,
                        //   download, upload, leave)
  kRevokedCertificate,  // "revoked_certificate": a call with a revoked certificate, or a session closed because
                        //   its certificate was revoked
  kBadToken,            // "bad_token": an unknown client id or a wrong session token
  kJoinRate,            // "join_rate": Joins beyond the per-peer or per-identity rate
  kSessionLimit,        // "session_limit": concurrent sessions beyond the per-peer or per-identity limit
  kUploadLimit,         // "upload_limit": concurrent uploads beyond the per-peer or per-identity limit
  kStreamDeadline,      // "stream_deadline": a stream cut off for a deadline (no first message, a message too late)
  kSecAgg,              // "secagg" (schema v11): a secure-aggregation message refused: from a client not in the
                        //   round, for another round, duplicated, of the wrong length, failing authentication, a bad
                        //   key, or out of stage
};
std::string_view SecurityRefusalName(SecurityRefusal r);
absl::StatusOr<SecurityRefusal> ParseSecurityRefusal(std::string_view name);

// The most bytes the store keeps of SecurityEventRecord's texts that a peer controls: a longer one is cut like a
// client event's reason (BoundText). gRPC peer strings and client names are far shorter; the bounds only keep a
// hostile peer from making rows unbounded.
inline constexpr size_t kMaxSecurityEventPeerBytes = 256;     // peer, claimed
inline constexpr size_t kMaxSecurityEventDetailBytes = 1024;  // detail (= kMaxClientEventReasonBytes)

// One row of `security_events` (schema v8): a call fl-server refused or a stream it cut for the channel's
// security (identity, revocation, tokens, rate and concurrency limits, deadlines), recorded with who asked and
// what they were told. No client row is required: most refused peers never became clients.
struct SecurityEventRecord {
  int64_t id = 0;  // filled by the database when written (like client_events.id); ignored by the store
  std::string experiment_id;
  SecurityRefusal reason = SecurityRefusal::kNameMismatch;
  std::string peer;      // gRPC's peer string, e.g. "ipv4:127.0.0.1:50514"; stored bounded to 256 bytes
  std::string identity;  // the certificate's name; "" (NULL) over plaintext
  std::string claimed;   // the client name/id the request claimed; "" (NULL) when none; stored bounded to 256 bytes
  std::string detail;    // the refusal's message as sent to the peer; stored bounded to 1024 bytes
  int64_t at_unix_ms = 0;

  bool operator==(const SecurityEventRecord&) const = default;
};

// The stages of a secure-aggregation round (SecAgg+, schema v11), in their order.
enum class SecAggStage { kAdvertiseKeys, kShareKeys, kMaskedUpload, kUnmask };
// "advertise_keys", "share_keys", "masked_upload", "unmask".
std::string_view SecAggStageName(SecAggStage s);
absl::StatusOr<SecAggStage> ParseSecAggStage(std::string_view name);

// How a client's part in one stage ended.
enum class SecAggStageOutcome {
  kOk,       // "ok": the client answered in time and its answer was accepted
  kDropped,  // "dropped": no answer by the stage's deadline, or the client left
  kRefused,  // "refused": its message was refused (a security_events row with reason 'secagg' says why)
};
std::string_view SecAggStageOutcomeName(SecAggStageOutcome o);  // "ok", "dropped", "refused"
absl::StatusOr<SecAggStageOutcome> ParseSecAggStageOutcome(std::string_view name);

// The most bytes the store keeps of SecAggStageRecord::detail (cut like a client event's reason).
inline constexpr size_t kMaxSecAggDetailBytes = 1024;

// One row of `secagg_stages` (schema v11): one client's part in one stage of a secure round attempt, as the server
// saw it. Written after the round attempt's `rounds` row (its parent: the row references it), at the commit or when
// the attempt fails. The client must exist in `clients`.
struct SecAggStageRecord {
  std::string experiment_id;
  int64_t round = 0;
  int64_t attempt = 0;
  std::string client_id;
  SecAggStage stage = SecAggStage::kAdvertiseKeys;
  SecAggStageOutcome outcome = SecAggStageOutcome::kOk;
  std::optional<double> started_unix_ms;  // when the server sent the stage's message to the client (server clock)
  std::optional<double> duration_ms;      // from then to the client's answer (server clock, >= 0); NULL: no answer
  int64_t bytes_down = 0;                 // serialized bytes the server sent the client in this stage (>= 0)
  int64_t bytes_up = 0;                   // serialized bytes accepted from the client in this stage (>= 0)
  std::string detail;                     // why dropped/refused; "" (NULL) for ok; stored bounded to 1024 bytes

  bool operator==(const SecAggStageRecord&) const = default;
};

using Record =
    std::variant<ExperimentRecord, ExperimentStatusUpdate, ClientRecord, ClientLeftRecord, RoundRecord,
                 RoundEvaluationUpdate, ClientRoundRecord, ClientRoundUplinkUpdate, EvaluationRecord, CheckpointRecord,
                 ExperimentTaskUpdate, RoundCommitRecord, EvaluationCommitRecord, RoundsSupersededUpdate,
                 ClientEventRecord, SecurityEventRecord, ClientForgottenRecord, SecAggStageRecord>;

// "round (experiment e1, round 3, attempt 0)": names a record in errors.
std::string DescribeRecord(const Record& record);

// `text` cut to at most `max_bytes` bytes: a longer text is cut at a UTF-8 character boundary and ends in "..."
// (when max_bytes leaves room for it). What the store writes for the bounded texts of client and security events.
std::string BoundText(std::string_view text, size_t max_bytes);
// `reason` cut to at most kMaxClientEventReasonBytes bytes (what the store writes for a ClientEventRecord).
std::string BoundClientEventReason(std::string_view reason);

}  // namespace fl::instrumentation
