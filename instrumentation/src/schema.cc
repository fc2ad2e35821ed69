#include "fl/instrumentation/schema.h"

#include <string>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_columns.h"

namespace fl::instrumentation {
namespace {

// Schema v1. Column units are in the names (docs/records.md has every column): *_unix_ms = wall clock, ms
// since the Unix epoch; *_ms = a duration in ms (REAL); *_bytes = bytes (INTEGER).
constexpr std::string_view kSchemaV1 = R"sql(
CREATE TABLE experiments (
  id                TEXT    NOT NULL PRIMARY KEY,
  name              TEXT    NOT NULL,
  status            TEXT    NOT NULL DEFAULT 'running'
                            CHECK (status IN ('running', 'finished', 'failed', 'aborted')),
  status_reason     TEXT,
  started_unix_ms   INTEGER NOT NULL,
  finished_unix_ms  INTEGER,
  config_json       TEXT    NOT NULL DEFAULT '{}',
  software_version  TEXT    NOT NULL,
  host              TEXT
);

CREATE TABLE clients (
  experiment_id     TEXT    NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
  client_id         TEXT    NOT NULL,
  client_name       TEXT,
  device_class      TEXT,
  link_kind         TEXT,
  link_interface    TEXT,
  link_profile      TEXT,
  cores             INTEGER CHECK (cores IS NULL OR cores >= 0),
  memory_bytes      INTEGER CHECK (memory_bytes IS NULL OR memory_bytes >= 0),
  accelerator       TEXT,
  os                TEXT,
  arch              TEXT,
  client_version    TEXT,
  joined_unix_ms    INTEGER NOT NULL,
  left_unix_ms      INTEGER,
  left_reason       TEXT,
  PRIMARY KEY (experiment_id, client_id)
);

CREATE TABLE rounds (
  experiment_id     TEXT    NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
  round             INTEGER NOT NULL CHECK (round >= 0),
  attempt           INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
  status            TEXT    NOT NULL CHECK (status IN ('committed', 'failed', 'aborted')),
  failure_reason    TEXT,
  started_unix_ms   INTEGER NOT NULL,
  ended_unix_ms     INTEGER NOT NULL,
  duration_ms       REAL    NOT NULL CHECK (duration_ms >= 0),
  aggregation_ms    REAL    CHECK (aggregation_ms IS NULL OR aggregation_ms >= 0),
  num_selected      INTEGER NOT NULL DEFAULT 0 CHECK (num_selected >= 0),
  num_accepted      INTEGER NOT NULL DEFAULT 0 CHECK (num_accepted >= 0),
  num_late          INTEGER NOT NULL DEFAULT 0 CHECK (num_late >= 0),
  num_rejected      INTEGER NOT NULL DEFAULT 0 CHECK (num_rejected >= 0),
  num_dropped       INTEGER NOT NULL DEFAULT 0 CHECK (num_dropped >= 0),
  num_examples      INTEGER NOT NULL DEFAULT 0 CHECK (num_examples >= 0),
  model_version     INTEGER,
  train_loss        REAL,
  eval_loss         REAL,
  eval_accuracy     REAL,
  eval_num_examples INTEGER,
  PRIMARY KEY (experiment_id, round, attempt),
  CHECK (status <> 'committed' OR model_version IS NOT NULL)
);
-- A round is committed at most once; failed/aborted attempts of it may be many.
CREATE UNIQUE INDEX rounds_committed_once ON rounds (experiment_id, round) WHERE status = 'committed';

CREATE TABLE client_rounds (
  experiment_id       TEXT    NOT NULL,
  round               INTEGER NOT NULL,
  attempt             INTEGER NOT NULL,
  client_id           TEXT    NOT NULL,
  outcome             TEXT    NOT NULL CHECK (outcome IN ('ok', 'late', 'dropped', 'rejected')),
  reject_reason       TEXT    CHECK (reject_reason IS NULL OR outcome = 'rejected'),
  dispatched_unix_ms  INTEGER,
  num_examples        INTEGER CHECK (num_examples IS NULL OR num_examples >= 0),
  num_steps           INTEGER CHECK (num_steps IS NULL OR num_steps >= 0),
  downlink_ms         REAL,
  train_ms            REAL,
  eval_ms             REAL,
  uplink_ms           REAL,
  uplink_server_ms    REAL,
  idle_ms             REAL,
  downlink_bytes      INTEGER CHECK (downlink_bytes IS NULL OR downlink_bytes >= 0),
  uplink_bytes        INTEGER CHECK (uplink_bytes IS NULL OR uplink_bytes >= 0),
  codec               TEXT,
  train_loss          REAL,
  PRIMARY KEY (experiment_id, round, attempt, client_id),
  FOREIGN KEY (experiment_id, round, attempt) REFERENCES rounds (experiment_id, round, attempt)
    ON DELETE CASCADE,
  FOREIGN KEY (experiment_id, client_id) REFERENCES clients (experiment_id, client_id) ON DELETE CASCADE
);
CREATE INDEX client_rounds_by_client ON client_rounds (experiment_id, client_id);

CREATE TABLE evaluations (
  experiment_id     TEXT    NOT NULL,
  round             INTEGER NOT NULL,
  attempt           INTEGER NOT NULL,
  client_id         TEXT    NOT NULL,
  num_examples      INTEGER NOT NULL CHECK (num_examples >= 0),
  loss              REAL,
  accuracy          REAL,
  eval_ms           REAL,
  PRIMARY KEY (experiment_id, round, attempt, client_id),
  FOREIGN KEY (experiment_id, round, attempt) REFERENCES rounds (experiment_id, round, attempt)
    ON DELETE CASCADE,
  FOREIGN KEY (experiment_id, client_id) REFERENCES clients (experiment_id, client_id) ON DELETE CASCADE
);
CREATE INDEX evaluations_by_client ON evaluations (experiment_id, client_id);

CREATE TABLE checkpoints (
  experiment_id     TEXT    NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
  round             INTEGER NOT NULL CHECK (round >= 0),
  model_version     INTEGER NOT NULL,
  path              TEXT    NOT NULL,
  bytes             INTEGER NOT NULL CHECK (bytes >= 0),
  fingerprint       TEXT    NOT NULL,
  checksum          TEXT,
  created_unix_ms   INTEGER NOT NULL,
  PRIMARY KEY (experiment_id, round)
);
)sql";

// Version 2: the client's clock offset from the server (client minus server, from the minimum-rtt
// four-timestamp exchange) and that exchange's round trip, at the time of each client round, so that the
// client's timestamps can be placed on the server's timeline.
constexpr std::string_view kSchemaV2 = R"sql(
ALTER TABLE client_rounds ADD COLUMN clock_offset_ms REAL;
ALTER TABLE client_rounds ADD COLUMN clock_rtt_ms REAL CHECK (clock_rtt_ms IS NULL OR clock_rtt_ms >= 0);
)sql";

