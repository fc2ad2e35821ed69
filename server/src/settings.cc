// The table of settings (settings.h) and what comes from it.
#include "fl/server/settings.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "fl/config/field_table.h"
#include "fl/config/yaml_fields.h"
#include "fl/core/aggregator.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/log_format.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/convert.h"
#include "fl/server/staleness.h"

namespace fl::server {
namespace {

constexpr double kU32 = std::numeric_limits<uint32_t>::max();
constexpr double kU64 = 18446744073709551615.0;  // the largest uint64_t (a double rounds it to 2^64)

// Shortest text that reads back as the same double ("0.05", "1e+08").
std::string NumberText(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::string Text(uint32_t v) { return std::to_string(v); }
std::string Text(uint64_t v) { return std::to_string(v); }
std::string Text(double v) { return NumberText(v); }
std::string Text(const std::string& v) { return v; }

// `text` is canonical and checked (CheckSettingValue) before a setter sees it.
uint64_t ToU64(const std::string& text) {
  uint64_t v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}
double ToDouble(const std::string& text) {
  double v = 0;
  std::from_chars(text.data(), text.data() + text.size(), v);
  return v;
}
void From(const std::string& t, uint32_t& out) { out = static_cast<uint32_t>(ToU64(t)); }
void From(const std::string& t, uint64_t& out) { out = ToU64(t); }
void From(const std::string& t, double& out) { out = ToDouble(t); }
void From(const std::string& t, std::string& out) { out = t; }

// Binds a setting to an EngineConfig member.
#define FL_MEMBER(expr)                               \
  [](const EngineConfig& c) { return Text(c.expr); }, \
      [](EngineConfig& c, const std::string& text) { From(text, c.expr); }
// Binds a setting to a field of the clients' TrainConfig.
#define FL_TRAIN(field, type, parse)                                              \
  [](const EngineConfig& c) { return Text(static_cast<type>(c.train.field())); }, \
      [](EngineConfig& c, const std::string& text) { c.train.set_##field(parse(text)); }

std::string Identity(const std::string& t) { return t; }

// Fluent declarations (the table below reads one setting per statement).
struct S : Setting {
  S(std::string n, std::string f, SettingType t, std::string u, double lo, double hi, std::string h,
    std::function<std::string(const EngineConfig&)> g, std::function<void(EngineConfig&, const std::string&)> st) {
    name = std::move(n);
    flag = std::move(f);
    type = t;
    unit = std::move(u);
    min = lo;
    max = hi;
    help = std::move(h);
    get = std::move(g);
    set = std::move(st);
  }
  S& Manifest(std::string path, std::string record = {}) {
    manifest = std::move(path);
    manifest_record = record.empty() ? manifest.substr(manifest.rfind('.') + 1) : std::move(record);
    return *this;
  }
  S& InOldManifests() {
    in_old_manifest_records = true;
    return *this;
  }
  S& ManifestUnit(std::string u, double scale) {
    manifest_unit = std::move(u);
    manifest_scale = scale;
    return *this;
  }
  S& Required() {
    manifest_required = true;
    return *this;
  }
  S& OldZeroIsDefault() {
    old_zero_is_default = true;
    return *this;
  }
  S& NotRecorded() {
    recorded = false;
    return *this;
  }
  S& Open() {
    min_open = true;
    return *this;
  }
  S& ZeroOff() {
    zero_off = true;
    return *this;
  }
  S& Choices(std::vector<std::string> c) {
    choices = std::move(c);
    return *this;
  }
  S& Check(std::function<absl::Status(std::string_view)> fn, std::string what) {
    check = std::move(fn);
    allowed = std::move(what);
    return *this;
  }
  S& Default(std::string text) {
    default_text = std::move(text);
    return *this;
  }
  S& OnlyWhenBuffered() {
    applies = [](const EngineConfig& c) { return c.buffered(); };
    return *this;
  }
};

S Unsigned(std::string n, std::string f, std::string unit, double lo, double hi, std::string h,
           std::function<std::string(const EngineConfig&)> g,
           std::function<void(EngineConfig&, const std::string&)> s) {
  return S(std::move(n), std::move(f), SettingType::kUnsigned, std::move(unit), lo, hi, std::move(h), std::move(g),
           std::move(s));
}
S Number(std::string n, std::string f, std::string unit, double lo, double hi, std::string h,
         std::function<std::string(const EngineConfig&)> g, std::function<void(EngineConfig&, const std::string&)> s) {
  return S(std::move(n), std::move(f), SettingType::kNumber, std::move(unit), lo, hi, std::move(h), std::move(g),
           std::move(s));
}
S String(std::string n, std::string f, std::string h, std::function<std::string(const EngineConfig&)> g,
         std::function<void(EngineConfig&, const std::string&)> s) {
  return S(std::move(n), std::move(f), SettingType::kString, "", 0, 0, std::move(h), std::move(g), std::move(s));
}

absl::Status CheckCodec(std::string_view spec) {
  if (auto c = core::MakeCodec(spec); !c.ok()) return c.status();
  return absl::OkStatus();
}

const char kStrategies[] =
    "fedavg, fedprox, fedavgm, fedadam, fedyogi, fedadagrad, fedmedian, fedtrimmedavg[:beta], nesterov; optimizer "
    "options after a colon, e.g. fedadam:lr=0.03,tau=1e-3";

absl::Status CheckStrategy(std::string_view spec) {
  const std::string_view name = spec.substr(0, spec.find(':'));
  for (const char* known :
       {"fedavg", "fedprox", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "fedmedian", "fedtrimmedavg", "nesterov"}) {
    if (name == known) return absl::OkStatus();
  }
  return absl::InvalidArgumentError(fl::StrCat("strategy '", spec, "' is not known"));
}

std::vector<Setting> MakeSettings() {
  std::vector<Setting> t;
  std::string group;
  auto add = [&](S s) {
    s.group = group;
    t.push_back(std::move(s));
  };
  const std::string kOff = "0: off";

  group = "Experiment";
  add(String("experiment_name", "--experiment-name",
             "Name recorded with the experiment (fl-experiment: the manifest's name)", FL_MEMBER(experiment_name)));
  add(String("experiment_id", "--experiment-id", "Experiment id (default: generated; with --resume: which one)",
             FL_MEMBER(experiment_id))
          .NotRecorded());
  add(Unsigned("num_rounds", "--rounds", "rounds", 1, 1'000'000,
               "Rounds to commit (buffered aggregation: aggregation steps)", FL_MEMBER(num_rounds))
          .Manifest("server.rounds")
          .InOldManifests()
          .Required());
  add(Unsigned("seed", "--seed", "", 0, kU64, "Seed of client selection and of the clients' data order",
               FL_MEMBER(seed))
          .Manifest("seed")
          .InOldManifests());
  add(String("strategy", "--strategy", "Aggregation strategy", FL_MEMBER(strategy))
          .Check(CheckStrategy, kStrategies)
          .Manifest("server.strategy")
          .InOldManifests());

  group = "Selection and rounds";
  add(Number("fraction_fit", "--fraction-fit", "", 0, 1, "Fraction of connected clients asked to train",
             FL_MEMBER(fit.fraction))
          .Open()
          .Manifest("server.selection.fraction_fit")
          .InOldManifests());
  add(Unsigned("min_fit_clients", "--min-fit-clients", "clients", 1, 1'000'000,
               "Fewest clients to select, and fewest accepted updates for a round to commit",
               FL_MEMBER(fit.min_clients))
          .Manifest("server.selection.min_fit_clients")
          .InOldManifests());
  add(Unsigned("min_available_clients", "--min-available-clients", "clients", 1, 1'000'000,
               "Clients that must be connected to start a round (at least --min-fit-clients)",
               FL_MEMBER(fit.min_available))
          .Manifest("server.selection.min_available_clients")
          .InOldManifests());
  add(Number("fraction_evaluate", "--fraction-evaluate", "", 0, 1, "Fraction of clients asked to evaluate; 0: none",
             FL_MEMBER(fraction_evaluate))
          .Manifest("server.evaluation.fraction", "fraction_evaluate")
          .InOldManifests());
  add(Unsigned("min_evaluate_clients", "--min-evaluate-clients", "clients", 0, 1'000'000,
               "Fewest clients asked to evaluate", FL_MEMBER(min_evaluate_clients))
          .Manifest("server.evaluation.min_clients", "min_evaluate_clients"));
  add(Unsigned("evaluate_every", "--evaluate-every", "rounds", 0, 1'000'000,
               "Evaluate after every k-th round (and the last); 0: never", FL_MEMBER(evaluate_every))
          .Manifest("server.evaluation.every", "evaluate_every")
          .InOldManifests());
  add(Unsigned("round_deadline_ms", "--round-deadline-ms", "ms", 100, kU32,
               "Time from dispatch for updates to arrive; later ones are late", FL_MEMBER(round_deadline_ms))
          .Manifest("server.round_deadline_s")
          .ManifestUnit("s", 1000)
          .InOldManifests());
  add(Unsigned("evaluate_deadline_ms", "--evaluate-deadline-ms", "ms", 100, kU32, "Time from dispatch for evaluations",
               FL_MEMBER(evaluate_deadline_ms))
          .Manifest("server.evaluation.deadline_ms", "evaluate_deadline_ms"));
  add(Unsigned("max_round_attempts", "--max-round-attempts", "attempts", 1, 1000,
               "Attempts at a round (too few updates by the deadline) before the experiment fails",
               FL_MEMBER(max_round_attempts))
          .Manifest("server.max_round_attempts")
          .InOldManifests());
  add(Unsigned("initial_model_deadline_ms", "--initial-model-deadline-ms", "ms", 100, kU32,
               "Time the client asked for the initial model has to upload it; then another connected client is asked "
               "(logged, and recorded as the first one's left_reason)",
               FL_MEMBER(initial_model_deadline_ms))
          .Manifest("server.initial_model_deadline_ms"));

  group = "Clients' training (sent with every task)";
  add(Unsigned("local_epochs", "--local-epochs", "epochs", 0, 10'000,
               "Local epochs per round (ignored when --local-steps > 0)", FL_TRAIN(local_epochs, uint32_t, ToU64))
          .Default("1")
          .Manifest("training.local_epochs")
          .InOldManifests());
  add(Unsigned("local_steps", "--local-steps", "steps", 0, 100'000'000,
               "Local optimizer steps per round; 0: use --local-epochs", FL_TRAIN(local_steps, uint32_t, ToU64))
          .Default("0")
          .Manifest("training.local_steps")
          .InOldManifests());
  add(Unsigned("batch_size", "--batch-size", "examples", 1, 1'000'000, "Clients' mini-batch size",
               FL_TRAIN(batch_size, uint32_t, ToU64))
          .Default("32")
          .Manifest("training.batch_size")
          .InOldManifests());
  add(Number("learning_rate", "--lr", "", 0, 100, "Clients' learning rate", FL_TRAIN(learning_rate, double, ToDouble))
          .Open()
          .Default("0.05")
          .Manifest("training.lr")
          .InOldManifests());
  add(String("client_optimizer", "--client-optimizer", "Clients' optimizer", FL_TRAIN(optimizer, std::string, Identity))
          .Choices({"sgd", "adamw"})
          .Default("sgd")
          .Manifest("training.optimizer")
          .InOldManifests());
  add(Number("momentum", "--momentum", "", 0, 0.999999, "Clients' SGD momentum", FL_TRAIN(momentum, double, ToDouble))
          .Default("0")
          .Manifest("training.momentum")
          .InOldManifests());
  add(Number("weight_decay", "--weight-decay", "", 0, 100, "Clients' weight decay",
             FL_TRAIN(weight_decay, double, ToDouble))
          .Default("0")
          .Manifest("training.weight_decay")
          .InOldManifests());
  add(Number("proximal_mu", "--proximal-mu", "", 0, 1e6, "FedProx proximal coefficient mu (with --strategy fedprox)",
             FL_TRAIN(proximal_mu, double, ToDouble))
          .Default("0")
          .Manifest("training.proximal_mu")
          .InOldManifests());

  group = "Codecs";
  const std::string codecs = "fp32, fp16, bf16, int8, int4, fp4, sign1, optionally with a block size (int8:128)";
  add(String("uplink_codec", "--uplink-codec", "Codec of client updates", FL_MEMBER(uplink_codec))
          .Check(CheckCodec, codecs)
          .Manifest("codecs.uplink")
          .InOldManifests());
  add(String("uplink_codec_policy", "--uplink-codec-policy",
             "Uplink codec per client (docs/stragglers.md), by link kind or by the rate the server measured from the "
             "client's last upload (bytes/s); empty: every client --uplink-codec",
             FL_MEMBER(uplink_codec_policy))
          .Check([](std::string_view text) { return core::ParseCodecPolicy(text, "fp32").status(); },
                 "fixed, by-link:KIND=CODEC,...,default=CODEC or by-rate:BYTES_PER_S=CODEC,...,default=CODEC")
          .Manifest("server.uplink_codec_policy")
          .InOldManifests());
  add(String("downlink_codec", "--downlink-codec", "Codec of model downloads", FL_MEMBER(downlink_codec))
          .Check(CheckCodec, codecs)
          .Manifest("codecs.downlink")
          .InOldManifests());

  group = "Stragglers";
  add(Number("overcommit", "--overcommit", "x", 1, 100,
             "Over-commitment: select ceil(F x K) clients, commit with the first K updates and cancel the rest (1 = "
             "off)",
             FL_MEMBER(overcommit))
          .Manifest("server.selection.overcommit")
          .InOldManifests());
  add(String("deadline_policy", "--deadline-policy",
             "An update after its round committed: drop (recorded late) or fold (folded into the next round's "
             "aggregate with weight n x (1 + tau)^-a, a = --late-discount)",
             FL_MEMBER(deadline_policy))
          .Choices({"drop", "fold"})
          .Manifest("server.deadline_policy")
          .InOldManifests());
  add(Number("late_discount", "--late-discount", "", 0, 100,
             "a of --deadline-policy fold: a late update's weight is n x (1 + tau)^-a, tau = model versions late "
             "(0 = no discount)",
             FL_MEMBER(late_discount))
          .Manifest("server.late_discount")
          .InOldManifests());

  group = "Buffered aggregation";
  add(String("aggregation", "--aggregation",
             "synchronous (rounds) or buffered (FedBuff: --concurrency clients train on the newest model, an "
             "aggregation step every --buffer-size updates; --rounds counts steps; docs/round-engine.md)",
             FL_MEMBER(aggregation))
          .Choices({"synchronous", "buffered"})
          .Manifest("server.aggregation")
          .InOldManifests());
  add(Unsigned("buffer_size", "--buffer-size", "updates", 1, 1'000'000, "Buffered: updates per aggregation step",
               FL_MEMBER(buffer_size))
          .OnlyWhenBuffered()
          .Manifest("server.buffered.buffer_size")
          .InOldManifests()
          .OldZeroIsDefault());
  add(Unsigned("concurrency", "--concurrency", "clients", 1, 1'000'000, "Buffered: clients training at once",
               FL_MEMBER(concurrency))
          .OnlyWhenBuffered()
          .Manifest("server.buffered.concurrency")
          .InOldManifests()
          .OldZeroIsDefault());
  add(Unsigned("max_staleness", "--max-staleness", "model versions", 1, 1'000'000,
               "Buffered: an update trained from a model more versions behind than this is refused",
               FL_MEMBER(max_staleness))
          .OnlyWhenBuffered()
          .Manifest("server.buffered.max_staleness")
          .InOldManifests()
          .OldZeroIsDefault());
  add(String("staleness_weight", "--staleness-weight",
             "Buffered: weight s(tau) of an update tau versions behind: constant, or poly:a=A (1/(1+tau)^A)",
             FL_MEMBER(staleness_weight))
          .Check([](std::string_view text) { return ParseStalenessWeight(text).status(); }, "constant or poly:a=A")
          .Manifest("server.buffered.staleness_weight")
          .InOldManifests()
          .OldZeroIsDefault());

  group = "Checks of updates";
  add(String("clip_update_norm", "--clip-update-norm",
             "Bound on each update's L2 norm (float tensors): off, median (the median norm of the round's updates; "
             "only fedmedian/fedtrimmedavg) or a number; an update above it is scaled down to it. Empty: median for "
             "fedmedian and fedtrimmedavg, off otherwise",
             FL_MEMBER(clip_update_norm))
          .Check(
              [](std::string_view text) {
                return text.empty() ? absl::OkStatus() : core::NormClip::Parse(text).status();
              },
              "off, median or a number > 0; empty: the strategy's default")
          .Manifest("server.updates.clip_norm", "clip_update_norm"));
  add(Number("max_update_value", "--max-update-value", "", 0, static_cast<double>(core::kMaxUpdateAbsValue),
             "Largest |value| an update (a pseudo-gradient) may carry when no update norm bound is in effect "
             "(--clip-update-norm off, the default of fedavg & co.); an update with a larger one is rejected naming "
             "the tensor, element and value",
             FL_MEMBER(max_update_value))
          .Open()
          .Manifest("server.updates.max_value", "max_update_value"));
  add(Unsigned("max_model_values", "--max-model-values", "values", 1, static_cast<double>(core::kMaxSpecElements),
               "Largest model (parameters and buffers) a first client may declare; a bigger spec is refused at Join "
               "naming this flag (the default, 2^29, is 2 GiB of fp32)",
               FL_MEMBER(max_model_values))
          .Manifest("server.updates.max_model_values", "max_model_values"));
  add(Unsigned("max_client_examples", "--max-client-examples", "examples", 1, core::kMaxUpdateWeight,
               "Most train or test examples one client may declare at Join; an update's weight is bounded by what its "
               "client declared (or --local-steps x --batch-size) and by this",
               FL_MEMBER(max_client_examples))
          .Manifest("server.updates.max_client_examples", "max_client_examples"));

  group = "Sessions and transfers";
  add(Unsigned("upload_slots", "--upload-slots", "uploads", 1, 100'000,
               "Updates received at once (bounds server memory)", FL_MEMBER(upload_slots))
          .Manifest("server.upload_slots")
          .InOldManifests()
          .OldZeroIsDefault());
  add(Unsigned("heartbeat_interval_ms", "--heartbeat-interval-ms", "ms", 50, kU32,
               "Client heartbeat interval; clients silent for 4 intervals are considered gone",
               FL_MEMBER(heartbeat_interval_ms))
          .Manifest("server.sessions.heartbeat_interval_ms", "heartbeat_interval_ms"));
  add(Unsigned("session_max_messages_per_s", "--session-max-messages-per-s", "messages/s", 1, kU32,
               "Messages a client may send on its session per second (bursts up to twice that); a session over it is "
               "closed with RESOURCE_EXHAUSTED. At least 4 per heartbeat interval",
               FL_MEMBER(session_max_messages_per_s))
          .Manifest("server.sessions.max_messages_per_s", "session_max_messages_per_s"));
  add(Unsigned("session_max_queued_messages", "--session-max-queued-messages", "messages", 16, kU32,
               "Server messages that may wait for a client that does not read its session; one more closes the "
               "session with RESOURCE_EXHAUSTED",
               FL_MEMBER(session_max_queued_messages))
          .Manifest("server.sessions.max_queued_messages", "session_max_queued_messages"));
  add(Unsigned("session_hello_timeout_ms", "--session-hello-timeout-ms", "ms", 100, kU32,
               "A Session stream that has not sent its SessionHello by then is closed with DEADLINE_EXCEEDED",
               FL_MEMBER(session_hello_timeout_ms))
          .Manifest("server.sessions.hello_timeout_ms", "session_hello_timeout_ms"));
  add(Unsigned("upload_min_bytes_per_s", "--upload-min-bytes-per-s", "bytes/s", 0, kU32,
               "An upload holding a slot must average at least this rate (checked after --upload-rate-grace-ms), or it "
               "loses its slot with RESOURCE_EXHAUSTED; " +
                   kOff,
               FL_MEMBER(upload_min_bytes_per_s))
          .Manifest("server.sessions.upload_min_bytes_per_s", "upload_min_bytes_per_s"));
  add(Unsigned("upload_rate_grace_ms", "--upload-rate-grace-ms", "ms", 0, kU32,
               "Time an upload holds its slot before its rate is checked", FL_MEMBER(upload_rate_grace_ms))
          .Manifest("server.sessions.upload_rate_grace_ms", "upload_rate_grace_ms"));
  add(Unsigned("upload_message_timeout_ms", "--upload-message-timeout-ms", "ms", 100, kU32,
               "An upload holding a slot that sends no message for this long loses its slot with DEADLINE_EXCEEDED (a "
               "stopped or stalled client); an upload that sends no header for this long is cut off too; " +
                   kOff,
               FL_MEMBER(upload_message_timeout_ms))
          .ZeroOff()
          .Manifest("server.sessions.upload_message_timeout_ms", "upload_message_timeout_ms"));
  add(Unsigned("download_message_timeout_ms", "--download-message-timeout-ms", "ms", 100, kU32,
               "A model download whose next chunk the client does not read for this long is cancelled; " + kOff,
               FL_MEMBER(download_message_timeout_ms))
          .ZeroOff()
          .Manifest("server.sessions.download_message_timeout_ms", "download_message_timeout_ms"));
  add(Unsigned("max_chunk_bytes", "--max-chunk-bytes", "bytes", 1024, wire::kMaxChunkBytes,
               "Largest chunk of a model download or an update upload", FL_MEMBER(max_chunk_bytes))
          .Manifest("server.sessions.max_chunk_bytes", "max_chunk_bytes"));

  group = "Fleets and overload";
  add(Unsigned("max_sessions", "--max-sessions", "sessions", 0, kU32,
               "Clients holding a session (or admitted and about to open one) at once; more Joins are refused "
               "RESOURCE_EXHAUSTED with a retry-after. 0: a quarter of physical memory at 64 KiB a session",
               FL_MEMBER(max_sessions))
          .Manifest("server.fleet.max_sessions", "max_sessions"));
  add(Unsigned("max_engine_queue", "--max-engine-queue", "events", 0, kU32,
               "Events waiting for the round engine above which new Joins are shed (RESOURCE_EXHAUSTED with a "
               "retry-after); 0: never shed",
               FL_MEMBER(max_engine_queue))
          .Manifest("server.fleet.max_engine_queue", "max_engine_queue"));
  add(Unsigned("join_retry_after_ms", "--join-retry-after-ms", "ms", 1, 600'000,
               "The retry-after of a shed or over-limit Join (ErrorDetail hint, trailing metadata retry-after-ms)",
               FL_MEMBER(join_retry_after_ms))
          .Manifest("server.fleet.join_retry_after_ms", "join_retry_after_ms"));
  add(Unsigned("max_idle_newcomers", "--max-idle-newcomers", "clients", 0, kU32,
               "Clients that joined but never had a task and hold no place, kept in memory and in the clients table; "
               "past this many the oldest are forgotten; 0: no bound",
               FL_MEMBER(max_idle_newcomers))
          .Manifest("server.fleet.max_idle_newcomers", "max_idle_newcomers"));

  group = "Abuse limits (per address, per certificate)";
  add(Number(
          "join_per_s_per_peer", "--join-per-s-per-peer", "Joins/s", 0, 1e9,
          "Joins per second one address may make (bursts of twice that); more are refused RESOURCE_EXHAUSTED; " + kOff,
          FL_MEMBER(join_per_s_per_peer))
          .Manifest("server.abuse.join_per_s_per_peer", "join_per_s_per_peer"));
  add(Number("join_per_s_per_identity", "--join-per-s-per-identity", "Joins/s", 0, 1e9,
             "Joins per second one client certificate may make (mutual TLS; bursts of five); " + kOff,
             FL_MEMBER(join_per_s_per_identity))
          .Manifest("server.abuse.join_per_s_per_identity", "join_per_s_per_identity"));
  add(Unsigned("max_sessions_per_peer", "--max-sessions-per-peer", "sessions", 0, kU32,
               "Session streams open at once from one address; " + kOff, FL_MEMBER(max_sessions_per_peer))
          .Manifest("server.abuse.max_sessions_per_peer", "max_sessions_per_peer"));
  add(Unsigned("max_sessions_per_identity", "--max-sessions-per-identity", "sessions", 0, kU32,
               "Session streams open at once with one client certificate (mutual TLS); " + kOff,
               FL_MEMBER(max_sessions_per_identity))
          .Manifest("server.abuse.max_sessions_per_identity", "max_sessions_per_identity"));
  add(Unsigned("max_uploads_per_peer", "--max-uploads-per-peer", "uploads", 0, kU32,
               "Uploads open at once from one address; " + kOff, FL_MEMBER(max_uploads_per_peer))
          .Manifest("server.abuse.max_uploads_per_peer", "max_uploads_per_peer"));
  add(Unsigned("max_uploads_per_identity", "--max-uploads-per-identity", "uploads", 0, kU32,
               "Uploads open at once with one client certificate (mutual TLS); " + kOff,
               FL_MEMBER(max_uploads_per_identity))
          .Manifest("server.abuse.max_uploads_per_identity", "max_uploads_per_identity"));

  group = "Checkpoints";
  add(String("checkpoint_dir", "--checkpoint-dir",
             "Write a checkpoint per committed round here (fl-experiment: <out>/checkpoints); empty: none",
             FL_MEMBER(checkpoint_dir))
          .NotRecorded());
  add(Unsigned("keep_checkpoints", "--keep-checkpoints", "checkpoints", 1, 1'000'000, "Checkpoints kept",
               FL_MEMBER(keep_checkpoints))
          .Manifest("server.keep_checkpoints"));
  return t;
}

std::string Bounds(const Setting& s, double scale) {
  auto num = [&](double v) {
    if (v >= kU64) return std::string("18446744073709551615");
    const double scaled = v / scale;
    // Whole bounds as whole numbers (1000000, not 1e+06).
    if (scaled == std::floor(scaled) && std::fabs(scaled) < 1e15) return std::to_string(static_cast<int64_t>(scaled));
    return NumberText(scaled);
  };
  std::string b = fl::StrCat(s.min_open ? "(" : "[", num(s.min), ", ", num(s.max), "]");
  if (s.zero_off) b = fl::StrCat(b, " or 0 (off)");
  return b;
}

std::string WithUnit(std::string_view value, std::string_view unit) {
  return unit.empty() ? std::string(value) : fl::StrCat(value, " ", unit);
}

}  // namespace

std::string Setting::Describe() const {
  std::string d = fl::StrCat("setting ", name, " (", flag);
  if (!manifest.empty()) d = fl::StrCat(d, ", manifest ", manifest);
  d += ")";
  if (type == SettingType::kString) {
    if (!choices.empty()) return fl::StrCat(d, ", one of ", config::JoinList(choices));
    return allowed.empty() ? d : fl::StrCat(d, ", ", allowed);
  }
  if (!unit.empty()) d = fl::StrCat(d, " in ", unit);
  d = fl::StrCat(d, ", within ", Bounds(*this, 1));
  if (type == SettingType::kUnsigned) d += " (whole numbers)";
  if (manifest_scale != 1) {
    d = fl::StrCat(d, " (a manifest gives ", manifest_unit, ": ", Bounds(*this, manifest_scale), ")");
  }
  return d;
}

const std::vector<Setting>& Settings() {
  static const auto& table = *new std::vector<Setting>(MakeSettings());
  return table;
}

const Setting* FindSetting(std::string_view key) {
  for (const Setting& s : Settings()) {
    if (s.name == key || s.flag == key || (!s.manifest.empty() && s.manifest == key)) return &s;
  }
  return nullptr;
}

EngineConfig DefaultEngineConfig() {
  EngineConfig c;
  for (const Setting& s : Settings()) {
    if (!s.default_text.empty()) s.set(c, s.default_text);
  }
  return c;
}

absl::StatusOr<std::string> CheckSettingValue(const Setting& s, std::string_view text, std::string_view source,
                                              std::string_view given) {
  const std::string as_given = given.empty() ? WithUnit(text, s.unit) : std::string(given);
  auto refuse = [&](std::string_view why) {
    return absl::InvalidArgumentError(fl::StrCat(source, ": ", as_given, " ", why, " for ", s.Describe()));
  };
  switch (s.type) {
    case SettingType::kString: {
      if (!s.choices.empty()) {
        for (const std::string& c : s.choices) {
          if (c == text) return std::string(text);
        }
        return refuse("is not allowed");
      }
      if (s.check) {
        if (absl::Status st = s.check(text); !st.ok()) {
          return refuse(fl::StrCat("is not allowed (", fl::ToStd(st.message()), ")"));
        }
      }
      return std::string(text);
    }
    case SettingType::kUnsigned: {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
        return refuse("is not a whole number");
      }
      const uint64_t max = s.max >= kU64 ? UINT64_MAX : static_cast<uint64_t>(s.max);
      const bool off = s.zero_off && v == 0;
      if (!off && (static_cast<double>(v) < s.min || v > max)) return refuse("is out of bounds");
      return std::to_string(v);
    }
    case SettingType::kNumber: {
      double v = 0;
      const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
      if (text.empty() || ec != std::errc() || end != text.data() + text.size() || !std::isfinite(v)) {
        return refuse("is not a finite number");
      }
      const bool off = s.zero_off && v == 0;
      if (!off && (v < s.min || (s.min_open && v == s.min) || v > s.max)) return refuse("is out of bounds");
      return NumberText(v);
    }
  }
  return std::string(text);
}

absl::StatusOr<std::string> CheckManifestNumber(const Setting& s, double value, std::string_view source) {
  const std::string given = s.manifest_scale == 1
                                ? WithUnit(NumberText(value), s.unit)
                                : fl::StrCat(NumberText(value), " ", s.manifest_unit, " (",
                                             WithUnit(NumberText(value * s.manifest_scale), s.unit), ")");
  double v = value * s.manifest_scale;
  // 0.1 s is 100.00000000000001 ms in binary: a product within a millionth of a whole number is that number.
  if (s.manifest_scale != 1 && std::fabs(v - std::round(v)) < 1e-6 * std::max(1.0, std::fabs(v))) v = std::round(v);
  if (s.type == SettingType::kUnsigned) {
    if (!(v >= 0) || v != std::floor(v) || v > kU64) {
      return absl::InvalidArgumentError(fl::StrCat(source, ": ", given, " is not a whole number of ",
                                                   s.unit.empty() ? "units" : s.unit, " for ", s.Describe()));
    }
    // Exact for the integers a double holds (up to 2^53); seeds beyond that are read from their text instead.
    char buf[32];
    const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), static_cast<uint64_t>(v));
    return CheckSettingValue(s, std::string_view(buf, ec == std::errc() ? end - buf : 0), source, given);
  }
  return CheckSettingValue(s, NumberText(v), source, given);
}

