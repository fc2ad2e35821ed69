// The round engine's clients: admission (Join), sessions, liveness, clock sync, departures, and who is asked
// for the initial model.
//
// Over 700 lines for now: admission grew the checks of issue 27 (the join-rate bucket before the name check,
// fair places under --max-sessions, forgetting newcomers); the parts that judge one hostile peer already live in
// engine_peers.cc, and the engine's split into the coordinator's shape (issue 28) divides the rest by state.
#include "fl/server/round_engine.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/str_format.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/proto/convert.h"
#include "engine_internal.h"
#include "engine_schedule.h"
#include "engine_peers.h"
#include "engine_secagg.h"
#include "peer_guard.h"

namespace fl::server {

using namespace engine_internal;  // NOLINT: the engine's own helpers

RoundEngine::Core::ClientInfo* RoundEngine::Core::Authenticate(const std::string& client_id, const std::string& token) {
  return clients_.Authenticate(client_id, token);
}

void RoundEngine::Core::HandleJoin(JoinEvent& e) {
  const fl::v1::JoinRequest& req = e.request;
  fl::v1::JoinResponse resp;
  auto refuse = [&](grpc::StatusCode code, ErrorCode reason, std::string message, std::string field, std::string hint) {
    *resp.mutable_error() = proto::MakeError(reason, std::move(message), std::move(field), std::move(hint));
    spdlog::warn("refused join of '{}' from {}: {}", LogSafe(req.client_name(), 64), LogSafe(e.peer, 64),
                 LogSafe(resp.error().message(), 600));
    e.reply(proto::ToGrpcStatus(code, resp.error()), resp);
  };
  if (state_ == EngineState::kFinished) {
    EngineResult result;
    {
      fl::MutexLock lock(published_.mu);
      result = published_.result;
    }
    if (result.status == instrumentation::ExperimentStatus::kAborted) {
      return refuse(grpc::StatusCode::UNAVAILABLE, fl::v1::ERROR_CODE_SHUTTING_DOWN,
                    fl::StrCat("fl-server is shutting down: ", result.reason), "", "start a new experiment");
    }
    // Final: a client that was away at the end (stopped, cut off) learns here that there is nothing left to do.
    MarkTold(req.client_name());
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_EXPERIMENT_FINISHED,
                  fl::StrCat("experiment ", config_.experiment_id, " has ended (", result.status_name(), ": ",
                             result.reason, ")"),
                  "", "nothing left to do: fl-client exits");
  }
  if (req.protocol_version() != fl::v1::PROTOCOL_VERSION_3) {
    // Version 1 checksummed transfers with Checksum64 (its uploads would all fail the XXH3 check); version 2 is
    // refused so that a client and a server that disagree on uploads without a body checksum never meet.
    return refuse(
        grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
        fl::StrCat("protocol version ", static_cast<int>(req.protocol_version()),
                   " is not supported; this server speaks version ", static_cast<int>(fl::v1::PROTOCOL_VERSION_3)),
        "protocol_version", "use an fl-client of the same release as the server");
  }
  // What the run asks of a client beyond the protocol: the SecAgg+ stages, the client-side privacy of Task.privacy.
  for (const auto& [needed, why] : RequiredCapabilities()) {
    if (std::find(req.capabilities().begin(), req.capabilities().end(), needed) == req.capabilities().end()) {
      return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("this server runs with ", why, ", which needs clients with capability '", needed,
                               "' (JoinRequest.capabilities); this client does not declare it"),
                    "capabilities", "use an fl-client of the same release as the server");
    }
  }
  if (!ValidClientName(req.client_name())) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("client name '", LogSafe(req.client_name(), 64), "' is invalid"), "client_name",
                  "use 1-64 characters from [A-Za-z0-9._-]");
  }
  // Nobody takes over a live session by joining under its name: the rejoin must present that session's token
  // (fl-client does after a reconnect). A name whose session is gone can be joined again without one.
  if (ClientInfo* holder = clients_.Find(req.client_name());
      holder != nullptr && holder->session != nullptr &&
      (req.session_token().empty() || req.session_token() != holder->token)) {
    return refuse(grpc::StatusCode::ALREADY_EXISTS, fl::v1::ERROR_CODE_NAME_IN_USE,
                  fl::StrCat("a live session holds the client name '", req.client_name(), "'; a Join under it must ",
                             req.session_token().empty() ? "present the" : "present the right",
                             " session token of that session (JoinRequest.session_token)"),
                  "session_token",
                  fl::StrCat("use another client name, or retry: a session silent for four heartbeat intervals (",
                             4 * config_.heartbeat_interval_ms, " ms) is dropped"));
  }
  // Every string, map and the spec's size are bounded before anything of the request is kept (the request
  // lives as long as the client, its strings go to the records).
  if (std::optional<InputProblem> p = CheckJoinRequestSizes(req); p.has_value()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("client '", req.client_name(), "': ", p->message), p->field,
                  "send shorter values (docs/round-engine.md, \"Limits on what clients send\")");
  }
  for (const auto& [count, field] : {std::pair{req.num_train_examples(), "num_train_examples"},
                                     std::pair{req.num_test_examples(), "num_test_examples"}}) {
    if (count > config_.max_client_examples) {
      return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                    fl::StrCat("client '", req.client_name(), "' declares ", count, " ", field,
                               "; this server takes at most ", config_.max_client_examples, " (--max-client-examples)"),
                    field, "declare the size of the client's shard; raise --max-client-examples if it is real");
    }
  }
  auto spec = proto::FromProto(req.model_spec());
  if (!spec.ok()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  std::string(fl::ToStd(spec.status().message())), "model_spec", "");
  }
  if (spec->num_elements() == 0) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED, "the model spec has no parameters",
                  "model_spec", "send the spec of the model the client trains");
  }
  // A model the server does not have yet (it would be this client's) is bounded: the server holds several
  // model-sized buffers, and the first client's declaration alone must not decide how much memory it takes.
  if (model_.spec() == nullptr && spec->num_elements() > config_.max_model_values) {
    return refuse(grpc::StatusCode::RESOURCE_EXHAUSTED, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
                  fl::StrCat("client '", req.client_name(), "' declares a model of ", spec->num_elements(), " values (",
                             spec->num_elements() * 4, " bytes as fp32, ", spec->num_tensors(),
                             " tensors) but this server takes at most ", config_.max_model_values,
                             " values (--max-model-values)"),
                  "model_spec", "start fl-server with a larger --max-model-values if the model is real");
  }
  auto task = core::ParseTask(req.task());
  if (!task.ok()) {
    return refuse(grpc::StatusCode::INVALID_ARGUMENT, fl::v1::ERROR_CODE_MALFORMED,
                  fl::StrCat("client '", req.client_name(), "': ", fl::ToStd(task.status().message())), "task",
                  "start fl-client with --task classification, regression or next-token");
  }
  if (task_.has_value() && *task != *task_) {
    return refuse(
        grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_ADMISSION_REFUSED,
        fl::StrCat("client '", req.client_name(), "' trains for task '", core::TaskName(*task),
                   "' but this experiment's task is '", core::TaskName(*task_), "' (set by its first client)"),
        "task", "start every client of an experiment with the same --task (and model)");
  }
  // The model a joining client must train: the experiment's, or, while the server waits for its initial
  // weights, that of the client asked for them (unless that one has gone: then this client is asked).
  bool ask_for_initial_model = false;
  std::shared_ptr<const core::ModelSpec> expected = model_.spec();
  std::string_view expected_name = "this experiment's";
  if (state_ == EngineState::kWaitingForModel) {
    ClientInfo* holder = clients_.Find(initial_model_client_);
    const int64_t asked_ago = NowNs() - initial_model_asked_ns_;
    // Past the deadline the holder has stalled (unless its upload is under way): this client is asked instead.
    const bool stalled =
        asked_ago >= int64_t{config_.initial_model_deadline_ms} * kMsToNs && !initial_model_upload_in_progress_;
    const bool other_holder = holder != nullptr && holder->id != req.client_name();
    const bool holder_alive =
        other_holder && !stalled && (holder->session != nullptr || asked_ago < int64_t{30'000} * kMsToNs);
    if (holder_alive) {
      expected = pending_spec_;
      expected_name = "the first client's";
    } else {
      ask_for_initial_model = true;
      if (other_holder && expected == nullptr && spec->num_elements() <= config_.max_model_values) {
        AbandonInitialModelHolder(holder->id, req.client_name(),
                                  stalled ? fl::StrCat("it has not uploaded it within --initial-model-deadline-ms=",
                                                       config_.initial_model_deadline_ms)
                                          : std::string("its session ended without the upload"));
      }
    }
  }
  if (expected != nullptr && spec->fingerprint() != expected->fingerprint()) {
    // The join carries the client's whole spec: name the first tensor that differs, not just two hashes.
    std::string diff =
        core::DescribeSpecDifference(*expected, *spec, fl::StrCat(expected_name, " model"), "the client's model");
    if (diff.empty()) diff = "the specs hold the same tensors but their fingerprints differ";  // not reachable
    return refuse(grpc::StatusCode::FAILED_PRECONDITION, fl::v1::ERROR_CODE_FINGERPRINT_MISMATCH,
                  fl::StrCat("client '", req.client_name(), "' trains a model that differs from ", expected_name, ": ",
                             diff, "; model fingerprints ", spec->FingerprintHex(), " (client, ", spec->num_tensors(),
                             " tensors, ", spec->num_elements(), " values) vs ", expected->FingerprintHex(), " (",
                             expected->num_tensors(), " tensors, ", expected->num_elements(), " values)"),
                  "model_spec", "start the client with the same --model as the other clients");
  }

  // The session limit (--max-sessions): a Join that would take a new place is refused with a retry-after, unless
  // its address holds less than its fair share and another holds more (then that one's oldest idle place yields,
  // YieldPlaceTo); a client already holding one (a rejoin after a restart) keeps it.
  if (ClientInfo* known = clients_.Find(req.client_name());
      config_.max_sessions != 0 && clients_.places_held() >= config_.max_sessions &&
      (known == nullptr || !known->holds_place) && !YieldPlaceTo(e.peer, req.client_name())) {
    const std::string host = PeerHost(e.peer);
    size_t of_host = 0;
    for (const ClientInfo* c : clients_.places()) of_host += PeerHost(c->peer) == host ? 1 : 0;
    *resp.mutable_error() = proto::MakeError(
        fl::v1::ERROR_CODE_RATE_LIMITED,
        fl::StrCat("fl-server holds ", clients_.places_held(),
                   " sessions, its limit (--max-sessions=", config_.max_sessions, "), ", of_host, " of them from ",
                   LogSafe(host, 64), "; client '", req.client_name(), "' is not admitted now"),
        "", fl::StrCat("retry after ", config_.join_retry_after_ms, " ms (trailing metadata retry-after-ms)"));
    spdlog::debug("refused join of '{}': session limit {}", LogSafe(req.client_name(), 64), config_.max_sessions);
    e.reply(proto::ToGrpcStatus(grpc::StatusCode::RESOURCE_EXHAUSTED, resp.error()), resp);
    return;
  }

  const bool rejoin = clients_.Find(req.client_name()) != nullptr;
  ClientInfo& client = clients_.FindOrAdd(req.client_name());
  client.id = req.client_name();
  client.token = RandomHex(16);
  client.peer = e.peer;
  client.cert_serial = e.cert_serial;
  client.join = req;
  // The model's spec is kept once (the experiment's, or the pending one it was compared with), not per client:
  // a spec may be megabytes of tensor names.
  client.join.clear_model_spec();
  client.last_seen_ns = NowNs();
  if (client.session != nullptr) {
    // A rejoin means the client restarted: its old stream (if the server still has one) is stale.
    client.session->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a new session after rejoin"));
    DetachSession(client);
  }
  // Admitted: it holds a place until its session opens and then while it is heard from.
  HoldPlace(client, client.last_seen_ns);
  if (!client.open_task.empty()) {
    auto t = tasks_.find(client.open_task);
    if (t != tasks_.end()) CloseTaskAsDropped(*t->second, "the client rejoined (it restarted)");
  }

  resp.set_admitted(true);
  resp.set_client_id(client.id);
  resp.set_session_token(client.token);
  resp.set_experiment_id(config_.experiment_id);
  resp.set_heartbeat_interval_ms(config_.heartbeat_interval_ms);
  resp.set_max_chunk_bytes(config_.max_chunk_bytes);
  if (ask_for_initial_model) {
    // The client asked for the initial weights uploads them before it opens its session; give it a while
    // before asking someone else, or every client joining in the meantime would be asked too.
    initial_model_client_ = client.id;
    initial_model_asked_ns_ = NowNs();
    ArmAt(initial_model_timer_, initial_model_asked_ns_ + int64_t{config_.initial_model_deadline_ms} * kMsToNs);
    pending_spec_ = std::make_shared<const core::ModelSpec>(*spec);
    pending_model_name_ = req.model_spec().name();
    resp.set_initial_model_requested(true);
  }
  if (!task_.has_value()) {
    // The first admitted client fixes the experiment's task, as the first client fixes its model.
    task_ = *task;
    spdlog::info("experiment {}: task {} (from client '{}')", config_.experiment_id, core::TaskName(*task_), client.id);
    Record(instrumentation::ExperimentTaskUpdate{config_.experiment_id, std::string(core::TaskName(*task_))});
  }
  // One line per admission for the first clients, then one per thousand (each at debug level): a fleet of
  // 10,000 joining at once must not make the engine thread a console writer.
  ++joins_logged_;
  const bool log_at_info = joins_logged_ <= kJoinsLoggedAtInfo || joins_logged_ % 1000 == 0;
  spdlog::log(log_at_info ? spdlog::level::info : spdlog::level::debug,
              "{} client '{}' ({}, {} via {}), {} train examples ({} admissions, {} sessions open)",
              rejoin ? "rejoined" : "admitted", client.id, LogSafe(req.device().device_class(), 64),
              proto::LinkKindName(req.link().kind()), LogSafe(req.link().interface(), 64), req.num_train_examples(),
              joins_logged_, clients_.connected());
  instrumentation::ClientRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.client_id = client.id;
  rec.client_name = req.client_name();
  rec.device_class = req.device().device_class();
  rec.link_kind = std::string(proto::LinkKindName(req.link().kind()));
  rec.link_interface = req.link().interface();
  rec.link_profile = req.link().profile();
  if (req.device().cpu_cores() > 0) rec.cores = req.device().cpu_cores();
  if (req.device().memory_bytes() > 0) rec.memory_bytes = static_cast<int64_t>(req.device().memory_bytes());
  rec.accelerator = req.device().accelerator().name();
  rec.os = req.device().os();
  rec.arch = req.device().arch();
  rec.client_version = req.software_version();
  rec.joined_unix_ms = UnixMs();
  Record(rec);  // a rejoin updates the client's row
  e.reply(grpc::Status::OK, resp);
  ForgetIdleNewcomers();
}

void RoundEngine::Core::HandleSessionOpen(SessionOpenEvent& e) {
  ClientInfo* client = Authenticate(e.hello.client_id(), e.hello.session_token());
  if (client == nullptr) {
    const std::string why =
        fl::StrCat("client id '", LogSafe(e.hello.client_id(), 64), "' or its session token is not known");
    RecordBadToken(e.peer, e.hello.client_id(), fl::StrCat("SessionHello: ", why));
    e.channel->Close(proto::ToGrpcStatus(grpc::StatusCode::UNAUTHENTICATED,
                                         proto::MakeError(fl::v1::ERROR_CODE_UNKNOWN_CLIENT, why, "hello",
                                                          "call Join again (the server may have restarted)")));
    return;
  }
  if (state_ == EngineState::kFinished) {
    // The same Shutdown the connected clients got at the end, so that a late session ends its client too.
    EngineResult result;
    {
      fl::MutexLock lock(published_.mu);
      result = published_.result;
    }
    fl::v1::ServerMessage bye;
    bye.set_seq(1);
    bye.mutable_shutdown()->set_reason(fl::StrCat("experiment ", config_.experiment_id, " has ended (",
                                                  result.status_name(), ": ", result.reason, ")"));
    bye.mutable_shutdown()->set_experiment_finished(result.status != instrumentation::ExperimentStatus::kAborted);
    e.channel->Send(std::move(bye));
    e.channel->Close(grpc::Status::OK);
    if (result.status != instrumentation::ExperimentStatus::kAborted) MarkTold(client->id);
    return;
  }
  if (client->session != nullptr && client->session != e.channel) {
    client->session->Close(grpc::Status(grpc::StatusCode::ABORTED, "replaced by a newer session"));
  }
  AttachSession(*client, e.channel);
  client->last_seen_ns = NowNs();
  HoldPlace(*client, client->last_seen_ns);
  // A new session may be a restarted client process, whose monotonic clock has another origin.
  client->clock = core::ClockOffsetEstimator();
  client->pings_in_flight.clear();
  fl::v1::ServerMessage welcome;
  welcome.set_seq(++client->server_seq);
  welcome.mutable_welcome()->set_sent_server_ns(NowNs());
  welcome.mutable_welcome()->set_current_round(round_);
  client->session->Send(std::move(welcome));
  SendPing(*client);
  UpdateConnectedGauge();
}

std::optional<double> RoundEngine::Core::PlacePhaseStart(
    const ClientInfo& client, const google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming>& timings,
    fl::v1::Phase phase) const {
  const std::optional<core::ClockSample> est = client.clock.Estimate();
  if (!est.has_value()) return std::nullopt;
  for (const auto& t : timings) {
    if (t.phase() == phase) return timeline_.PlaceClient(t.start_client_ns(), est->offset_ns);
  }
  return std::nullopt;
}

void RoundEngine::Core::RecordClientUplink(const ClientInfo& client, const std::string& task_id,
                                           const fl::v1::PhaseTiming& uplink) {
  // Checked before any arithmetic on it (start + duration could overflow) and before it is recorded: the
  // uplink cannot have lasted longer than the task, nor lie outside it on the server's clock.
  if (auto known = tasks_.find(task_id); known != tasks_.end() && known->second->client_id == client.id) {
    const int64_t now = NowNs();
    std::string problem;
    if (auto p = CheckPhaseTiming(uplink, "status.timings", PhaseBoundNs(known->second->dispatched_ns, now),
                                  uint64_t{1} << 62)) {
      problem = p->message;
    } else {
      google::protobuf::RepeatedPtrField<fl::v1::PhaseTiming> one;
      *one.Add() = uplink;
      problem = PhaseWindowProblem(client, one, known->second->dispatched_ns, now);
    }
    if (!problem.empty()) {
      spdlog::warn("ignored the uplink report of client '{}' for task {}: {}", client.id, LogSafe(task_id, 64),
                   problem);
      RecordClientEvent(client.id, instrumentation::ClientEventKind::kReportRefused, known->second->round, task_id,
                        fl::StrCat("uplink report refused: ", problem));
      return;
    }
  } else {
    return;  // not a task of this client: nothing to attach it to
  }
  const double uplink_ms = static_cast<double>(uplink.duration_ns()) / 1e6;
  std::optional<double> start_unix_ms;
  std::optional<double> end_unix_ms;
  if (const std::optional<core::ClockSample> est = client.clock.Estimate(); est.has_value()) {
    start_unix_ms = timeline_.PlaceClient(uplink.start_client_ns(), est->offset_ns);
    end_unix_ms = timeline_.PlaceClient(uplink.start_client_ns() + uplink.duration_ns(), est->offset_ns);
  }
  auto t = tasks_.find(task_id);
  if (state_ == EngineState::kFinished || t == tasks_.end() || t->second->client_id != client.id ||
      t->second->kind != fl::v1::TASK_KIND_TRAIN || !t->second->closed || !std::isfinite(uplink_ms) || uplink_ms < 0) {
    return;  // not an update of this client that the server has answered: nothing to attach it to
  }
  const TaskInfo& task = *t->second;
  uplink_reports_due_.erase(task.id);
  if (schedule_->RecordUplink(task, uplink_ms, start_unix_ms, end_unix_ms)) return;
  // The row is still buffered while its round is open, and already written once the round closed (the
  // last update of a round closes it before the client can report its uplink).
  if (current_ != nullptr && !current_->evaluation && current_->round == task.round &&
      current_->attempt == task.attempt) {
    RoundState& r = *current_;
    for (; r.indexed_rows < r.client_rows.size(); ++r.indexed_rows) {
      r.rows_of_client[r.client_rows[r.indexed_rows].client_id].push_back(r.indexed_rows);
    }
    auto rows = r.rows_of_client.find(client.id);
    for (size_t i : rows == r.rows_of_client.end() ? std::vector<size_t>{} : rows->second) {
      auto& row = r.client_rows[i];
      row.uplink_ms = uplink_ms;
      row.uplink_start_unix_ms = start_unix_ms;
      row.uplink_end_unix_ms = end_unix_ms;
    }
    return;
  }
  Record(instrumentation::ClientRoundUplinkUpdate{config_.experiment_id, static_cast<int64_t>(task.round), task.attempt,
                                                  client.id, uplink_ms, start_unix_ms, end_unix_ms});
}

void RoundEngine::Core::UpdateConnectedGauge() {
  const auto connected = static_cast<int64_t>(clients_.connected());
  Notify([&](EngineObserver& o) { o.OnConnectedClients(connected); });
}

void RoundEngine::Core::SendPing(ClientInfo& client) {
  if (client.session == nullptr) return;
  fl::v1::ServerMessage ping;
  ping.set_seq(++client.server_seq);
  const uint64_t id = ++client.next_ping_id;
  const int64_t t1 = NowNs();
  ping.mutable_ping()->set_ping_id(id);
  ping.mutable_ping()->set_sent_server_ns(t1);
  client.pings_in_flight[id] = t1;
  while (client.pings_in_flight.size() > 8) client.pings_in_flight.erase(client.pings_in_flight.begin());
  client.session->Send(std::move(ping));
}

std::vector<std::pair<std::string_view, std::string>> RoundEngine::Core::RequiredCapabilities() const {
  std::vector<std::pair<std::string_view, std::string>> out;
  if (config_.secagg_on()) out.emplace_back(engine::kSecAggCapability, "--secure-aggregation=secagg+");
  // Differential privacy the server cannot apply itself: clients clip (and, local or distributed, noise) their own
  // update, so a client that would ignore Task.privacy must not take part.
  if (config_.dp_on() && (config_.secagg_on() || config_.dp_mode != "central")) {
    out.emplace_back("client-privacy-v1",
                     fl::StrCat("differential privacy applied on the clients (--dp-mode=", config_.dp_mode,
                                config_.secagg_on() ? " with --secure-aggregation" : "", ")"));
  }
  return out;
}

void RoundEngine::Core::HandleSessionMessage(SessionMessageEvent& e) {
  ClientInfo* client = ClientOfSession(e.channel.get());
  if (client == nullptr) return;  // a stream we already replaced or closed
  HoldPlace(*client, e.received_server_ns);
  const fl::v1::ClientMessage& m = e.message;
  switch (m.kind_case()) {
    case fl::v1::ClientMessage::kStatus:
      // At most InputLimits::kMaxTimings of them are looked at (a status carries one, the uplink).
      for (int i = 0; i < std::min<int>(m.status().timings_size(), InputLimits::kMaxTimings); ++i) {
        const fl::v1::PhaseTiming& t = m.status().timings(i);
        if (t.phase() == fl::v1::PHASE_UPLINK) RecordClientUplink(*client, m.status().task_id(), t);
      }
      if (m.status().state() == fl::v1::CLIENT_STATE_FAILED && m.status().task_id() == client->open_task) {
        auto t = tasks_.find(client->open_task);
        if (t != tasks_.end()) {
          CloseTaskAsDropped(*t->second,
                             fl::StrCat("the client reported a failure: ", LogSafe(m.status().error().message(), 400)));
        }
      }
      break;
    case fl::v1::ClientMessage::kEvaluation: {
      const fl::v1::EvaluationResult& r = m.evaluation();
      auto t = tasks_.find(r.task_id());
      if (t == tasks_.end() || t->second->client_id != client->id || t->second->closed ||
          t->second->kind != fl::v1::TASK_KIND_EVALUATE) {
        break;  // stale or foreign result: nothing to attach it to
      }
      TaskInfo& task = *t->second;
      task.closed = true;
      client->open_task.clear();
      // Every task's results are weighted by num_examples (for next-token: sequences, see trainer.h).
      const core::Task kind = task_.value_or(core::Task::kClassification);
      // The task-independent numbers first (example count, metrics, timings against the server's clock),
      // then the figures of the task. num_examples is bounded by the test examples the client declared.
      const uint64_t declared = client->join.num_test_examples();
      const uint64_t max_examples = declared > 0 ? declared : config_.max_client_examples;
      std::string problem;
      bool numbers_ok = true;
      if (auto p = CheckEvaluationReport(r, max_examples, PhaseBoundNs(task.dispatched_ns, e.received_server_ns))) {
        problem = declared > 0 && p->field == "num_examples"
                      ? fl::StrCat(p->message, " (the client declared ", declared, " test examples at Join)")
                      : p->message;
        numbers_ok = false;
      } else if (std::string w = PhaseWindowProblem(*client, r.timings(), task.dispatched_ns, e.received_server_ns);
                 !w.empty()) {
        problem = w;
        numbers_ok = false;
      } else {
        problem = EvaluationProblem(kind, r);
      }
      const bool valid = problem.empty();
      task.outcome = valid ? instrumentation::ClientOutcome::kOk : instrumentation::ClientOutcome::kRejected;
      const double weight = static_cast<double>(r.num_examples());
      const double mae = valid && kind == core::Task::kRegression ? r.metrics().at("mae") : 0.0;
      if (valid && current_ != nullptr && current_->evaluation && current_->round == task.round) {
        current_->eval_loss_sum += r.loss() * weight;
        current_->eval_accuracy_sum += r.accuracy() * weight;
        current_->eval_mae_sum += mae * weight;
        current_->eval_examples += r.num_examples();
        current_->eval_clients += 1;
      }
      instrumentation::EvaluationRecord rec;
      rec.experiment_id = config_.experiment_id;
      rec.round = static_cast<int64_t>(task.round);
      rec.attempt = task.attempt;
      rec.client_id = client->id;
      // A refused result keeps what the client claimed only when it is a plausible number (the records'
      // CHECK constraints and readers trust these columns).
      rec.num_examples = numbers_ok ? static_cast<int64_t>(r.num_examples()) : 0;
      if (numbers_ok) rec.eval_ms = PhaseMs(r.timings(), fl::v1::PHASE_EVAL);
      if (valid) {
        rec.loss = r.loss();
        if (kind == core::Task::kRegression) {
          rec.mae = mae;
        } else {
          rec.accuracy = r.accuracy();
        }
      } else {
        // Refused like a bad update: recorded with the reason, counted in no figure.
        rec.reject_reason = fl::StrCat("evaluation result for task '", core::TaskName(kind), "' refused: ", problem);
        spdlog::warn("refused the evaluation result of client '{}' for round {}: {}", client->id, task.round, problem);
      }
      // Stored with the round's figures as one unit when the evaluation closes (EvaluationCommitRecord).
      if (current_ != nullptr && current_->evaluation && current_->round == task.round) {
        current_->evaluation_rows.push_back(std::move(rec));
      } else {
        Record(rec);
      }
      break;
    }
    case fl::v1::ClientMessage::kSecaggKeys:
    case fl::v1::ClientMessage::kSecaggShares:
    case fl::v1::ClientMessage::kSecaggUnmask: schedule_->OnSecureMessage(*client, m, e.received_server_ns); break;
    case fl::v1::ClientMessage::kHeartbeat: SendPing(*client); break;
    case fl::v1::ClientMessage::kPong: {
      // t1 is our own record of the ping, not the echoed value: a client cannot skew the estimate by
      // echoing something else.
      auto it = client->pings_in_flight.find(m.pong().ping_id());
      if (it == client->pings_in_flight.end()) break;
      const int64_t t1 = it->second;
      client->pings_in_flight.erase(it);
      if (!client->clock.Add(t1, m.pong().received_client_ns(), m.pong().sent_client_ns(), e.received_server_ns)) {
        // Impossible timestamps (answered before received, beyond +-2^60 ns): never used to place phases.
        const std::string why =
            fl::StrCat("clock pong refused: impossible timestamps (received ", m.pong().received_client_ns(),
                       " ns, sent ", m.pong().sent_client_ns(), " ns of its clock, for a ping sent at ", t1,
                       " and answered at ", e.received_server_ns, " ns of the server's): never used to place phases");
        spdlog::warn("client '{}': {}", client->id, why);
        RecordClientEvent(client->id, instrumentation::ClientEventKind::kReportRefused, std::nullopt, "", why);
      }
      break;
    }
    default: break;
  }
}

void RoundEngine::Core::HandleSessionClosed(SessionClosedEvent& e) {
  if (ClientInfo* c = ClientOfSession(e.channel.get()); c != nullptr) {
    const std::string& id = c->id;
    if (!e.limit_reason.empty()) {
      RecordClientEvent(id, instrumentation::ClientEventKind::kSessionClosed, std::nullopt, c->open_task,
                        e.limit_reason);
    }
    DetachSession(*c);
    ReleasePlace(*c);
    if (!c->open_task.empty()) {
      auto t = tasks_.find(c->open_task);
      if (t != tasks_.end()) CloseTaskAsDropped(*t->second, "the client's session ended");
    }
    spdlog::log(clients_.connected() < kJoinsLoggedAtInfo ? spdlog::level::info : spdlog::level::debug,
                "client '{}' disconnected", id);
  }
  UpdateConnectedGauge();
  ForgetIdleNewcomers();
}

void RoundEngine::Core::HandleLeave(LeaveEvent& e) {
  ClientInfo* client = Authenticate(e.request.client_id(), e.request.session_token());
  fl::v1::LeaveResponse resp;
  if (client == nullptr) {
    // As every other call acting for a client (docs/security.md): UNAUTHENTICATED with the reason, not an OK
    // that a forged Leave could take for "nothing happened".
    const std::string why =
        fl::StrCat("client id '", LogSafe(e.request.client_id(), 64), "' or its session token is not known");
    RecordBadToken(e.peer, e.request.client_id(), fl::StrCat("Leave: ", why));
    e.reply(proto::ToGrpcStatus(grpc::StatusCode::UNAUTHENTICATED,
                                proto::MakeError(fl::v1::ERROR_CODE_UNKNOWN_CLIENT, why, "session_token",
                                                 "a Leave presents the client id and session token its Join returned")),
            resp);
    return;
  }
  resp.set_acknowledged(true);
  spdlog::info("client '{}' left: {}", client->id, LogSafe(e.request.reason(), 200));
  DisconnectClient(*client, fl::StrCat("the client left: ", LogSafe(e.request.reason(), 200)));
  client->token.clear();
  MarkTold(client->id);
  e.reply(grpc::Status::OK, resp);
  ForgetIdleNewcomers();
}

void RoundEngine::Core::AbandonInitialModelHolder(const std::string& holder_id, const std::string& next_client,
                                                  std::string_view why) {
  const std::string reason = fl::StrCat("asked for the initial model ", (NowNs() - initial_model_asked_ns_) / kMsToNs,
                                        " ms ago, ", why, "; client '", next_client, "' is asked instead");
  spdlog::warn("client '{}' was {}", holder_id, reason);
  ClientInfo* holder = clients_.Find(holder_id);
  if (holder == nullptr) return;
  DisconnectClient(*holder, fl::StrCat("this client was ", reason));
  RecordClientEvent(holder_id, instrumentation::ClientEventKind::kInitialModelReasked, std::nullopt, "", reason);
  Record(instrumentation::ClientLeftRecord{config_.experiment_id, holder_id, UnixMs(), reason});
}

void RoundEngine::Core::ReaskInitialModelIfStalled(int64_t now) {
  if (initial_model_client_.empty() || initial_model_upload_in_progress_) return;
  ClientInfo* holder = clients_.Find(initial_model_client_);
  const bool connected = holder != nullptr && holder->session != nullptr;
  const int64_t asked_ago = now - initial_model_asked_ns_;
  const int64_t deadline = int64_t{config_.initial_model_deadline_ms} * kMsToNs;
  // A holder that went away gets the same grace as at Join (30 s to upload before opening its session).
  if (asked_ago < deadline && (connected || asked_ago < std::min<int64_t>(deadline, int64_t{30'000} * kMsToNs))) {
    return;
  }
  // Another connected client, in name order: it joined while the holder was asked, so it trains the holder's
  // model (Join compared them) and can provide the weights.
  ClientInfo* next = nullptr;
  for (auto& [id, c] : clients_.all()) {
    if (id != initial_model_client_ && c->session != nullptr) {
      next = c.get();
      break;
    }
  }
  if (next == nullptr) return;  // none: the next client to join is asked (HandleJoin)
  AbandonInitialModelHolder(initial_model_client_, next->id,
                            asked_ago >= deadline ? fl::StrCat("it has not uploaded it within "
                                                               "--initial-model-deadline-ms=",
                                                               config_.initial_model_deadline_ms)
                                                  : std::string("its session ended without the upload"));
  // pending_spec_ stays: the next client's model equals it (Join compared them); its Join sets it again.
  initial_model_client_ = next->id;
  initial_model_asked_ns_ = now;
  ArmAt(initial_model_timer_, now + int64_t{config_.initial_model_deadline_ms} * kMsToNs);
  // The protocol asks for the initial model only in a Join answer: the session is closed with the reason,
  // fl-client joins again at once, and that Join asks it (it is the holder now).
  spdlog::info("asking client '{}' for the initial model (it joins again to receive the request)", next->id);
  DisconnectClient(*next, "the server asks this client for the initial model: join again to receive the request");
}

void RoundEngine::Core::DisconnectClient(ClientInfo& client, std::string_view why, grpc::StatusCode code) {
  if (client.session != nullptr) {
    client.session->Close(grpc::Status(code, std::string(why)));
    DetachSession(client);
    UpdateConnectedGauge();
  }
  ReleasePlace(client);
  if (!client.open_task.empty()) {
    auto t = tasks_.find(client.open_task);
    if (t != tasks_.end()) CloseTaskAsDropped(*t->second, why);
  }
}

std::vector<RoundEngine::Core::ClientInfo*> RoundEngine::Core::IdleConnectedClients() {
  return clients_.IdleConnected();
}

void RoundEngine::Core::AttachSession(ClientInfo& client, std::shared_ptr<SessionChannel> channel) {
  clients_.AttachSession(client, std::move(channel));
}

void RoundEngine::Core::DetachSession(ClientInfo& client) { clients_.DetachSession(client); }

RoundEngine::Core::ClientInfo* RoundEngine::Core::ClientOfSession(const SessionChannel* channel) {
  return clients_.ClientOfSession(channel);
}

void RoundEngine::Core::HoldPlace(ClientInfo& client, int64_t seen_ns) {
  // A newly held place takes the client off the idle newcomers (engine_peers.cc).
  if (clients_.HoldPlace(client, seen_ns) && peers_state_ != nullptr) {
    PeersState& peers = *peers_state_;
    if (auto idle = peers.idle_position.find(&client); idle != peers.idle_position.end()) {
      peers.idle_newcomers.erase(idle->second);
      peers.idle_position.erase(idle);
    }
  }
  published_.places_held.store(clients_.places_held(), std::memory_order_relaxed);
}

void RoundEngine::Core::ReleasePlace(ClientInfo& client) {
  if (!clients_.ReleasePlace(client)) return;
  published_.places_held.store(clients_.places_held(), std::memory_order_relaxed);
  if (!client.tasked && config_.max_idle_newcomers != 0) {
    PeersState& peers = peers_state();
    if (peers.idle_position.count(&client) == 0) {
      peers.idle_position[&client] = peers.idle_newcomers.insert(peers.idle_newcomers.end(), &client);
    }
    // Not forgotten here: callers still use `client`. The handlers call ForgetIdleNewcomers when done with it.
  }
}

void RoundEngine::Core::CheckHeartbeats(int64_t now) {
  WriteRefusalSummaries(/*all=*/false);  // a flood that stopped still gets its summary row within a while
  // Liveness: a client that has said nothing for four heartbeat intervals is gone, even if TCP has not
  // noticed yet (a Pi that lost its 5G link keeps the socket half-open for minutes). the registry's places are ordered
  // by when each client was last heard (moved to the back on every message), so only the silent front is looked at:
  // O(evicted) a check, not O(clients). A client the engine has not heard from may still have been heard by its reactor
  // (the engine runs late, its messages wait in the queue): the reactor's arrival time counts, and such a client goes
  // to the back instead of out. Each client is looked at once per check.
  const int64_t limit = 4 * int64_t{config_.heartbeat_interval_ms} * kMsToNs;
  for (size_t budget = clients_.places_held(); budget > 0 && clients_.places_held() > 0; --budget) {
    ClientInfo& c = *clients_.places().front();
    if (now - c.last_seen_ns <= limit) break;
    const int64_t arrived = c.session != nullptr ? c.session->last_received_ns() : 0;
    if (now - arrived <= limit) {
      HoldPlace(c, arrived);
      continue;
    }
    if (c.session == nullptr) {
      ReleasePlace(c);  // admitted long ago and never opened its session: its place is free again
      continue;
    }
    spdlog::warn("client '{}' missed its heartbeats; disconnecting it", c.id);
    const std::string why = fl::StrCat("no heartbeat for four intervals (", (now - c.last_seen_ns) / kMsToNs,
                                       " ms silent, --heartbeat-interval-ms=", config_.heartbeat_interval_ms, ")");
    RecordClientEvent(c.id, instrumentation::ClientEventKind::kSessionClosed, std::nullopt, c.open_task, why);
    DisconnectClient(c, "no heartbeat for four intervals");
  }
  ForgetIdleNewcomers();
}

void RoundEngine::Core::RecordClientEvent(const std::string& client_id, instrumentation::ClientEventKind kind,
                                          std::optional<uint64_t> round, std::string task_id, std::string reason) {
  instrumentation::ClientEventRecord rec;
  rec.experiment_id = config_.experiment_id;
  rec.client_id = client_id;
  rec.kind = kind;
  if (round.has_value()) rec.round = static_cast<int64_t>(*round);
  rec.task_id = std::move(task_id);
  rec.reason = std::move(reason);
  rec.at_unix_ms = UnixMs();
  Record(std::move(rec));
}

void RoundEngine::Core::RecordBadToken(const std::string& peer, const std::string& client_id, std::string detail) {
  instrumentation::SecurityEventRecord record;
  record.reason = instrumentation::SecurityRefusal::kBadToken;
  record.peer = peer;
  record.claimed = LogSafe(client_id, 128);
  record.detail = std::move(detail);
  RecordSecurityRefusal(std::move(record));
}

void RoundEngine::Core::HandleSecurityRefusal(SecurityRefusalEvent& e) { RecordSecurityRefusal(std::move(e.record)); }

void RoundEngine::Core::HandleCertificatesRevoked(const CertificatesRevokedEvent& e) {
  // The service refuses a revoked certificate's next call; a session that is open already is closed here, so that
  // a revoked client does not keep training (or holding its place in a round) on the stream it has.
  for (auto& [id, c] : clients_.all()) {
    if (c->cert_serial.empty() || e.serials.count(c->cert_serial) == 0) continue;
    const std::string why =
        fl::StrCat("the certificate of client \"", id, "\" (serial ", c->cert_serial, ") was revoked");
    spdlog::warn("{}: closing its session", why);
    instrumentation::SecurityEventRecord record;
    record.reason = instrumentation::SecurityRefusal::kRevokedCertificate;
    record.peer = c->peer;
    record.identity = id;
    record.claimed = id;
    record.detail = fl::StrCat(why, "; its session is closed");
    RecordSecurityRefusal(std::move(record));
    DisconnectClient(*c, why, grpc::StatusCode::PERMISSION_DENIED);
    c->token.clear();  // nothing it holds lets it act any more, whatever it presents
  }
}

}  // namespace fl::server