// Version 3: the phases of a client round placed on the server's timeline (wall clock, unix ms with a
// fraction): the client's monotonic timestamps minus the client's clock offset, mapped onto the server's wall
// clock through one (monotonic, wall) anchor per server run, so that durations between spans are exact and
// spans of different clients are comparable. The server's own views of the uplink (first byte received) and
// of the downlink (request arrived -> last message handed to gRPC) too.
constexpr std::string_view kSchemaV3 = R"sql(
ALTER TABLE client_rounds ADD COLUMN downlink_start_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN train_start_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN eval_start_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN uplink_start_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN uplink_end_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN uplink_server_start_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN downlink_server_start_unix_ms REAL;
ALTER TABLE client_rounds ADD COLUMN downlink_server_ms REAL
  CHECK (downlink_server_ms IS NULL OR downlink_server_ms >= 0);
)sql";

// Version 4: what fl-experiment ran: the manifest as written, with every profile resolved, its seed, the
// emulation backend and the build, so that `fl-experiment replay` can run an experiment again from its record
// alone. Written by fl-experiment before fl-server creates the experiment row, hence no foreign key.
constexpr std::string_view kSchemaV4 = R"sql(
CREATE TABLE experiment_manifests (
  experiment_id     TEXT    NOT NULL PRIMARY KEY,
  manifest_path     TEXT    NOT NULL,
  manifest_yaml     TEXT    NOT NULL,
  resolved_json     TEXT    NOT NULL,
  seed              INTEGER NOT NULL,
  backend           TEXT    NOT NULL,
  software_version  TEXT    NOT NULL,
  replay_of         TEXT,
  created_unix_ms   INTEGER NOT NULL
);
)sql";