absl::Status SettingSources::Add(const Setting& s, std::string_view text, std::string source, std::string given) {
  absl::StatusOr<std::string> value = CheckSettingValue(s, text, source, given);
  if (!value.ok()) return value.status();
  if (given.empty()) given = WithUnit(*value, s.unit);
  auto it = values_.find(s.name);
  if (it == values_.end()) {
    values_.emplace(s.name, Value{*value, std::move(source), std::move(given)});
    return absl::OkStatus();
  }
  if (it->second.text == *value) return absl::OkStatus();  // the same value twice: no disagreement
  return absl::InvalidArgumentError(fl::StrCat(it->second.source, " gives ", it->second.given, " but ", source,
                                               " gives ", given, " for ", s.Describe(),
                                               ": give the setting once, or the same value in both"));
}

void SettingSources::ApplyTo(EngineConfig& config) const {
  for (const Setting& s : Settings()) {
    if (auto it = values_.find(s.name); it != values_.end()) s.set(config, it->second.text);
  }
}

absl::Status SettingFlags::AddTo(SettingSources& sources) const {
  for (const auto& [s, v] : given) {
    if (absl::Status st = sources.Add(*s, v, s->flag); !st.ok()) return st;
  }
  return absl::OkStatus();
}

void AddSettingOptions(CLI::App& app, SettingFlags& flags) {
  const EngineConfig defaults = DefaultEngineConfig();
  std::map<std::string, CLI::Option_group*> groups;
  for (const Setting& s : Settings()) {
    CLI::Option_group*& group = groups[s.group];
    if (group == nullptr) group = app.add_option_group(s.group);
    std::string help = s.help;
    if (s.type != SettingType::kString) {
      help =
          fl::StrCat(help, " (", s.unit.empty() ? "" : fl::StrCat("in ", s.unit, ", "), "within ", Bounds(s, 1), ")");
    } else if (!s.choices.empty()) {
      help = fl::StrCat(help, " (one of ", config::JoinList(s.choices), ")");
    } else if (!s.allowed.empty()) {
      help = fl::StrCat(help, " (", s.allowed, ")");
    }
    if (!s.manifest.empty()) {
      help = fl::StrCat(help, " [manifest: ", s.manifest,
                        s.manifest_scale != 1 ? fl::StrCat(", in ", s.manifest_unit) : "", "]");
    }
    const Setting* setting = &s;
    CLI::Option* o = group->add_option_function<std::string>(
        s.flag, [&flags, setting](const std::string& v) { flags.given.emplace_back(setting, v); }, help);
    o->default_str(s.get(defaults));
    o->type_name(s.type == SettingType::kString ? "TEXT" : s.type == SettingType::kUnsigned ? "UINT" : "NUMBER");
  }
}

