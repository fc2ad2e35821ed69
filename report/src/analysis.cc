#include "fl/report/analysis.h"

#include <algorithm>
#include <map>
#include <set>

namespace fl::report {
namespace {

size_t Index(Phase p) { return static_cast<size_t>(p); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2.0;
}

void Add(Stat& s, const std::optional<double>& v) {
  if (!v.has_value()) return;
  s.max = s.n == 0 ? *v : std::max(s.max, *v);
  s.mean += (*v - s.mean) / static_cast<double>(++s.n);
}

// The time the round waited for this update: its arrival, or (no timeline at all) the sum of its phases.
double FinishKey(const ClientRoundRow& row, const PlacedPhases& placed) {
  if (placed.arrival_unix_ms.has_value()) return *placed.arrival_unix_ms;
  double sum = 0;
  for (Phase p : kAllPhases) sum += PhaseMs(row, p).value_or(0);
  return sum;
}

std::optional<Straggler> FindStraggler(const RoundAttempt& r) {
  const ClientRoundRow* last = nullptr;
  PlacedPhases last_placed;
  double last_key = 0;
  for (const ClientRoundRow& c : r.clients) {
    if (!c.accepted()) continue;
    PlacedPhases placed = PlaceOnServerTimeline(c);
    const double key = FinishKey(c, placed);
    // Rows are in write order, which is arrival order: on a tie the later row arrived later.
    if (last == nullptr || key >= last_key) {
      last = &c;
      last_key = key;
      last_placed = placed;
    }
  }
  if (last == nullptr) return std::nullopt;
  Straggler s;
  s.client_id = last->client_id;
  s.arrival_unix_ms = last_placed.arrival_unix_ms;
  std::optional<Phase> best;
  double best_excess = 0;
  for (Phase p : kStragglerPhases) {
    const std::optional<double> mine = PhaseMs(*last, p);
    if (!mine.has_value()) continue;
    std::vector<double> all;
    for (const ClientRoundRow& c : r.clients) {
      if (!c.accepted()) continue;
      if (std::optional<double> v = PhaseMs(c, p); v.has_value()) all.push_back(*v);
    }
    const double excess = *mine - Median(all);
    if (excess > best_excess) {
      best_excess = excess;
      best = p;
    }
  }
  if (best.has_value()) {
    s.dominant_phase = *best;
    s.excess_ms = best_excess;
  } else {
    double longest = -1;
    for (Phase p : kStragglerPhases) {
      const std::optional<double> v = PhaseMs(*last, p);
      if (v.has_value() && *v > longest) {
        longest = *v;
        s.dominant_phase = p;
      }
    }
  }
  return s;
}

int LinkOrder(const std::string& kind) {
  static const char* const kKnown[] = {"ethernet", "wifi", "5g", "other"};
  for (int i = 0; i < 4; ++i) {
    if (kind == kKnown[i]) return i;
  }
  return 4;
}

// The phase counted most often (ties: pipeline order); nullopt when none was counted.
std::optional<Phase> TopPhase(const std::array<int64_t, 5>& by_phase) {
  std::optional<Phase> top;
  int64_t best = 0;
  for (Phase p : kStragglerPhases) {
    if (by_phase[Index(p)] > best) {
      best = by_phase[Index(p)];
      top = p;
    }
  }
  return top;
}

// Link kind x device class of a client ("unknown" for what the records lack).
std::pair<std::string, std::string> GroupOf(const ExperimentData& data, const std::string& client_id) {
  const ClientInfo* c = data.FindClient(client_id);
  if (c == nullptr) return {"unknown", "unknown"};
  return {c->link_kind.empty() ? "unknown" : c->link_kind, c->device_class.empty() ? "unknown" : c->device_class};
}

// The groups' figures from the accepted rows of committed rounds and from `a`'s per-client straggler ranking
// (already computed, so a group's straggler counts are the sums of its clients').
std::vector<GroupSummary> SummarizeGroups(const ExperimentData& data, const Analysis& a) {
  struct Acc {
    GroupSummary g;
    std::set<std::string> clients;
  };
  std::map<std::pair<std::string, std::string>, Acc> groups;
  auto group = [&](const std::string& client_id) -> Acc& {
    auto key = GroupOf(data, client_id);
    Acc& acc = groups[key];
    acc.g.link_kind = key.first;
    acc.g.device_class = key.second;
    return acc;
  };
  for (const RoundAttempt& r : data.rounds) {
    if (!r.committed()) continue;
    for (const ClientRoundRow& c : r.clients) {
      if (!c.accepted()) continue;
      Acc& acc = group(c.client_id);
      acc.clients.insert(c.client_id);
      ++acc.g.num_client_rounds;
      for (Phase p : kAllPhases) Add(acc.g.phase_ms[Index(p)], PhaseMs(c, p));
    }
  }
  for (const StragglerRank& rank : a.stragglers) {  // most often first: the first of a group is its top straggler
    if (rank.times_straggler == 0) continue;
    GroupSummary& g = group(rank.client_id).g;
    g.times_straggler += rank.times_straggler;
    for (size_t i = 0; i < rank.by_phase.size(); ++i) g.by_phase[i] += rank.by_phase[i];
    if (g.top_straggler.empty()) {
      g.top_straggler = rank.client_id;
      g.top_straggler_times = rank.times_straggler;
    }
  }
  std::vector<GroupSummary> out;
  for (auto& [key, acc] : groups) {
    GroupSummary g = std::move(acc.g);
    g.num_clients = static_cast<int64_t>(acc.clients.size());
    if (a.rounds_with_straggler > 0) {
      g.straggler_share = static_cast<double>(g.times_straggler) / static_cast<double>(a.rounds_with_straggler);
    }
    g.top_phase = TopPhase(g.by_phase);
    out.push_back(std::move(g));
  }
  std::sort(out.begin(), out.end(), [](const GroupSummary& x, const GroupSummary& y) {
    const int ox = LinkOrder(x.link_kind), oy = LinkOrder(y.link_kind);
    if (ox != oy) return ox < oy;
    if (x.link_kind != y.link_kind) return x.link_kind < y.link_kind;
    return x.device_class < y.device_class;
  });
  return out;
}

}  // namespace

std::string_view PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kDownlink: return "downlink";
    case Phase::kTrain: return "train";
    case Phase::kEval: return "eval";
    case Phase::kIdle: return "idle";
    case Phase::kUplink: return "uplink";
  }
  return "?";
}