// Version 5: cross-site islands (DiLoCo / Streaming DiLoCo, diloco/coord): one row per island admission,
// one per membership epoch of a sync, one per member of an epoch (docs/records.md, "Islands").
constexpr std::string_view kSchemaV5 = R"sql(
CREATE TABLE islands (
  experiment_id          TEXT    NOT NULL REFERENCES experiments(id),
  join_seq               INTEGER NOT NULL CHECK (join_seq >= 1),
  island_id              TEXT    NOT NULL,
  data_endpoint          TEXT    NOT NULL,
  state_endpoint         TEXT    NOT NULL,
  num_ranks              INTEGER NOT NULL CHECK (num_ranks >= 1),
  model_fingerprint      TEXT    NOT NULL,
  software_version       TEXT,
  device_class           TEXT,
  accelerator            TEXT,
  joined_unix_ms         INTEGER NOT NULL,
  late_join              INTEGER NOT NULL CHECK (late_join IN (0, 1)),
  state_source_island    TEXT,
  state_source_step      INTEGER,
  state_source_fragment  INTEGER,
  left_unix_ms           INTEGER,
  left_reason            TEXT,
  PRIMARY KEY (experiment_id, join_seq)
);
CREATE INDEX islands_by_island ON islands(experiment_id, island_id);
CREATE TABLE island_epochs (
  experiment_id     TEXT    NOT NULL REFERENCES experiments(id),
  epoch             INTEGER NOT NULL CHECK (epoch >= 1),
  step              INTEGER NOT NULL CHECK (step >= 0),
  fragment          INTEGER NOT NULL CHECK (fragment >= 0),
  attempt           INTEGER NOT NULL CHECK (attempt >= 0),
  members           TEXT    NOT NULL,
  num_members       INTEGER NOT NULL CHECK (num_members >= 1),
  outcome           TEXT    NOT NULL CHECK (outcome IN ('committed', 'retried', 'abandoned')),
  committed_hash    TEXT,
  num_applied       INTEGER NOT NULL CHECK (num_applied >= 0),
  num_failed        INTEGER NOT NULL CHECK (num_failed >= 0),
  num_mismatched    INTEGER NOT NULL CHECK (num_mismatched >= 0),
  barrier_ms        REAL    CHECK (barrier_ms IS NULL OR barrier_ms >= 0),
  formed_unix_ms    INTEGER NOT NULL,
  resolved_unix_ms  INTEGER NOT NULL,
  reason            TEXT,
  PRIMARY KEY (experiment_id, epoch),
  CHECK (outcome <> 'committed' OR committed_hash IS NOT NULL)
);
CREATE INDEX island_epochs_by_sync ON island_epochs(experiment_id, step, fragment);
CREATE TABLE island_syncs (
  experiment_id     TEXT    NOT NULL,
  epoch             INTEGER NOT NULL,
  island_id         TEXT    NOT NULL,
  join_seq          INTEGER NOT NULL,
  step              INTEGER NOT NULL CHECK (step >= 0),
  fragment          INTEGER NOT NULL CHECK (fragment >= 0),
  ring_index        INTEGER NOT NULL CHECK (ring_index >= 0),
  outcome           TEXT    NOT NULL CHECK (outcome IN ('applied', 'mismatch', 'failed', 'missing')),
  verdict           TEXT    NOT NULL CHECK (verdict IN ('commit', 'repair', 'retry', 'evicted')),
  inner_compute_ms  REAL    CHECK (inner_compute_ms IS NULL OR inner_compute_ms >= 0),
  exchange_ms       REAL    CHECK (exchange_ms IS NULL OR exchange_ms >= 0),
  wait_ms           REAL    CHECK (wait_ms IS NULL OR wait_ms >= 0),
  bytes_sent        INTEGER CHECK (bytes_sent IS NULL OR bytes_sent >= 0),
  bytes_received    INTEGER CHECK (bytes_received IS NULL OR bytes_received >= 0),
  inner_steps       INTEGER CHECK (inner_steps IS NULL OR inner_steps >= 0),
  state_hash        TEXT,
  failure_reason    TEXT,
  vanished_island   TEXT,
  repair_source     TEXT,
  repaired_unix_ms  INTEGER,
  reported_unix_ms  INTEGER,
  PRIMARY KEY (experiment_id, epoch, island_id),
  FOREIGN KEY (experiment_id, epoch) REFERENCES island_epochs(experiment_id, epoch),
  FOREIGN KEY (experiment_id, join_seq) REFERENCES islands(experiment_id, join_seq)
);
CREATE INDEX island_syncs_by_island ON island_syncs(experiment_id, island_id, step, fragment);
)sql";