namespace {

// server.strategy as a map: {name: fedadam, options: {lr: 0.03, tau: 0.001}} -> "fedadam:lr=0.03,tau=0.001".
struct StrategySpec {
  std::string name;
  std::string options;  // "lr=0.03,tau=0.001"
};

const config::FieldTable<StrategySpec>& StrategyFields() {
  static const auto& table = *new config::FieldTable<StrategySpec>{
      config::StringField("name", &StrategySpec::name).Required(),
      config::CustomField<StrategySpec>(
          "options",
          [](const config::YamlMap& m, const std::string& key, StrategySpec& spec) -> absl::Status {
            absl::StatusOr<std::optional<config::YamlMap>> options =
                m.Map(key, "a map of option names to numbers, such as {lr: 0.03, tau: 0.001}");
            if (!options.ok()) return options.status();
            const YAML::Node n = (*options)->node();
            for (auto it = n.begin(); it != n.end(); ++it) {
              absl::StatusOr<std::optional<double>> v = (*options)->Number(it->first.Scalar(), -1e12, 1e12);
              if (!v.ok()) return v.status();
              spec.options = fl::StrCat(spec.options, spec.options.empty() ? "" : ",", it->first.Scalar(), "=",
                                        it->second.Scalar());
            }
            return absl::OkStatus();
          }),
  };
  return table;
}

}  // namespace

