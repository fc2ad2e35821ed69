// The server's timeline: where the records place every phase of every client.
//
// Durations are measured with monotonic clocks where they happen; people read wall-clock times. One anchor
// pair (server monotonic ns, server wall ns) taken once per server run maps any server monotonic instant
// to a wall-clock time without the wall clock's steps (NTP slews, manual changes) leaking into the spacing
// of spans. A client's monotonic instant is first moved onto the server's monotonic clock with the client's
// estimated offset (client minus server, see clock_sync.h), good to +- rtt/2 of that estimate.
#pragma once

#include <chrono>
#include <cstdint>

#include "fl/core/clock.h"

namespace fl {

class ServerTimeline {
 public:
  // Anchored now.
  ServerTimeline()
      : anchor_mono_ns_(NowNs()),
        anchor_unix_ns_(
            std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
                .count()) {}
  ServerTimeline(int64_t anchor_mono_ns, int64_t anchor_unix_ns)
      : anchor_mono_ns_(anchor_mono_ns), anchor_unix_ns_(anchor_unix_ns) {}

  // Wall-clock unix ms (with a fraction) of a server monotonic instant.
  double UnixMsAt(int64_t server_mono_ns) const {
    return static_cast<double>(anchor_unix_ns_ + (server_mono_ns - anchor_mono_ns_)) / 1e6;
  }

  // A client monotonic instant placed on the server's timeline; `offset_ns` = client clock minus server clock.
  double PlaceClient(int64_t client_mono_ns, int64_t offset_ns) const { return UnixMsAt(client_mono_ns - offset_ns); }

 private:
  int64_t anchor_mono_ns_;
  int64_t anchor_unix_ns_;
};

}  // namespace fl