// Version 6: learning tasks besides classification (docs/records.md): the experiment's task; per round the
// regression's MAE and the next-token perplexity of the global model; per client evaluation its MAE and, for a
// result the server refused, why. Rows from before v6 keep NULL: their experiments were classifiers.
constexpr std::string_view kSchemaV6 = R"sql(
ALTER TABLE experiments ADD COLUMN task TEXT
  CHECK (task IS NULL OR task IN ('classification', 'regression', 'next-token'));
ALTER TABLE rounds ADD COLUMN eval_mae REAL CHECK (eval_mae IS NULL OR eval_mae >= 0);
ALTER TABLE rounds ADD COLUMN eval_perplexity REAL CHECK (eval_perplexity IS NULL OR eval_perplexity >= 1);
ALTER TABLE evaluations ADD COLUMN mae REAL CHECK (mae IS NULL OR mae >= 0);
ALTER TABLE evaluations ADD COLUMN reject_reason TEXT;
)sql";

// Version 7: what fl-server refused from or did to a client outside its client_rounds row (a clock pong or an
// uplink report that failed validation, an upload whose slot was revoked, an initial model asked of another
// client, a session closed for a limit), with the reason, so that a refusal is recorded and not only logged.
constexpr std::string_view kSchemaV7 = R"sql(
CREATE TABLE client_events (
  id                INTEGER PRIMARY KEY,
  experiment_id     TEXT    NOT NULL,
  client_id         TEXT    NOT NULL,
  kind              TEXT    NOT NULL CHECK (kind IN ('report_refused', 'upload_revoked', 'initial_model_reasked',
                                                     'session_closed')),
  round             INTEGER CHECK (round IS NULL OR round >= 0),
  task_id           TEXT,
  reason            TEXT    NOT NULL,
  at_unix_ms        INTEGER NOT NULL,
  FOREIGN KEY (experiment_id, client_id) REFERENCES clients (experiment_id, client_id) ON DELETE CASCADE
);
CREATE INDEX client_events_by_client ON client_events (experiment_id, client_id);
)sql";

// Version 8: what fl-server refused on the secure federation channel (a Join whose name is not the certificate's,
// a call for another client, a revoked certificate, a bad token, a rate or concurrency limit, a stream deadline),
// with the peer, its certificate's name, what it claimed and what it was told. No foreign key to clients: most
// refused peers never became clients.
constexpr std::string_view kSchemaV8 = R"sql(
CREATE TABLE security_events (
  id                INTEGER PRIMARY KEY,
  experiment_id     TEXT    NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
  reason            TEXT    NOT NULL CHECK (reason IN ('name_mismatch', 'wrong_identity', 'revoked_certificate',
                                                       'bad_token', 'join_rate', 'session_limit', 'upload_limit',
                                                       'stream_deadline')),
  peer              TEXT    NOT NULL,
  identity          TEXT,
  claimed           TEXT,
  detail            TEXT    NOT NULL,
  at_unix_ms        INTEGER NOT NULL
);
CREATE INDEX security_events_by_reason ON security_events (experiment_id, reason);
)sql";

// Version 9: stragglers and asynchrony (issue 17). experiments.aggregation: 'synchronous' or 'buffered' (FedBuff,
// each rounds row is an aggregation step; NULL before v9 = synchronous). client_rounds: the outcomes 'cancelled'
// (over-commitment cancelled the task) and 'folded' (a late update folded into a later round's aggregate), which
// change the outcome CHECK and so rebuild the table (SQLite cannot alter a CHECK): the old table is renamed away,
// the new one created under the real name (a rename of the new one would store its name quoted), the rows copied,
// the old table and its index dropped and the index made again. Nothing references client_rounds. Four columns:
// the model version an update was trained from, its staleness, the discount applied and the round it was folded
// into.
constexpr std::string_view kSchemaV9 = R"sql(
ALTER TABLE experiments ADD COLUMN aggregation TEXT
  CHECK (aggregation IS NULL OR aggregation IN ('synchronous', 'buffered'));