std::optional<double> PhaseMs(const ClientRoundRow& row, Phase phase) {
  switch (phase) {
    case Phase::kDownlink: return row.downlink_ms;
    case Phase::kTrain: return row.train_ms;
    case Phase::kEval: return row.eval_ms;
    case Phase::kIdle: return row.idle_ms;
    case Phase::kUplink: return row.uplink();
  }
  return std::nullopt;
}

PlacedPhases PlaceOnServerTimeline(const ClientRoundRow& row) {
  PlacedPhases out;
  const std::optional<double> recorded[5] = {row.downlink_start_unix_ms, row.train_start_unix_ms,
                                             row.eval_start_unix_ms, std::nullopt, row.uplink_start_unix_ms};
  bool any_recorded = row.uplink_server_start_unix_ms.has_value();
  for (const auto& r : recorded) any_recorded = any_recorded || r.has_value();
  std::optional<double> cursor;
  if (row.dispatched_unix_ms.has_value()) cursor = static_cast<double>(*row.dispatched_unix_ms);
  for (Phase p : kAllPhases) {
    const size_t i = Index(p);
    // With recorded starts the gaps between phases are the idle time; drawing idle too would double it.
    if (p == Phase::kIdle && any_recorded) continue;
    std::optional<double> ms = PhaseMs(row, p);
    std::optional<double> start = recorded[i].has_value() ? recorded[i] : cursor;
    if (p == Phase::kUplink && !recorded[i].has_value() && row.uplink_server_start_unix_ms.has_value() &&
        row.uplink_server_ms.has_value()) {
      // The client never reported its view of the uplink (the update that closed the last round): the
      // server's view of the same transfer is on the timeline.
      start = row.uplink_server_start_unix_ms;
      ms = row.uplink_server_ms;
      out.from_recorded_starts = true;
    }
    if (!start.has_value()) continue;
    if (recorded[i].has_value()) out.from_recorded_starts = true;
    double end;
    if (p == Phase::kUplink && row.uplink_end_unix_ms.has_value() && recorded[i].has_value()) {
      end = *row.uplink_end_unix_ms;
    } else if (ms.has_value()) {
      end = *start + *ms;
    } else {
      continue;  // not measured: nothing to draw, the cursor stays
    }
    out.spans[i] = Span{*start, end};
    cursor = end;
  }
  if (row.uplink_server_start_unix_ms.has_value() && row.uplink_server_ms.has_value()) {
    out.arrival_unix_ms = *row.uplink_server_start_unix_ms + *row.uplink_server_ms;
  } else if (out.spans[Index(Phase::kUplink)].has_value()) {
    out.arrival_unix_ms = out.spans[Index(Phase::kUplink)]->end_unix_ms;
  }
  return out;
}

