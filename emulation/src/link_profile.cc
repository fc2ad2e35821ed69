#include "fl/emulation/link_profile.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/status/status.h"
#include "fl/core/str_cat.h"

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
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.' ||
                             text[i] == '-' || text[i] == '+' || text[i] == 'e' || text[i] == 'E')) {
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

// An error about one field, in the shape every validation error of the project has:
// "<file>:<line>: <field path>: <problem>; allowed: <what>".
absl::Status FieldError(const YamlContext& ctx, const YAML::Node& node, std::string_view path,
                        std::string_view problem, std::string_view allowed) {
  const YAML::Mark mark = node.Mark();
  std::string where = ctx.file.empty() ? std::string("<inline>") : ctx.file;
  if (mark.line >= 0) where = StrCat(where, ":", mark.line + 1);
  return absl::InvalidArgumentError(StrCat(where, ": ", path, ": ", problem, "; allowed: ", allowed));
}

std::string Join(std::string_view prefix, std::string_view key) {
  if (prefix.empty()) return std::string(key);
  return StrCat(prefix, ".", key);
}


std::string Describe(const YAML::Node& node) {
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  if (node.IsNull()) return "nothing (null)";
  return StrCat("'", node.Scalar(), "'");
}

absl::Status CheckKeys(const YamlContext& ctx, const YAML::Node& map, std::string_view path,
                       const std::vector<std::string>& allowed) {
  std::string allowed_list;
  for (const auto& k : allowed) allowed_list = allowed_list.empty() ? k : StrCat(allowed_list, ", ", k);
  for (auto it = map.begin(); it != map.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string("<non-scalar key>");
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      return FieldError(ctx, it->first, Join(path, key), "unknown key", allowed_list);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<double> NumberField(const YamlContext& ctx, const YAML::Node& node, std::string_view path,
                                   double min, double max_exclusive, std::string_view allowed) {
  double value = 0;
  std::string unit;
  if (!node.IsScalar() || !SplitNumberUnit(node.Scalar(), &value, &unit) || !unit.empty() ||
      !std::isfinite(value)) {
    return FieldError(ctx, node, path, StrCat("expected a number, got ", Describe(node)), allowed);
  }
  if (value < min || value >= max_exclusive) {
    return FieldError(ctx, node, path, StrCat("value ", node.Scalar(), " is out of range"), allowed);
  }
  return value;
}

absl::StatusOr<LinkDirection> ParseDirection(const YAML::Node& node, const YamlContext& ctx,
                                             const std::string& path) {
  static const std::vector<std::string> kKeys = {"rate", "delay_ms", "jitter_ms", "loss", "queue_limit", "trace"};
  if (!node.IsMap()) {
    return FieldError(ctx, node, path, StrCat("expected a map, got ", Describe(node)),
                      "a map with keys rate, delay_ms, jitter_ms, loss, queue_limit, trace");
  }
  if (auto s = CheckKeys(ctx, node, path, kKeys); !s.ok()) return s;
  LinkDirection d;
  if (const YAML::Node rate = node["rate"]; rate) {
    const std::string p = Join(path, "rate");
    if (!rate.IsScalar()) {
      return FieldError(ctx, rate, p, StrCat("expected a rate, got ", Describe(rate)),
                        "a positive rate such as 100mbit, 2.5gbit, 800kbit, or 'unlimited'");
    }
    if (Lower(rate.Scalar()) != "unlimited") {
      auto r = ParseRate(rate.Scalar());
      if (!r.ok()) {
        return FieldError(ctx, rate, p, ToStd(r.status().message()),
                          "a positive rate such as 100mbit, 2.5gbit, 800kbit (units bit, kbit, mbit, gbit), or "
                          "'unlimited'");
      }
      d.rate_bps = *r;
    }
  }
  if (const YAML::Node v = node["delay_ms"]; v) {
    auto r = NumberField(ctx, v, Join(path, "delay_ms"), 0, 60'000, "a number of milliseconds, 0 <= delay_ms < 60000");
    if (!r.ok()) return r.status();
    d.delay_ms = *r;
  }
  if (const YAML::Node v = node["jitter_ms"]; v) {
    auto r = NumberField(ctx, v, Join(path, "jitter_ms"), 0, 60'000,
                         "a number of milliseconds, 0 <= jitter_ms < 60000");
    if (!r.ok()) return r.status();
    d.jitter_ms = *r;
  }
  if (const YAML::Node v = node["loss"]; v) {
    auto r = NumberField(ctx, v, Join(path, "loss"), 0, 1, "a fraction of packets, 0 <= loss < 1 (0.001 = 0.1%)");
    if (!r.ok()) return r.status();
    d.loss = *r;
  }
  if (const YAML::Node v = node["queue_limit"]; v) {
    const std::string p = Join(path, "queue_limit");
    const std::string allowed = "a size in bytes of at least 1500, such as 262144, 256kib, 1mib (units b, kb, kib, mb, mib)";
    if (!v.IsScalar()) return FieldError(ctx, v, p, StrCat("expected a size, got ", Describe(v)), allowed);
    auto r = ParseByteSize(v.Scalar());
    if (!r.ok()) return FieldError(ctx, v, p, ToStd(r.status().message()), allowed);
    if (*r < 1500) return FieldError(ctx, v, p, StrCat("value ", v.Scalar(), " is below one packet"), allowed);
    d.queue_limit_bytes = *r;
  }
  if (const YAML::Node v = node["trace"]; v) {
    const std::string p = Join(path, "trace");
    const std::string allowed =
        "the path of a Mahimahi trace file (one integer ms timestamp per line), relative to the profile's folder";
    if (!v.IsScalar() || v.Scalar().empty()) {
      return FieldError(ctx, v, p, StrCat("expected a file path, got ", Describe(v)), allowed);
    }
    if (node["rate"]) {
      return FieldError(ctx, v, p, "a direction has either a rate or a trace, not both", allowed);
    }
    std::filesystem::path trace_path(v.Scalar());
    if (trace_path.is_relative()) trace_path = ctx.base_dir / trace_path;
    auto trace = LoadMahimahiTrace(trace_path);
    if (!trace.ok()) return FieldError(ctx, v, p, ToStd(trace.status().message()), allowed);
    d.has_trace = true;
    d.trace = *std::move(trace);
  }
  if (d.jitter_ms > 0 && d.delay_ms == 0) {
    // Allowed (delays clamp at 0), but a profile that means this should say delay_ms: 0 explicitly.
    if (!node["delay_ms"]) {
      return FieldError(ctx, node["jitter_ms"], Join(path, "jitter_ms"), "jitter without a delay_ms",
                        "jitter_ms together with delay_ms (write delay_ms: 0 to jitter around zero)");
    }
  }
  return d;
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
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(StrCat("cannot open trace file ", path.string()));
  }
  MahimahiTrace trace;
  trace.path = std::filesystem::absolute(path).lexically_normal().string();
  std::string line;
  int line_no = 0;
  uint64_t last = 0;
  while (std::getline(in, line)) {
    ++line_no;
    const std::string_view t = Trim(line);
    if (t.empty()) continue;
    uint64_t ms = 0;
    auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), ms);
    if (ec != std::errc() || ptr != t.data() + t.size()) {
      return absl::InvalidArgumentError(StrCat(path.string(), ":", line_no, ": '", t,
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
  static const std::vector<std::string> kKeys = {"name", "description", "uplink", "downlink"};
  const std::string root = context.field_path;
  if (!node.IsMap()) {
    return FieldError(context, node, root.empty() ? "<profile>" : root,
                      StrCat("expected a map, got ", Describe(node)),
                      "a map with keys name, description, uplink, downlink");
  }
  if (auto s = CheckKeys(context, node, root, kKeys); !s.ok()) return s;
  LinkProfile profile;
  profile.source = context.file;
  for (const char* key : {"name", "description"}) {
    if (const YAML::Node v = node[key]; v) {
      if (!v.IsScalar()) {
        return FieldError(context, v, Join(root, key), StrCat("expected a string, got ", Describe(v)), "a string");
      }
      (std::string_view(key) == "name" ? profile.name : profile.description) = v.Scalar();
    }
  }
  for (const char* key : {"uplink", "downlink"}) {
    const YAML::Node v = node[key];
    if (!v) {
      return FieldError(context, node, Join(root, key), "missing",
                        "a map with keys rate, delay_ms, jitter_ms, loss, queue_limit, trace (both uplink and "
                        "downlink are required; an empty map {} means an unshaped direction)");
    }
    auto d = ParseDirection(v, context, Join(root, key));
    if (!d.ok()) return d.status();
    (std::string_view(key) == "uplink" ? profile.uplink : profile.downlink) = *std::move(d);
  }
  return profile;
}

absl::StatusOr<LinkProfile> LoadLinkProfile(const std::filesystem::path& path) {
  if (!std::filesystem::is_regular_file(path)) {
    return absl::NotFoundError(StrCat("link profile ", path.string(),
                                      " does not exist (profiles live in experiments/profiles/links/<name>.yaml)"));
  }
  YAML::Node node;
  try {
    node = YAML::LoadFile(path.string());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        StrCat(path.string(), ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
  YamlContext ctx;
  ctx.file = path.string();
  ctx.base_dir = path.parent_path();
  auto profile = ParseLinkProfile(node, ctx);
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
    if (d.has_trace) {
      out << YAML::Key << "trace" << YAML::Value << d.trace.path;
    } else {
      out << YAML::Key << "rate" << YAML::Value << FormatRate(d.rate_bps);
    }
    out << YAML::Key << "delay_ms" << YAML::Value << d.delay_ms;
    out << YAML::Key << "jitter_ms" << YAML::Value << d.jitter_ms;
    out << YAML::Key << "loss" << YAML::Value << d.loss;
    if (d.queue_limit_bytes > 0) out << YAML::Key << "queue_limit" << YAML::Value << d.queue_limit_bytes;
    out << YAML::EndMap;
  }
  out << YAML::EndMap;
  return out.c_str();
}

}  // namespace fl::emulation