ALTER TABLE client_rounds RENAME TO client_rounds_v8;
CREATE TABLE client_rounds (
  experiment_id                  TEXT    NOT NULL,
  round                          INTEGER NOT NULL,
  attempt                        INTEGER NOT NULL,
  client_id                      TEXT    NOT NULL,
  outcome                        TEXT    NOT NULL
                                 CHECK (outcome IN ('ok', 'late', 'dropped', 'rejected', 'cancelled', 'folded')),
  reject_reason                  TEXT    CHECK (reject_reason IS NULL OR outcome = 'rejected'),
  dispatched_unix_ms             INTEGER,
  num_examples                   INTEGER CHECK (num_examples IS NULL OR num_examples >= 0),
  num_steps                      INTEGER CHECK (num_steps IS NULL OR num_steps >= 0),
  downlink_ms                    REAL,
  train_ms                       REAL,
  eval_ms                        REAL,
  uplink_ms                      REAL,
  uplink_server_ms               REAL,
  idle_ms                        REAL,
  downlink_bytes                 INTEGER CHECK (downlink_bytes IS NULL OR downlink_bytes >= 0),
  uplink_bytes                   INTEGER CHECK (uplink_bytes IS NULL OR uplink_bytes >= 0),
  codec                          TEXT,
  train_loss                     REAL,
  clock_offset_ms                REAL,
  clock_rtt_ms                   REAL    CHECK (clock_rtt_ms IS NULL OR clock_rtt_ms >= 0),
  downlink_start_unix_ms         REAL,
  train_start_unix_ms            REAL,
  eval_start_unix_ms             REAL,
  uplink_start_unix_ms           REAL,
  uplink_end_unix_ms             REAL,
  uplink_server_start_unix_ms    REAL,
  downlink_server_start_unix_ms  REAL,
  downlink_server_ms             REAL    CHECK (downlink_server_ms IS NULL OR downlink_server_ms >= 0),
  base_model_version             INTEGER CHECK (base_model_version IS NULL OR base_model_version >= 0),
  staleness                      INTEGER CHECK (staleness IS NULL OR staleness >= 0),
  staleness_weight               REAL    CHECK (staleness_weight IS NULL OR staleness_weight >= 0),
  folded_into_round              INTEGER CHECK (folded_into_round IS NULL OR folded_into_round > round),
  PRIMARY KEY (experiment_id, round, attempt, client_id),
  FOREIGN KEY (experiment_id, round, attempt) REFERENCES rounds (experiment_id, round, attempt) ON DELETE CASCADE,
  FOREIGN KEY (experiment_id, client_id) REFERENCES clients (experiment_id, client_id) ON DELETE CASCADE
);
INSERT INTO client_rounds (
  experiment_id, round, attempt, client_id, outcome, reject_reason, dispatched_unix_ms, num_examples, num_steps,
  downlink_ms, train_ms, eval_ms, uplink_ms, uplink_server_ms, idle_ms, downlink_bytes, uplink_bytes, codec,
  train_loss, clock_offset_ms, clock_rtt_ms, downlink_start_unix_ms, train_start_unix_ms, eval_start_unix_ms,
  uplink_start_unix_ms, uplink_end_unix_ms, uplink_server_start_unix_ms, downlink_server_start_unix_ms,
  downlink_server_ms)
SELECT
  experiment_id, round, attempt, client_id, outcome, reject_reason, dispatched_unix_ms, num_examples, num_steps,
  downlink_ms, train_ms, eval_ms, uplink_ms, uplink_server_ms, idle_ms, downlink_bytes, uplink_bytes, codec,
  train_loss, clock_offset_ms, clock_rtt_ms, downlink_start_unix_ms, train_start_unix_ms, eval_start_unix_ms,
  uplink_start_unix_ms, uplink_end_unix_ms, uplink_server_start_unix_ms, downlink_server_start_unix_ms,
  downlink_server_ms
FROM client_rounds_v8;
DROP TABLE client_rounds_v8;
CREATE INDEX client_rounds_by_client ON client_rounds (experiment_id, client_id);
)sql";

// Version 10: central differential privacy per round (docs/privacy.md): ε spent up to the round, the clip norm and
// the noise multiplier used. NULL in runs without it and in rows from before v10.
constexpr std::string_view kSchemaV10 = R"sql(
ALTER TABLE rounds ADD COLUMN dp_epsilon REAL CHECK (dp_epsilon IS NULL OR dp_epsilon >= 0);
ALTER TABLE rounds ADD COLUMN dp_clip_norm REAL CHECK (dp_clip_norm IS NULL OR dp_clip_norm > 0);
ALTER TABLE rounds ADD COLUMN dp_noise_multiplier REAL CHECK (dp_noise_multiplier IS NULL OR dp_noise_multiplier >= 0);
)sql";