Analysis Analyze(const ExperimentData& data) {
  Analysis a;
  struct LinkAcc {
    std::set<std::string> clients;
    int64_t n = 0;
    std::array<Stat, 5> phase;
    Stat round_ms;
    Stat down_bytes, up_bytes;
    double uplink_sum = 0, uplink_round_sum = 0;
  };
  std::map<std::string, LinkAcc> links;
  std::map<std::string, StragglerRank> ranks;

  for (const RoundAttempt& r : data.rounds) {
    RoundSummary s;
    s.attempt = &r;
    for (const ClientRoundRow& c : r.clients) {
      if (!c.accepted()) continue;
      Add(s.downlink_ms, c.downlink_ms);
      Add(s.train_ms, c.train_ms);
      Add(s.uplink_ms, c.uplink());
    }
    s.straggler = FindStraggler(r);
    if (r.committed()) {
      ++a.committed_rounds;
      for (const ClientRoundRow& c : r.clients) {
        if (!c.accepted()) continue;
        const ClientInfo* info = data.FindClient(c.client_id);
        LinkAcc& l = links[info != nullptr ? info->link_kind : "unknown"];
        l.clients.insert(c.client_id);
        ++l.n;
        for (Phase p : kAllPhases) Add(l.phase[Index(p)], PhaseMs(c, p));
        Add(l.round_ms, r.duration_ms);
        if (c.downlink_bytes.has_value()) Add(l.down_bytes, static_cast<double>(*c.downlink_bytes));
        if (c.uplink_bytes.has_value()) Add(l.up_bytes, static_cast<double>(*c.uplink_bytes));
        if (std::optional<double> up = c.uplink(); up.has_value()) {
          l.uplink_sum += *up;
          l.uplink_round_sum += r.duration_ms;
        }
        StragglerRank& rank = ranks[c.client_id];
        rank.client_id = c.client_id;
        ++rank.rounds_accepted;
      }
      if (s.straggler.has_value()) {
        ++a.rounds_with_straggler;
        StragglerRank& rank = ranks[s.straggler->client_id];
        rank.client_id = s.straggler->client_id;
        ++rank.times_straggler;
        ++rank.by_phase[Index(s.straggler->dominant_phase)];
      }
    }
    a.rounds.push_back(s);
  }

  std::map<std::string, Stat> federated_eval;
  for (const EvaluationRow& e : data.evaluations) {
    const ClientInfo* info = data.FindClient(e.client_id);
    const std::string kind = info != nullptr ? info->link_kind : "unknown";
    // A link kind seen only in evaluations still gets its row (with no training figures).
    links.try_emplace(kind);
    Add(federated_eval[kind], e.eval_ms);
  }

  for (auto& [kind, l] : links) {
    LinkSummary out;
    if (auto it = federated_eval.find(kind); it != federated_eval.end() && it->second.n > 0) {
      out.mean_federated_eval_ms = it->second.mean;
    }
    out.link_kind = kind;
    out.num_clients = static_cast<int64_t>(l.clients.size());
    out.num_client_rounds = l.n;
    for (Phase p : kAllPhases) {
      if (l.phase[Index(p)].n > 0) out.mean_phase_ms[Index(p)] = l.phase[Index(p)].mean;
    }
    if (l.round_ms.n > 0) out.mean_round_ms = l.round_ms.mean;
    if (l.uplink_round_sum > 0) out.uplink_share = l.uplink_sum / l.uplink_round_sum;
    if (l.down_bytes.n > 0) out.mean_downlink_bytes = l.down_bytes.mean;
    if (l.up_bytes.n > 0) out.mean_uplink_bytes = l.up_bytes.mean;
    a.links.push_back(std::move(out));
  }
  std::sort(a.links.begin(), a.links.end(), [](const LinkSummary& x, const LinkSummary& y) {
    const int ox = LinkOrder(x.link_kind), oy = LinkOrder(y.link_kind);
    return ox != oy ? ox < oy : x.link_kind < y.link_kind;
  });
  auto find_link = [&](std::string_view kind) -> const LinkSummary* {
    for (const LinkSummary& l : a.links) {
      if (l.link_kind == kind) return &l;
    }
    return nullptr;
  };
  const LinkSummary* ethernet = find_link("ethernet");
  const LinkSummary* wifi = find_link("wifi");
  const size_t up = Index(Phase::kUplink), down = Index(Phase::kDownlink);
  auto ratio = [](const std::optional<double>& num, const std::optional<double>& den) -> std::optional<double> {
    if (!num.has_value() || !den.has_value() || *den <= 0) return std::nullopt;
    return *num / *den;
  };
  for (LinkSummary& l : a.links) {
    if (ethernet != nullptr) {
      l.uplink_vs_ethernet = ratio(l.mean_phase_ms[up], ethernet->mean_phase_ms[up]);
      l.downlink_vs_ethernet = ratio(l.mean_phase_ms[down], ethernet->mean_phase_ms[down]);
    }
    if (wifi != nullptr) l.uplink_vs_wifi = ratio(l.mean_phase_ms[up], wifi->mean_phase_ms[up]);
  }

  for (auto& [id, rank] : ranks) {
    if (a.rounds_with_straggler > 0) {
      rank.share = static_cast<double>(rank.times_straggler) / static_cast<double>(a.rounds_with_straggler);
    }
    rank.top_phase = TopPhase(rank.by_phase);
    a.stragglers.push_back(rank);
  }
  auto label = [&](const std::string& id) {
    const ClientInfo* c = data.FindClient(id);
    return c != nullptr ? c->label : id;
  };
  std::sort(a.stragglers.begin(), a.stragglers.end(), [&](const StragglerRank& x, const StragglerRank& y) {
    if (x.times_straggler != y.times_straggler) return x.times_straggler > y.times_straggler;
    return label(x.client_id) < label(y.client_id);
  });
  a.groups = SummarizeGroups(data, a);
  return a;
}

}  // namespace fl::report
