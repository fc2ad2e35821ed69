// raw_tcp_round: e2e_round's reference exchange (docs/performance.md, "End-to-end rounds"): one round's bytes over
// plain loopback TCP, with nothing of gRPC, HTTP/2 or the round engine, optionally doing the round's work with the
// bytes (round_work.h).
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "round_work.h"

namespace fl::bench {

// K connections, each receiving `down_bytes` from one server thread (the caller's, a poll loop over all
// connections at once), then sending back `up_bytes`. K client threads do a blocking recv of the whole download,
// then a blocking send of the whole upload. Returns seconds from the first byte sent to the last byte received
// (connections are set up before the clock starts, as gRPC's are). Without `work` the bytes land in a
// cache-resident scratch buffer (the kernel's copies and nothing else). With `work` the same exchange also does
// the round's work with them: received where they are used, checked, trained on, aggregated; the seconds then run
// to the end of the server's commit work (RoundWork::ServerFinish).
absl::StatusOr<double> RawTcpRound(int k, uint64_t down_bytes, uint64_t up_bytes, RoundWork* work = nullptr);

}  // namespace fl::bench
