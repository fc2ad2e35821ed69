// The table of settings (settings.h): one declaration per setting, in the order of fl-server --help. Adding a
// setting is one entry here (and its member in EngineConfig, and its use).
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "fl/core/aggregator.h"
#include "fl/core/codec.h"
#include "fl/core/codec_policy.h"
#include "fl/core/str_cat.h"
#include "fl/core/tensor_spec.h"
#include "fl/proto/convert.h"
#include "fl/server/settings.h"
#include "fl/server/staleness.h"
#include "settings_internal.h"

namespace fl::server::settings_internal {

std::string NumberText(double v) { return config::SettingNumberText(v); }

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

namespace {

constexpr double kU32 = std::numeric_limits<uint32_t>::max();

std::string Text(uint32_t v) { return std::to_string(v); }
std::string Text(uint64_t v) { return std::to_string(v); }
std::string Text(double v) { return NumberText(v); }
std::string Text(const std::string& v) { return v; }

// `text` is canonical and checked (CheckSettingValue) before a setter sees it.
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

}  // namespace

std::vector<Setting> MakeSettingsTable() {
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

  group = "Secure aggregation";
  add(String("secure_aggregation", "--secure-aggregation",
             "off, or secagg+: clients mask their quantised updates (SecAgg+, Bell et al. 2020) and the server only "
             "learns the sum of a round's survivors (docs/privacy.md)",
             FL_MEMBER(secure_aggregation))
          .Choices({"off", "secagg+"})
          .Manifest("server.secure_aggregation.mode", "secure_aggregation"));
  add(Unsigned("secagg_stage_deadline_ms", "--secagg-stage-deadline-ms", "ms", 100, kU32,
               "Secure aggregation: each key stage's and the unmask stage's deadline; who has not answered by then "
               "is dropped",
               FL_MEMBER(secagg_stage_deadline_ms))
          .Manifest("server.secure_aggregation.stage_deadline_s", "secagg_stage_deadline_s")
          .ManifestUnit("s", 1000));
  add(Number("secagg_range", "--secagg-range", "", 0, 1e6,
             "Secure aggregation: update values are clipped to [-range, range] before quantisation",
             FL_MEMBER(secagg_range))
          .Open()
          .Manifest("server.secure_aggregation.range", "secagg_range"));
  add(Number("secagg_scale", "--secagg-scale", "", 1, 1e9,
             "Secure aggregation: quantisation steps per unit (the mean is within 1 / (2 x scale) of the exact one)",
             FL_MEMBER(secagg_scale))
          .Manifest("server.secure_aggregation.scale", "secagg_scale"));
  add(Unsigned("secagg_max_weight", "--secagg-max-weight", "examples", 1, 1e6,
               "Secure aggregation: 1 = uniform mean; above 1, FedAvg weights (examples trained on, capped here)",
               FL_MEMBER(secagg_max_weight))
          .Manifest("server.secure_aggregation.max_weight", "secagg_max_weight"));
  add(Number("secagg_log_factor", "--secagg-log-factor", "", 0, 100,
             "Secure aggregation: c of the neighbourhood size k = odd >= c x log2(clients)",
             FL_MEMBER(secagg_log_factor))
          .Open()
          .Manifest("server.secure_aggregation.log_factor", "secagg_log_factor"));
  add(Unsigned("secagg_full_graph_max", "--secagg-full-graph-max", "clients", 2, 255,
               "Secure aggregation: rounds of at most this many clients mask with every pair (plain SecAgg)",
               FL_MEMBER(secagg_full_graph_max))
          .Manifest("server.secure_aggregation.full_graph_max", "secagg_full_graph_max"));
  add(Unsigned("secagg_threshold", "--secagg-threshold", "shares", 0, 255,
               "Secure aggregation: shares needed to reconstruct a secret, in (k/2, k]; 0 = floor(k / 2) + 1",
               FL_MEMBER(secagg_threshold))
          .Manifest("server.secure_aggregation.threshold", "secagg_threshold"));

  group = "Differential privacy";
  add(String("dp_mode", "--dp-mode",
             "Differential privacy: who adds the noise. central: the server, on the mean (clients clip under "
             "secure aggregation); local: every client clips to C and adds N(0, (sigma x C)^2) to its own update; "
             "distributed: every client adds its share of a discrete Gaussian noise of std sigma x C before "
             "masking (needs --secure-aggregation secagg+)",
             FL_MEMBER(dp_mode))
          .Choices({"central", "local", "distributed"})
          .Manifest("server.privacy.mode"));
  add(Number("dp_noise_multiplier", "--dp-noise-multiplier", "", 0, 1000,
             "Differential privacy: sigma; each update clipped to --dp-clip-norm C, Gaussian noise of std "
             "sigma x C / m on the mean of the round's m updates (uniform weights; --dp-mode says who adds it), "
             "epsilon accounted every round (docs/privacy.md)",
             FL_MEMBER(dp_noise_multiplier))
          .ZeroOff()
          .Manifest("server.privacy.noise_multiplier"));
  add(Number("dp_clip_norm", "--dp-clip-norm", "", 0, 1e9,
             "Differential privacy: C, the L2 norm each update is clipped to (adaptive clipping: the initial C)",
             FL_MEMBER(dp_clip_norm))
          .Open()
          .Manifest("server.privacy.clip_norm"));
  add(String("dp_clipping", "--dp-clipping",
             "Differential privacy: fixed C, or adaptive (C follows the --dp-target-quantile of the update norms, "
             "Andrew et al. 2021)",
             FL_MEMBER(dp_clipping))
          .Choices({"fixed", "adaptive"})
          .Manifest("server.privacy.clipping"));
  add(Number("dp_target_quantile", "--dp-target-quantile", "", 0, 1,
             "Adaptive clipping: the fraction of updates at or below C it aims for", FL_MEMBER(dp_target_quantile))
          .Manifest("server.privacy.target_quantile"));
  add(Number("dp_clip_learning_rate", "--dp-clip-learning-rate", "", 0, 100,
             "Adaptive clipping: eta of C <- C x exp(-eta (b - quantile))", FL_MEMBER(dp_clip_learning_rate))
          .Open()
          .Manifest("server.privacy.clip_learning_rate"));
  add(Number("dp_clipped_count_stddev", "--dp-clipped-count-stddev", "", 0, 1e9,
             "Adaptive clipping: std of the noise on the count of updates at or below C (above sigma / 2; about "
             "clients per round / 20)",
             FL_MEMBER(dp_clipped_count_stddev))
          .Manifest("server.privacy.clipped_count_stddev"));
  add(Number("dp_delta", "--dp-delta", "", 0, 1, "Differential privacy: delta of the (epsilon, delta) reported",
             FL_MEMBER(dp_delta))
          .Open()
          .Manifest("server.privacy.delta"));
  add(Unsigned("dp_population", "--dp-population", "clients", 0, 1e9,
               "Differential privacy: the clients the rounds sample from (sampling rate = clients per round / this)",
               FL_MEMBER(dp_population))
          .Manifest("server.privacy.population"));
  add(Number("dp_target_epsilon", "--dp-target-epsilon", "", 0, 1e9,
             "Differential privacy: end the run (finished) before a round would spend more than this epsilon",
             FL_MEMBER(dp_target_epsilon))
          .ZeroOff()
          .Manifest("server.privacy.target_epsilon"));

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
  add(Unsigned("max_chunk_bytes", "--max-chunk-bytes", "bytes", 1024, proto::kMaxChunkBytes,
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
}  // namespace fl::server::settings_internal
