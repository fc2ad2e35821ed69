#include "fl/emulation/link_profile.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "fl/config/field_table.h"
#include "fl/config/yaml_fields.h"
#include "fl/core/str_cat.h"
#include "fl/emulation/rate_process.h"
#include "fl/sys/user_file.h"

namespace fl::emulation {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Splits "2.5gbit" into 2.5 and "gbit". The number must be a plain decimal (no sign handling here).
bool SplitNumberUnit(std::string_view text, double* number, std::string* unit) {
  text = Trim(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' || text[i] == '-' ||
                             text[i] == '+' || text[i] == 'e' || text[i] == 'E')) {
    // 'e' only counts as an exponent when followed by a digit or sign ("1e9"), not in a unit.
    if ((text[i] == 'e' || text[i] == 'E') &&
        !(i + 1 < text.size() &&
          (std::isdigit(static_cast<unsigned char>(text[i + 1])) || text[i + 1] == '-' || text[i + 1] == '+'))) {
      break;
    }
    ++i;
  }
  if (i == 0) return false;
  std::string num(text.substr(0, i));
  const char* begin = num.data();
  const char* end = num.data() + num.size();
  if (*begin == '+') ++begin;
  auto [ptr, ec] = std::from_chars(begin, end, *number);
  if (ec != std::errc() || ptr != end) return false;
  *unit = Lower(Trim(text.substr(i)));
  return true;
}

constexpr char kRateAllowed[] =
    "a positive rate such as 100mbit, 2.5gbit, 800kbit (units bit, kbit, mbit, gbit), or 'unlimited'";

// burst_loss: a Gilbert-Elliott chain (link_profile.h); every figure a probability.
config::FieldTable<BurstLoss> BurstLossFields() {
  using B = BurstLoss;
  return {
      config::NumberField("p_good_to_bad", &B::p_good_to_bad, {0, 1})
          .Allowed("a probability per packet, 0 <= p_good_to_bad <= 1 (0 = no bursty loss)"),
      config::NumberField("p_bad_to_good", &B::p_bad_to_good, {0, 1})
          .Allowed("a probability per packet, 0 < p_bad_to_good <= 1 when p_good_to_bad > 0")
          .Then([](const config::YamlMap& m, B& b) -> absl::Status {
            // A chain that can enter the bad state but never leave it loses every packet from some point on.
            if (b.p_good_to_bad > 0 && b.p_bad_to_good <= 0) {
              return m.Error(m.Has("p_bad_to_good") ? m.Node("p_bad_to_good") : m.node(), "p_bad_to_good",
                             StrCat("p_bad_to_good ", b.p_bad_to_good, " with p_good_to_bad ", b.p_good_to_bad,
                                    " never leaves the bad state"),
                             "0 < p_bad_to_good <= 1 when p_good_to_bad > 0");
            }
            return absl::OkStatus();
          }),
      config::NumberField("loss_good", &B::loss_good, {0, 1})
          .Allowed("a fraction of packets lost in the good state, 0 <= loss_good <= 1"),
      config::NumberField("loss_bad", &B::loss_bad, {0, 1})
          .Allowed("a fraction of packets lost in the bad state, 0 <= loss_bad <= 1"),
  };
}