absl::StatusOr<std::optional<std::string>> ReadSettingYaml(const config::YamlMap& map, const std::string& key,
                                                           const Setting& s) {
  if (!map.Has(key)) return std::optional<std::string>();
  const YAML::Node n = map.Node(key);
  const std::string source = fl::StrCat(map.file().empty() ? "<inline>" : map.file(), ":",
                                        n.Mark().line >= 0 ? n.Mark().line + 1 : 0, ": ", map.Path(key));
  std::string text;
  if (s.name == "strategy" && n.IsMap()) {
    absl::StatusOr<std::optional<config::YamlMap>> m =
        map.Map(key, fl::StrCat("a strategy in fl-server --strategy syntax, or ", StrategyFields().Describe()));
    if (!m.ok()) return m.status();
    StrategySpec spec;
    if (absl::Status st = StrategyFields().Read(**m, spec); !st.ok()) return st;
    text = spec.options.empty() ? spec.name : fl::StrCat(spec.name, ":", spec.options);
  } else if (s.type == SettingType::kString) {
    absl::StatusOr<std::optional<std::string>> v = map.String(key, s.allowed);
    if (!v.ok()) return v.status();
    text = **v;
  } else {
    if (!n.IsScalar()) {
      return map.Error(n, key, fl::StrCat("expected a number, got ", config::DescribeYaml(n)), s.Describe());
    }
    // A whole number in the manifest's own unit is read from its text (a seed can exceed what a double holds).
    if (s.type == SettingType::kUnsigned && s.manifest_scale == 1) {
      absl::StatusOr<std::string> v = CheckSettingValue(s, n.Scalar(), source, WithUnit(n.Scalar(), s.unit));
      if (!v.ok()) return v.status();
      return std::optional<std::string>(*v);
    }
    absl::StatusOr<std::optional<double>> v = map.Number(key, {-1e300, 1e300});
    if (!v.ok()) return v.status();
    absl::StatusOr<std::string> checked = CheckManifestNumber(s, **v, source);
    if (!checked.ok()) return checked.status();
    return std::optional<std::string>(*checked);
  }
  absl::StatusOr<std::string> checked = CheckSettingValue(s, text, source);
  if (!checked.ok()) return checked.status();
  return std::optional<std::string>(*checked);
}