// Version 11: secure aggregation (SecAgg+, docs/privacy.md). secagg_stages: one client's part in one stage of a
// secure round attempt (advertise keys, share keys, masked upload, unmask) with its outcome, time and bytes, child of
// the attempt's rounds row and of the client's row like client_rounds. rounds: how many clients the unmasked sum
// holds and how many dropped out of it. security_events: the reason 'secagg' (a secure-aggregation message refused),
// which changes the reason CHECK and so rebuilds the table the way v9 rebuilt client_rounds (renamed away, created
// under its real name, rows copied with their ids, the old table dropped with its index, the index made again).
// Nothing references security_events.
constexpr std::string_view kSchemaV11 = R"sql(
ALTER TABLE rounds ADD COLUMN secagg_survivors INTEGER CHECK (secagg_survivors IS NULL OR secagg_survivors >= 0);
ALTER TABLE rounds ADD COLUMN secagg_dropped INTEGER CHECK (secagg_dropped IS NULL OR secagg_dropped >= 0);
ALTER TABLE security_events RENAME TO security_events_v10;
CREATE TABLE security_events (
  id                INTEGER PRIMARY KEY,
  experiment_id     TEXT    NOT NULL REFERENCES experiments (id) ON DELETE CASCADE,
  reason            TEXT    NOT NULL CHECK (reason IN ('name_mismatch', 'wrong_identity', 'revoked_certificate',
                                                       'bad_token', 'join_rate', 'session_limit', 'upload_limit',
                                                       'stream_deadline', 'secagg')),
  peer              TEXT    NOT NULL,
  identity          TEXT,
  claimed           TEXT,
  detail            TEXT    NOT NULL,
  at_unix_ms        INTEGER NOT NULL
);
INSERT INTO security_events (id, experiment_id, reason, peer, identity, claimed, detail, at_unix_ms)
SELECT id, experiment_id, reason, peer, identity, claimed, detail, at_unix_ms FROM security_events_v10;
DROP TABLE security_events_v10;
CREATE INDEX security_events_by_reason ON security_events (experiment_id, reason);
CREATE TABLE secagg_stages (
  experiment_id     TEXT    NOT NULL,
  round             INTEGER NOT NULL,
  attempt           INTEGER NOT NULL,
  client_id         TEXT    NOT NULL,
  stage             TEXT    NOT NULL CHECK (stage IN ('advertise_keys', 'share_keys', 'masked_upload', 'unmask')),
  outcome           TEXT    NOT NULL CHECK (outcome IN ('ok', 'dropped', 'refused')),
  started_unix_ms   REAL,
  duration_ms       REAL    CHECK (duration_ms IS NULL OR duration_ms >= 0),
  bytes_down        INTEGER NOT NULL CHECK (bytes_down >= 0),
  bytes_up          INTEGER NOT NULL CHECK (bytes_up >= 0),
  detail            TEXT,
  PRIMARY KEY (experiment_id, round, attempt, client_id, stage),
  FOREIGN KEY (experiment_id, round, attempt) REFERENCES rounds (experiment_id, round, attempt) ON DELETE CASCADE,
  FOREIGN KEY (experiment_id, client_id) REFERENCES clients (experiment_id, client_id) ON DELETE CASCADE,
  CHECK (outcome <> 'ok' OR detail IS NULL)
);
CREATE INDEX secagg_stages_by_client ON secagg_stages (experiment_id, client_id);
)sql";

// Append new migrations here: {N + 1, "what it does", R"sql(...)sql"}. Never edit a shipped entry. A new database
// does not run them: it is created from the column declarations (record_columns.cc), which must declare what the
// migrations reach (instrumentation_schema_test compares the two).
constexpr Migration kMigrations[] = {
    {1, "experiments, clients, rounds, client_rounds, evaluations, checkpoints", kSchemaV1, false},
    {2, "client_rounds.clock_offset_ms, client_rounds.clock_rtt_ms", kSchemaV2, false},
    {3, "client_rounds phase start times on the server's timeline", kSchemaV3, false},
    {4, "experiment_manifests (what fl-experiment ran, for replay)", kSchemaV4, false},
    {5, "islands, island_epochs, island_syncs (DiLoCo islands)", kSchemaV5, false},
    {6, "experiments.task, rounds.eval_mae/eval_perplexity, evaluations.mae/reject_reason", kSchemaV6, false},
    {7, "client_events (reports refused, uploads revoked, sessions closed)", kSchemaV7, false},
    {8, "security_events (calls refused on the secure federation channel)", kSchemaV8, false},
    {9, "experiments.aggregation; client_rounds rebuilt: outcomes cancelled/folded, staleness columns", kSchemaV9,
     true},
    {10, "rounds.dp_epsilon/dp_clip_norm/dp_noise_multiplier (central differential privacy)", kSchemaV10, false},
    {11, "secagg_stages; rounds.secagg_survivors/secagg_dropped; security_events rebuilt: reason secagg", kSchemaV11,
     true},
};