// rate_process: the figures of a fitted process (rate_process.h); ValidateRateProcess checks across them.
config::FieldTable<RateProcess> RateProcessFields() {
  using R = RateProcess;
  return {
      config::IntField("interval_ms", &R::interval_ms, 1, 60'000),
      config::IntField("duration_s", &R::duration_s, 1, 86'400)
          .Allowed("an integer 1 <= duration_s <= 86400: the generated trace's period (it repeats)"),
      config::NumberField("lag1_autocorrelation", &R::lag1_autocorrelation, {-1, 1, true})
          .Allowed("the lag-1 autocorrelation of the per-interval rates, -1 < lag1_autocorrelation < 1")
          .Required(),
      config::CustomField<R>(
          "quantiles_mbit",
          [](const config::YamlMap& m, const std::string& key, R& r) -> absl::Status {
            constexpr char kAllowed[] =
                "a list of 2 to 1001 non-decreasing rates in Mbit/s at evenly spaced probabilities 0..1 "
                "(fl-link fit-trace writes 41: p0, p2.5, ..., p100)";
            const YAML::Node v = m.Node(key);
            if (!v.IsSequence()) {
              return m.Error(v, key, StrCat("expected a list of numbers, got ", config::DescribeYaml(v)), kAllowed);
            }
            r.quantiles_mbit.clear();
            for (size_t i = 0; i < v.size(); ++i) {
              const YAML::Node e = v[i];
              double x = 0;
              std::string unit;
              if (!e.IsScalar() || !SplitNumberUnit(e.Scalar(), &x, &unit) || !unit.empty()) {
                return m.Error(e, StrCat(key, "[", i, "]"), StrCat("expected a number, got ", config::DescribeYaml(e)),
                               kAllowed);
              }
              r.quantiles_mbit.push_back(x);
            }
            return absl::OkStatus();
          })
          .Required(),
      config::StringField("source", &R::source),
      config::IntField("seed", &R::seed, 0, std::numeric_limits<int64_t>::max()),
  };
}

// One direction's fields (the allowed keys of uplink: and downlink: are this table's). Trace paths resolve
// against `base_dir`.
config::FieldTable<LinkDirection> DirectionFields(const std::filesystem::path& base_dir) {
  using D = LinkDirection;
  return {
      config::CustomField<D>("rate",
                             [](const config::YamlMap& m, const std::string& key, D& d) -> absl::Status {
                               absl::StatusOr<std::optional<double>> r = m.Parsed<double>(
                                   key, "a rate",
                                   [](std::string_view text) -> absl::StatusOr<double> {
                                     return Lower(text) == "unlimited" ? 0.0 : ParseRate(text);
                                   },
                                   kRateAllowed);
                               if (!r.ok()) return r.status();
                               d.rate_bps = **r;
                               return absl::OkStatus();
                             }),
      // 10 s one way is far beyond any terrestrial or satellite link; larger values are typing mistakes.
      config::NumberField("delay_ms", &D::delay_ms, {0, 10'000})
          .Allowed("a number of milliseconds, 0 <= delay_ms <= 10000"),
      config::NumberField("jitter_ms", &D::jitter_ms, {0, 10'000})
          .Allowed("a number of milliseconds, 0 <= jitter_ms <= 10000")
          .Then([](const config::YamlMap& m, D& d) -> absl::Status {
            // Allowed (delays clamp at 0), but a profile that means this should say delay_ms: 0 explicitly.
            if (d.jitter_ms > 0 && d.delay_ms == 0 && !m.Has("delay_ms")) {
              return m.Error(m.Node("jitter_ms"), "jitter_ms", "jitter without a delay_ms",
                             "jitter_ms together with delay_ms (write delay_ms: 0 to jitter around zero)");
            }
            return absl::OkStatus();
          }),
      config::NumberField("loss", &D::loss, {0, 1, true})
          .Allowed("a fraction of packets, 0 <= loss < 1 (0.001 = 0.1%)"),
      config::SectionField("burst_loss", &D::burst_loss, BurstLossFields()),
      config::CustomField<D>(
          "queue_limit",
          [](const config::YamlMap& m, const std::string& key, D& d) -> absl::Status {
            absl::StatusOr<std::optional<uint64_t>> r = m.Parsed<uint64_t>(
                key, "a size",
                [](std::string_view text) -> absl::StatusOr<uint64_t> {
                  absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
                  if (bytes.ok() && *bytes < 1500) {
                    return absl::InvalidArgumentError(StrCat("value ", text, " is below one packet"));
                  }
                  return bytes;
                },
                "a size in bytes of at least 1500, such as 262144, 256kib, 1mib (units b, kb, kib, mb, mib)");
            if (!r.ok()) return r.status();
            d.queue_limit_bytes = **r;
            return absl::OkStatus();
          }),
      config::IntField("queue_limit_packets", &D::queue_limit_packets, 1, 1'000'000)
          .Allowed("an integer number of packets, 1 <= queue_limit_packets <= 1000000 (drop-tail by packets, "
                   "packet backend)"),
      config::BoolField("reorder", &D::reorder),
      config::CustomField<D>(
          "trace",
          [base_dir](const config::YamlMap& m, const std::string& key, D& d) -> absl::Status {
            constexpr char kAllowed[] =
                "the path of a Mahimahi trace file (one integer ms timestamp per line), relative to the profile's "
                "folder";
            const YAML::Node v = m.Node(key);
            if (!v.IsScalar() || v.Scalar().empty()) {
              return m.Error(v, key, StrCat("expected a file path, got ", config::DescribeYaml(v)), kAllowed);
            }
            if (m.Has("rate")) return m.Error(v, key, "a direction has either a rate or a trace, not both", kAllowed);
            std::filesystem::path trace_path(v.Scalar());
            if (trace_path.is_relative()) trace_path = base_dir / trace_path;
            absl::StatusOr<MahimahiTrace> trace = LoadMahimahiTrace(trace_path);
            if (!trace.ok()) return m.Error(v, key, ToStd(trace.status().message()), kAllowed);
            d.has_trace = true;
            d.trace = *std::move(trace);
            return absl::OkStatus();
          }),
      config::CustomField<D>(
          "rate_process",
          [](const config::YamlMap& m, const std::string& key, D& d) -> absl::Status {
            const YAML::Node v = m.Node(key);
            for (const char* other : {"rate", "trace"}) {
              if (m.Has(other)) {
                return m.Error(v, key,
                               StrCat("a direction has one of rate, trace and rate_process; this one also has ", other),
                               "rate_process without rate and trace");
              }
            }
            absl::StatusOr<std::optional<config::YamlMap>> map = m.Map(key, RateProcessFields().Describe());
            if (!map.ok()) return map.status();
            RateProcess process;
            if (absl::Status s = RateProcessFields().Read(**map, process); !s.ok()) return s;
            if (absl::Status s = ValidateRateProcess(process); !s.ok()) {
              return m.Error(v, key, ToStd(s.message()));
            }
            absl::StatusOr<MahimahiTrace> trace = GenerateTrace(process);
            if (!trace.ok()) return m.Error(v, key, ToStd(trace.status().message()));
            d.has_trace = true;
            d.trace = *std::move(trace);
            d.has_rate_process = true;
            d.rate_process = std::move(process);
            return absl::OkStatus();
          }),
  };
}

config::FieldTable<LinkProfile> ProfileFields(const std::filesystem::path& base_dir) {
  using P = LinkProfile;
  const config::FieldTable<LinkDirection> direction = DirectionFields(base_dir);
  const std::string direction_allowed = StrCat(
      direction.Describe(), " (both uplink and downlink are required; an empty map {} means an unshaped direction)");
  return {
      config::StringField("name", &P::name),
      config::StringField("description", &P::description),
      config::SectionField("uplink", &P::uplink, direction).Required().Allowed(direction_allowed),
      config::SectionField("downlink", &P::downlink, direction).Required().Allowed(direction_allowed),
  };
}

}  // namespace

double MahimahiTrace::MeanRateBps() const {
  if (period_ms == 0) return 0;
  return static_cast<double>(opportunities_ms.size()) * kMtuBytes * 8.0 / (static_cast<double>(period_ms) / 1000.0);
}

double LinkDirection::NominalRateBps() const { return has_trace ? trace.MeanRateBps() : rate_bps; }

uint64_t LinkDirection::EffectiveQueueLimit() const {
  if (queue_limit_bytes > 0) return queue_limit_bytes;
  const double rate = NominalRateBps();
  if (rate <= 0) return 4u << 20;
  return std::max<uint64_t>(64u << 10, static_cast<uint64_t>(rate / 8.0 * 0.1));
}

absl::StatusOr<double> ParseRate(std::string_view text) {
  double value = 0;
  std::string unit;
  if (!SplitNumberUnit(text, &value, &unit)) {
    return absl::InvalidArgumentError(StrCat("'", text, "' is not a rate"));
  }
  double scale = 0;
  if (unit.empty() || unit == "bit") {
    scale = 1;
  } else if (unit == "kbit") {
    scale = 1e3;
  } else if (unit == "mbit") {
    scale = 1e6;
  } else if (unit == "gbit") {
    scale = 1e9;
  } else if (unit == "bps" || unit == "kbps" || unit == "mbps" || unit == "gbps") {
    return absl::InvalidArgumentError(StrCat("'", text, "': unit '", unit,
                                             "' is ambiguous (tc reads it as bytes per second); write ",
                                             unit.substr(0, unit.size() - 3), "bit for bits per second"));
  } else {
    return absl::InvalidArgumentError(StrCat("'", text, "': unknown unit '", unit, "'"));
  }
  if (!std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(StrCat("'", text, "': a rate must be positive"));
  }
  return value * scale;
}

absl::StatusOr<uint64_t> ParseByteSize(std::string_view text) {
  double value = 0;
  std::string unit;
  if (!SplitNumberUnit(text, &value, &unit)) {
    return absl::InvalidArgumentError(StrCat("'", text, "' is not a size"));
  }
  double scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "kib") {
    scale = 1024;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "mib") {
    scale = 1024.0 * 1024.0;
  } else {
    return absl::InvalidArgumentError(StrCat("'", text, "': unknown unit '", unit, "'"));
  }
  if (!std::isfinite(value) || value <= 0) {
    return absl::InvalidArgumentError(StrCat("'", text, "': a size must be positive"));
  }
  return static_cast<uint64_t>(std::llround(value * scale));
}

std::string FormatRate(double bps) {
  if (bps <= 0) return "unlimited";
  struct Unit {
    double scale;
    const char* name;
  };
  for (const Unit u : {Unit{1e9, "gbit"}, Unit{1e6, "mbit"}, Unit{1e3, "kbit"}}) {
    if (bps >= u.scale) {
      std::ostringstream os;
      os << bps / u.scale << u.name;
      return os.str();
    }
  }
  std::ostringstream os;
  os << bps << "bit";
  return os.str();
}

absl::StatusOr<MahimahiTrace> LoadMahimahiTrace(const std::filesystem::path& path) {
  // A regular file of at most kMaxTraceBytes, read whole (a FIFO or /dev/zero is refused before a byte is read).
  absl::StatusOr<std::string> text =
      sys::ReadUserFile(path.string(), "trace file", kMaxTraceBytes,
                        "a Mahimahi trace holds one line per 1500-byte delivery; shorten it (it repeats)");
  if (!text.ok()) return text.status();
  MahimahiTrace trace;
  trace.path = std::filesystem::absolute(path).lexically_normal().string();
  // One allocation of the exact size: the vector never grows past what the file's lines need.
  trace.opportunities_ms.reserve(static_cast<size_t>(std::count(text->begin(), text->end(), '\n')) + 1);
  int line_no = 0;
  uint64_t last = 0;
  std::string_view rest(*text);
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string_view line = rest.substr(0, nl);
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    ++line_no;
    const std::string_view t = Trim(line);
    if (t.empty()) {
      if (rest.empty()) break;  // the final newline
      return absl::InvalidArgumentError(StrCat(path.string(), ":", line_no,
                                               ": an empty line; every line must hold one integer ms timestamp "
                                               "(mm-link refuses blank lines too)"));
    }
    uint64_t ms = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), ms);
    if (ec != std::errc() || ptr != t.data() + t.size()) {
      // At most 40 bytes of the line: a line of a binary file can be megabytes long.
      const std::string shown = t.size() > 40 ? StrCat(std::string(t.substr(0, 40)), "...") : std::string(t);
      return absl::InvalidArgumentError(StrCat(path.string(), ":", line_no, ": '", shown,
                                               "' is not a non-negative integer ms timestamp (Mahimahi format: "
                                               "one timestamp per line)"));
    }
    if (ms < last) {
      return absl::InvalidArgumentError(StrCat(path.string(), ":", line_no, ": timestamp ", ms,
                                               " is smaller than the previous one (", last,
                                               "); timestamps must not decrease"));
    }
    last = ms;
    trace.opportunities_ms.push_back(ms);
  }
  if (trace.opportunities_ms.empty() || last == 0) {
    return absl::InvalidArgumentError(StrCat(path.string(),
                                             ": a trace needs at least one line and a last timestamp above 0 (the "
                                             "period after which it repeats)"));
  }
  trace.period_ms = last;
  return trace;
}

absl::StatusOr<LinkProfile> ParseLinkProfile(const YAML::Node& node, const YamlContext& context) {
  LinkProfile profile;
  profile.source = context.file;
  const config::YamlMap map(node, context.file, context.field_path);
  if (absl::Status s = ProfileFields(context.base_dir).Read(map, profile); !s.ok()) return s;
  return profile;
}

absl::StatusOr<LinkProfile> LoadLinkProfile(const std::filesystem::path& path) {
  std::error_code ec;
  // Only a missing file gets the hint below; anything else that is there (a FIFO, a device) is refused by
  // LoadYamlFile naming what it is.
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(StrCat("link profile ", path.string(),
                                      " does not exist (profiles live in experiments/profiles/links/<name>.yaml)"));
  }
  absl::StatusOr<YAML::Node> node = config::LoadYamlFile(path, "link profile");
  if (!node.ok()) return node.status();
  YamlContext ctx;
  ctx.file = path.string();
  ctx.base_dir = path.parent_path();
  auto profile = ParseLinkProfile(*node, ctx);
  if (!profile.ok()) return profile.status();
  if (profile->name.empty()) profile->name = path.stem().string();
  return profile;
}

