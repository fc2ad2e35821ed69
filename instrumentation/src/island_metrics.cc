#include "fl/instrumentation/island_metrics.h"

#include <algorithm>
#include <set>

#include "absl/base/thread_annotations.h"
#include "fl/core/mutex.h"
#include "metrics_endpoint.h"

namespace fl::instrumentation {
namespace {

// From a loopback exchange of a small fragment (a millisecond) to a large one over a slow WAN (minutes).
prometheus::Histogram::BucketBoundaries ExchangeBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 60, 120, 300, 600};
}

std::string S(std::string_view v) { return std::string(v); }

}  // namespace

struct IslandMetrics::Impl {
  explicit Impl(internal::MetricsEndpoint e) : endpoint(std::move(e)) {}

  internal::MetricsEndpoint endpoint;
  prometheus::Family<prometheus::Histogram>* exchange = nullptr;
  prometheus::Family<prometheus::Histogram>* compute = nullptr;
  prometheus::Family<prometheus::Counter>* wait = nullptr;
  prometheus::Family<prometheus::Counter>* bytes = nullptr;
  prometheus::Family<prometheus::Counter>* syncs = nullptr;
  prometheus::Family<prometheus::Counter>* mismatches = nullptr;
  prometheus::Family<prometheus::Counter>* loaded = nullptr;
  prometheus::Family<prometheus::Counter>* evictions = nullptr;
  prometheus::Family<prometheus::Counter>* epochs = nullptr;
  prometheus::Histogram* barrier = nullptr;
  prometheus::Gauge* members = nullptr;
  prometheus::Gauge* last_epoch = nullptr;
  prometheus::Gauge* committed_step = nullptr;
  prometheus::Gauge* committed_fragment = nullptr;
  size_t max_labels = 64;
  fl::Mutex mu;
  std::set<std::string, std::less<>> labelled ABSL_GUARDED_BY(mu);
};

IslandMetrics::IslandMetrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
IslandMetrics::~IslandMetrics() = default;

absl::StatusOr<std::unique_ptr<IslandMetrics>> IslandMetrics::Start(const std::string& bind_address,
                                                                    const std::string& experiment,
                                                                    size_t max_island_labels) {
  absl::StatusOr<internal::MetricsEndpoint> endpoint = internal::MetricsEndpoint::Start(bind_address, experiment);
  if (!endpoint.ok()) return endpoint.status();
  auto impl = std::make_unique<Impl>(*std::move(endpoint));
  impl->max_labels = max_island_labels;
  internal::MetricsEndpoint& e = impl->endpoint;
  impl->exchange = &e.Histograms("fl_island_exchange_seconds",
                                 "Wall time of one island's ring all-reduce of one sync (one fragment)");
  impl->compute = &e.Histograms("fl_island_inner_compute_seconds",
                                "Inner-step compute time of one island between two of its syncs");
  impl->wait = &e.Counters("fl_island_exchange_wait_seconds_total",
                           "Time an island's compute was blocked waiting for exchanges (not hidden by overlap)");
  impl->bytes = &e.Counters("fl_island_exchange_bytes_total",
                            "Bytes an island sent or received in ring exchanges (frames, headers included)");
  impl->syncs = &e.Counters("fl_island_syncs_total", "Sync reports by island and outcome (applied, mismatch, failed)");
  impl->mismatches =
      &e.Counters("fl_island_state_hash_mismatches_total",
                  "Syncs after which an island's state hash differed from the majority (repair ordered)");
  impl->loaded = &e.Counters("fl_island_state_loads_total",
                             "States copied from a peer and verified, by island and why (repair, late_join)");
  impl->evictions = &e.Counters("fl_island_departures_total", "Islands that left the membership, by island and reason");
  impl->epochs = &e.Counters("fl_island_epochs_total", "Membership epochs resolved, by outcome (committed, retried)");
  impl->barrier =
      &e.Histograms("fl_island_barrier_seconds", "Time from the first island's BeginSync to the epoch being formed")
           .Add({}, ExchangeBuckets());
  impl->members = &e.Gauges("fl_island_members", "Islands currently taking part in syncs").Add({});
  impl->last_epoch = &e.Gauges("fl_island_last_epoch", "Number of the latest membership epoch formed").Add({});
  impl->committed_step = &e.Gauges("fl_island_committed_outer_step", "Outer step of the latest committed sync").Add({});
  impl->committed_fragment = &e.Gauges("fl_island_committed_fragment", "Fragment of the latest committed sync").Add({});
  return std::unique_ptr<IslandMetrics>(new IslandMetrics(std::move(impl)));
}

int IslandMetrics::port() const { return impl_->endpoint.port(); }

std::string IslandMetrics::IslandLabel(std::string_view island) {
  fl::MutexLock lock(impl_->mu);
  if (impl_->labelled.contains(island)) return S(island);
  if (impl_->labelled.size() >= impl_->max_labels) return "other";
  impl_->labelled.insert(S(island));
  return S(island);
}

void IslandMetrics::ObserveSync(std::string_view island, std::string_view outcome, const IslandSyncObservation& o) {
  const std::string label = IslandLabel(island);
  impl_->syncs->Add({{"island", label}, {"outcome", S(outcome)}}).Increment();
  if (outcome == "failed") {
    impl_->bytes->Add({{"island", label}, {"direction", "sent"}}).Increment(static_cast<double>(o.bytes_sent));
    impl_->bytes->Add({{"island", label}, {"direction", "received"}}).Increment(static_cast<double>(o.bytes_received));
    return;  // a failed exchange's time says nothing about the link's speed
  }
  impl_->exchange->Add({{"island", label}}, ExchangeBuckets()).Observe(o.exchange_seconds);
  impl_->compute->Add({{"island", label}}, ExchangeBuckets()).Observe(o.inner_compute_seconds);
  impl_->wait->Add({{"island", label}}).Increment(std::max(0.0, o.wait_seconds));
  impl_->bytes->Add({{"island", label}, {"direction", "sent"}}).Increment(static_cast<double>(o.bytes_sent));
  impl_->bytes->Add({{"island", label}, {"direction", "received"}}).Increment(static_cast<double>(o.bytes_received));
}

void IslandMetrics::CountHashMismatch(std::string_view island) {
  impl_->mismatches->Add({{"island", IslandLabel(island)}}).Increment();
}

void IslandMetrics::CountStateLoaded(std::string_view island, std::string_view why) {
  impl_->loaded->Add({{"island", IslandLabel(island)}, {"why", S(why)}}).Increment();
}

void IslandMetrics::CountEviction(std::string_view island, std::string_view reason) {
  impl_->evictions->Add({{"island", IslandLabel(island)}, {"reason", S(reason)}}).Increment();
}

void IslandMetrics::ObserveEpoch(std::string_view outcome, double barrier_seconds) {
  impl_->epochs->Add({{"outcome", S(outcome)}}).Increment();
  impl_->barrier->Observe(barrier_seconds);
}

void IslandMetrics::SetMembers(int64_t members) { impl_->members->Set(static_cast<double>(members)); }
void IslandMetrics::SetLastEpoch(uint64_t epoch) { impl_->last_epoch->Set(static_cast<double>(epoch)); }
void IslandMetrics::SetCommitted(uint64_t step, uint32_t fragment) {
  impl_->committed_step->Set(static_cast<double>(step));
  impl_->committed_fragment->Set(static_cast<double>(fragment));
}

}  // namespace fl::instrumentation