std::string Hex(int64_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) out.push_back(kDigits[(static_cast<uint64_t>(v) >> shift) & 0xf]);
  return out;
}

absl::Status ValidateList(std::span<const Migration> migrations) {
  for (size_t i = 0; i < migrations.size(); ++i) {
    if (migrations[i].version != static_cast<int>(i) + 1) {
      return absl::InternalError(fl::StrCat("schema migration #", i, " has version ", migrations[i].version,
                                            "; migrations must be numbered 1, 2, 3, ... in order"));
    }
  }
  return absl::OkStatus();
}

// `from_empty_only`: `m` creates the whole newest schema, so it applies to an empty file (version 0) only; a file
// another process began to migrate meanwhile is left to the migrations.
absl::Status ApplyOne(sqlite::Database& db, const Migration& m, bool foreign_keys_were_on,
                      bool from_empty_only = false) {
  const std::string what =
      fl::StrCat("records database ", db.path(), ": migration to schema version ", m.version, " (", m.description, ")");
  if (m.foreign_keys_off) {
    // A no-op inside a transaction, so it must come before BEGIN.
    if (absl::Status s = db.Exec("PRAGMA foreign_keys = OFF"); !s.ok()) return s;
  }
  auto restore_fk = [&]() {
    if (m.foreign_keys_off && foreign_keys_were_on) (void)db.Exec("PRAGMA foreign_keys = ON");
  };
  if (absl::Status s = db.Exec("BEGIN IMMEDIATE"); !s.ok()) {
    restore_fk();
    return absl::Status(s.code(), fl::StrCat(what, " could not start: ", fl::ToStd(s.message())));
  }
  auto fail = [&](const absl::Status& s) {
    (void)db.Exec("ROLLBACK");
    restore_fk();
    return absl::Status(
        s.code(), fl::StrCat(what, " failed, database left at version ", m.version - 1, ": ", fl::ToStd(s.message())));
  };
  // Another process may have migrated between our version check and BEGIN IMMEDIATE: re-read under the lock.
  absl::StatusOr<int64_t> current = db.QueryInt("PRAGMA user_version");
  if (!current.ok()) return fail(current.status());
  if (*current >= m.version || (from_empty_only && *current != 0)) {
    if (absl::Status s = db.Exec("COMMIT"); !s.ok()) return fail(s);
    restore_fk();
    return absl::OkStatus();
  }
  if (absl::Status s = db.Exec(m.sql); !s.ok()) return fail(s);
  if (m.foreign_keys_off) {
    absl::StatusOr<int64_t> violations = db.QueryInt("SELECT count(*) FROM pragma_foreign_key_check");
    if (!violations.ok()) return fail(violations.status());
    if (*violations > 0) {
      return fail(absl::FailedPreconditionError(
          fl::StrCat(*violations, " foreign key violations after the migration (PRAGMA foreign_key_check)")));
    }
  }
  if (*current == 0) {
    if (absl::Status s = db.Exec(fl::StrCat("PRAGMA application_id = ", kRecordsApplicationId)); !s.ok()) {
      return fail(s);
    }
  }
  if (absl::Status s = db.Exec(fl::StrCat("PRAGMA user_version = ", m.version)); !s.ok()) return fail(s);
  if (absl::Status s = db.Exec("COMMIT"); !s.ok()) return fail(s);
  restore_fk();
  return absl::OkStatus();
}

absl::Status CheckApplicationId(sqlite::Database& db) {
  absl::StatusOr<int64_t> app_id = db.QueryInt("PRAGMA application_id");
  if (!app_id.ok()) return app_id.status();
  if (*app_id != 0 && *app_id != kRecordsApplicationId) {
    return absl::FailedPreconditionError(
        fl::StrCat("records database ", db.path(), ": not an fl-testbed records database (its application_id is ",
                   Hex(*app_id), ", ours is ", Hex(kRecordsApplicationId), "); refusing to touch it"));
  }
  return absl::OkStatus();
}