std::string LinkProfileToYaml(const LinkProfile& profile) {
  YAML::Emitter out;
  out << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << profile.name;
  if (!profile.description.empty()) out << YAML::Key << "description" << YAML::Value << profile.description;
  for (int i = 0; i < 2; ++i) {
    const LinkDirection& d = i == 0 ? profile.uplink : profile.downlink;
    out << YAML::Key << (i == 0 ? "uplink" : "downlink") << YAML::Value << YAML::BeginMap;
    if (d.has_rate_process) {
      const RateProcess& r = d.rate_process;
      out << YAML::Key << "rate_process" << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "interval_ms" << YAML::Value << r.interval_ms;
      out << YAML::Key << "duration_s" << YAML::Value << r.duration_s;
      out << YAML::Key << "lag1_autocorrelation" << YAML::Value << r.lag1_autocorrelation;
      out << YAML::Key << "quantiles_mbit" << YAML::Value << YAML::Flow << r.quantiles_mbit;
      out << YAML::Key << "source" << YAML::Value << r.source;
      out << YAML::Key << "seed" << YAML::Value << r.seed;
      out << YAML::EndMap;
    } else if (d.has_trace) {
      out << YAML::Key << "trace" << YAML::Value << d.trace.path;
    } else {
      out << YAML::Key << "rate" << YAML::Value << FormatRate(d.rate_bps);
    }
    out << YAML::Key << "delay_ms" << YAML::Value << d.delay_ms;
    out << YAML::Key << "jitter_ms" << YAML::Value << d.jitter_ms;
    out << YAML::Key << "loss" << YAML::Value << d.loss;
    if (d.queue_limit_bytes > 0) out << YAML::Key << "queue_limit" << YAML::Value << d.queue_limit_bytes;
    if (d.burst_loss != BurstLoss{}) {
      out << YAML::Key << "burst_loss" << YAML::Value << YAML::Flow << YAML::BeginMap;
      out << YAML::Key << "p_good_to_bad" << YAML::Value << d.burst_loss.p_good_to_bad;
      out << YAML::Key << "p_bad_to_good" << YAML::Value << d.burst_loss.p_bad_to_good;
      out << YAML::Key << "loss_good" << YAML::Value << d.burst_loss.loss_good;
      out << YAML::Key << "loss_bad" << YAML::Value << d.burst_loss.loss_bad;
      out << YAML::EndMap;
    }
    if (d.queue_limit_packets > 0) {
      out << YAML::Key << "queue_limit_packets" << YAML::Value << d.queue_limit_packets;
    }
    if (d.reorder) out << YAML::Key << "reorder" << YAML::Value << true;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace fl::emulation
