// Copying the global state (θ_global + outer optimizer state) from one island to another: for a late
// joiner and for an island whose state hash disagreed with the majority (a repair). Torch-free: the state
// travels as an opaque byte image (e.g. OuterState::Serialize()) with the hash the island computes over
// its state (e.g. OuterState::Hash()); gRPC service fl.v1.IslandState, chunked like DownloadModel.
//
// The island leader runs one StateServer for its lifetime and publishes a snapshot after every sync it
// applied, BEFORE it reports the sync to the coordinator (so that when the coordinator names it as the
// source, the snapshot is there):
//   auto server = StateServer::Start("0.0.0.0:0");               // island's state endpoint
//   server->Publish({.key = {step, fragment}, .state_hash = state.Hash(), .image = state.Serialize()});
// The receiving island:
//   auto snap = FetchState(source.endpoint, source.expected_hash,
//                          {.verify = [&](std::span<const uint8_t> image) -> absl::StatusOr<uint64_t> {
//                             auto copy = /* a fresh OuterState */; RETURN_IF_ERROR(copy.Restore(image));
//                             return copy.Hash(); }});
// FetchState fails unless the bytes arrive intact (Checksum64 over the image, like every chunked transfer)
// AND the hash recomputed by `verify` from the received image equals `expected_hash`: a state that does
// not hash to the committed value is never handed to the caller.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "fl/diloco/coord/coordinator_client.h"
#include "fl/rpc/tls.h"

namespace fl::diloco {

struct StateSnapshot {
  SyncKey key;                 // the state after this sync
  uint64_t state_hash = 0;     // the island's hash of its state (what it reports in ReportSyncDone)
  std::vector<uint8_t> image;  // the serialized state
};

// The hash of a plain state made of float vectors (tests, tools): Checksum64 over the bytes of `params`
// followed by the bytes of `optimizer_state`, little-endian fp32 as in memory.
uint64_t PlainStateHash(std::span<const float> params, std::span<const float> optimizer_state);

class StateServer {
 public:
  // Serves fl.v1.IslandState on `listen_address` ("0.0.0.0:0" picks a free port). Unavailable when it
  // cannot bind. `keep` = how many recent snapshots stay available (a late joiner may ask for the one
  // before the newest).
  // With `tls` (an island's own certificate, which has both EKUs, and the islands' CA as the client CA) only
  // islands with a certificate from that CA can fetch; without it, plaintext (fl-island --insecure).
  static absl::StatusOr<std::unique_ptr<StateServer>> Start(const std::string& listen_address, size_t keep = 2,
                                                            const std::optional<rpc::ServerTls>& tls = std::nullopt);
  ~StateServer();  // stops serving (in-flight transfers are cancelled)
  StateServer(const StateServer&) = delete;
  StateServer& operator=(const StateServer&) = delete;

  // Makes `snapshot` available (replacing the oldest beyond `keep`); wakes fetches waiting for its hash.
  void Publish(StateSnapshot snapshot);
  int port() const;
  // "127.0.0.1:<port>": what to put in IslandJoinRequest::state_endpoint on one machine; across machines
  // use the host's reachable address with port().
  std::string endpoint() const;
  uint64_t transfers_served() const;
  // Fetches waiting for a snapshot that is not published yet.
  size_t fetches_waiting() const;

 private:
  struct Impl;
  explicit StateServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct FetchOptions {
  // Recomputes the state hash from the received image; empty = Checksum64(image) (only right when the
  // island's hash is the checksum of its image; OuterState's is not: pass a verifier).
  std::function<absl::StatusOr<uint64_t>(std::span<const uint8_t> image)> verify;
  // How long the peer may wait for a snapshot with the expected hash to be published (the source may
  // still be applying the sync), and the deadline of the whole transfer.
  absl::Duration wait_for_snapshot = absl::Seconds(60);
  absl::Duration timeout = absl::Minutes(10);
  uint32_t max_chunk_bytes = 0;  // 0 = the project's default chunk size
  // Mutual TLS with this island's certificate; the peer's certificate must chain to tls->ca_file and carry the
  // URI SAN fl-island://<peer_island> (the StateSource's island_id): islands' certificates name no host, so the
  // name checked is the island's, whatever address it is reached at. Unset: plaintext.
  std::optional<rpc::ClientTls> tls;
  std::string peer_island;
};

// Fetches the snapshot whose hash is `expected_hash` from the StateServer at `endpoint` and verifies it.
// Errors: NotFound / DeadlineExceeded when the peer has no such snapshot in time (naming the hashes it
// has), DataLoss when the bytes are damaged, FailedPrecondition when the verified hash differs from
// `expected_hash` (naming both), Unavailable when the peer cannot be reached.
absl::StatusOr<StateSnapshot> FetchState(const std::string& endpoint, uint64_t expected_hash,
                                         const FetchOptions& options = {});

}  // namespace fl::diloco