absl::Status NewerThanCode(const sqlite::Database& db, int64_t version, int latest) {
  return absl::FailedPreconditionError(
      fl::StrCat("records database ", db.path(), " has schema version ", version,
                 ", newer than the newest version this build knows (", latest,
                 "); it was written by a newer fl-server: upgrade fl-server (and fl-report) to open it"));
}

}  // namespace

std::span<const Migration> SchemaMigrations() { return kMigrations; }

int LatestSchemaVersion() { return kMigrations[std::size(kMigrations) - 1].version; }

absl::Status MigrateSchema(sqlite::Database& db, std::span<const Migration> migrations,
                           std::string_view newest_schema) {
  if (absl::Status s = ValidateList(migrations); !s.ok()) return s;
  const int latest = migrations.empty() ? 0 : migrations.back().version;
  if (absl::Status s = CheckApplicationId(db); !s.ok()) return s;
  absl::StatusOr<int64_t> version = db.QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*version > latest) return NewerThanCode(db, *version, latest);
  if (*version == latest) return absl::OkStatus();
  if (*version == 0) {
    absl::StatusOr<int64_t> objects = db.QueryInt("SELECT count(*) FROM sqlite_schema");
    if (!objects.ok()) return objects.status();
    if (*objects > 0) {
      return absl::FailedPreconditionError(
          fl::StrCat("records database ", db.path(), ": the file already holds ", *objects,
                     " tables/indexes but no records schema version (user_version 0); it is not an fl-testbed records "
                     "database: pick another path"));
    }
  }
  absl::StatusOr<int64_t> fk = db.QueryInt("PRAGMA foreign_keys");
  if (!fk.ok()) return fk.status();
  if (*version == 0 && !newest_schema.empty()) {
    const Migration create{latest, "the newest schema, created in one step", newest_schema, false};
    if (absl::Status s = ApplyOne(db, create, *fk != 0, /*from_empty_only=*/true); !s.ok()) return s;
    version = db.QueryInt("PRAGMA user_version");
    if (!version.ok()) return version.status();
    if (*version == latest) return absl::OkStatus();
  }
  for (const Migration& m : migrations) {
    if (m.version <= *version) continue;
    if (absl::Status s = ApplyOne(db, m, *fk != 0); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status MigrateRecordsSchema(sqlite::Database& db) {
  return MigrateSchema(db, SchemaMigrations(), LatestSchemaSql());
}

absl::Status CheckSchemaVersion(sqlite::Database& db, int latest) {
  if (absl::Status s = CheckApplicationId(db); !s.ok()) return s;
  absl::StatusOr<int64_t> version = db.QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*version > latest) return NewerThanCode(db, *version, latest);
  if (*version < latest) {
    return absl::FailedPreconditionError(
        fl::StrCat("records database ", db.path(), " has schema version ", *version, ", older than this build's (",
                   latest, "); open it once with fl-server (RecordStore::Open migrates it) before reading it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> CheckReadableSchemaVersion(sqlite::Database& db, int latest) {
  constexpr std::string_view kWhatToGive = "give the file fl-server wrote with --db";
  absl::StatusOr<int64_t> app_id = db.QueryInt("PRAGMA application_id");
  if (!app_id.ok()) {
    // SQLite opens any file lazily; the first read of a file that is not SQLite fails with SQLITE_NOTADB.
    return absl::FailedPreconditionError(fl::StrCat(db.path(), " is not a records database (SQLite cannot read it: ",
                                                    fl::ToStd(app_id.status().message()), "); ", kWhatToGive));
  }
  absl::StatusOr<int64_t> version = db.QueryInt("PRAGMA user_version");
  if (!version.ok()) return version.status();
  if (*app_id != kRecordsApplicationId || *version < 1) {
    return absl::FailedPreconditionError(
        fl::StrCat(db.path(), " is an SQLite database but not an fl-testbed records database (application_id ",
                   Hex(*app_id), ", schema version ", *version, "); ", kWhatToGive));
  }
  if (*version > latest) return NewerThanCode(db, *version, latest);
  return static_cast<int>(*version);
}

}  // namespace fl::instrumentation