absl::Status ReadManifestSettings(const config::YamlMap& root, SettingSources& sources) {
  for (const Setting& s : Settings()) {
    if (s.manifest.empty()) continue;
    // Down the dotted path; an absent section leaves its settings to the other sources.
    std::optional<config::YamlMap> map = root;
    std::string_view rest = s.manifest;
    for (size_t dot = rest.find('.'); dot != std::string_view::npos && map.has_value(); dot = rest.find('.')) {
      absl::StatusOr<std::optional<config::YamlMap>> next = map->Map(rest.substr(0, dot));
      if (!next.ok()) return next.status();
      // Never assign a YamlMap: YAML::Node's assignment writes into the node it refers to (the manifest's root).
      map.reset();
      if (next->has_value()) map.emplace(**next);
      rest.remove_prefix(dot + 1);
    }
    if (!map.has_value()) continue;
    const std::string key(rest);
    absl::StatusOr<std::optional<std::string>> v = ReadSettingYaml(*map, key, s);
    if (!v.ok()) return v.status();
    if (!v->has_value()) continue;
    const YAML::Node n = map->Node(key);
    const std::string source =
        fl::StrCat(map->file(), ":", n.Mark().line >= 0 ? n.Mark().line + 1 : 0, ": ", map->Path(key));
    std::string given = n.IsScalar() ? n.Scalar() : **v;
    given = s.manifest_scale != 1 ? fl::StrCat(given, " ", s.manifest_unit, " (", WithUnit(**v, s.unit), ")")
                                  : WithUnit(given, s.unit);
    if (absl::Status st = sources.Add(s, **v, source, given); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::StatusOr<EngineConfig> ResolveSettings(const SettingFlags& flags, const std::string& manifest_path) {
  SettingSources sources;
  if (!manifest_path.empty()) {
    absl::StatusOr<YAML::Node> root = config::LoadYamlFile(manifest_path, "manifest");
    if (!root.ok()) return root.status();
    if (absl::Status s = ReadManifestSettings(config::YamlMap(*root, manifest_path, ""), sources); !s.ok()) return s;
  }
  if (absl::Status s = flags.AddTo(sources); !s.ok()) return s;
  EngineConfig config = DefaultEngineConfig();
  sources.ApplyTo(config);
  return config;
}

absl::Status CheckSettingBounds(const EngineConfig& config) {
  for (const Setting& s : Settings()) {
    if (s.applies && !s.applies(config)) continue;
    if (s.type == SettingType::kString && s.choices.empty()) continue;  // parsers: Validate runs them in context
    absl::StatusOr<std::string> v = CheckSettingValue(s, s.get(config), fl::StrCat(s.flag, "=", s.get(config)));
    if (!v.ok()) return v.status();
  }
  return absl::OkStatus();
}

std::vector<std::string> SettingArgs(const EngineConfig& config, const std::function<bool(const Setting&)>& include) {
  std::vector<std::string> args;
  for (const Setting& s : Settings()) {
    if (include && !include(s)) continue;
    const std::string value = s.get(config);
    if (value.empty()) continue;  // an empty text is the default of every setting that takes one
    args.push_back(s.flag);
    args.push_back(value);
  }
  return args;
}

std::string RecordedConfigJson(const EngineConfig& config) {
  nlohmann::json cfg = nlohmann::json::object();
  for (const Setting& s : Settings()) {
    if (!s.recorded) continue;
    const std::string v = s.get(config);
    switch (s.type) {
      case SettingType::kUnsigned: cfg[s.name] = ToU64(v); break;
      case SettingType::kNumber: cfg[s.name] = ToDouble(v); break;
      case SettingType::kString: cfg[s.name] = v; break;
    }
  }
  // Derived from the strategy (ResolveStrategy), for readers of the record: what the engine ran.
  cfg["aggregator"] = config.aggregator;
  cfg["optimizer"] = config.optimizer;
  return cfg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

absl::StatusOr<EngineConfig> ConfigFromRecordedJson(const std::string& json) {
  EngineConfig config = DefaultEngineConfig();
  try {
    const nlohmann::json j = nlohmann::json::parse(json);
    for (const Setting& s : Settings()) {
      if (!s.recorded || !j.contains(s.name)) continue;
      const nlohmann::json& v = j.at(s.name);
      std::string text;
      switch (s.type) {
        case SettingType::kUnsigned: text = std::to_string(v.get<uint64_t>()); break;
        case SettingType::kNumber: text = NumberText(v.get<double>()); break;
        case SettingType::kString: text = v.get<std::string>(); break;
      }
      s.set(config, text);
    }
    if (j.contains("aggregator")) config.aggregator = j.at("aggregator").get<std::string>();
    if (j.contains("optimizer")) config.optimizer = j.at("optimizer").get<std::string>();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(fl::StrCat("the recorded configuration cannot be read: ", e.what()));
  }
  return config;
}

}  // namespace fl::server
