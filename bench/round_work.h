// round_work: what the two ends of a federated round must do with its bytes besides moving them, for e2e_round's
// raw-TCP reference (docs/performance.md, "The round's necessary work over raw TCP").
//
// e2e_round compares a round with the raw-TCP time of the same bytes: the kernel's socket copies into a
// cache-resident scratch buffer and nothing else. A real round also has to land every byte where it is used and
// do the work the protocol and the workload ask for. RoundWork lets the raw-TCP exchange do that work with the
// product's own kernels and nothing of gRPC, HTTP/2, the round engine or the records: the difference between the
// two references is what the round's work costs on this machine, and the difference between that reference and
// a round is what the product's machinery adds on top. NecessaryWork is the work of fl-client with the synthetic
// model and of fl-server's FedAvg round (session.cc and session_transfer.cc, engine_rounds.cc), step for step:
//
//   client: the download received straight into the parameters (fl-client writes an fp32 model's body there as
//           it arrives), its XXH3 updated as bytes arrive and checked, the header checked, the finite check; the
//           synthetic trainer's pass (client::SyntheticTrainer, the same object); the update computed into the
//           upload payload (GetParameters, global - local, core::SealFp32Payload without a body checksum); the
//           upload's XXH3;
//   server: each upload received into a model-sized buffer of its own, its XXH3 updated as bytes arrive and
//           checked against the client's, added from its bytes (Aggregator::AddEncoded, transfer verified); after
//           the last one the commit's model work: Finish, the FedAvg step, the new model encoded (with its body
//           checksum, as fl-server publishes it) and its XXH3.
//
// Every buffer is allocated and touched before the clock starts (the product reuses its buffers from round to
// round too). What it leaves out, in the product's favour: nothing is copied out of gRPC's slices (the kernel
// writes straight into the destination), no framing, no threads but the raw exchange's own.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::bench {

// Hooks of the raw-TCP exchange (e2e_round's RawTcpRound). Client hooks run on client i's thread, server hooks on
// the server's thread; both sides may run at once for different clients.
class RoundWork {
 public:
  virtual ~RoundWork() = default;
  // The download's bytes as the server sends them.
  virtual std::span<const uint8_t> ServerDownload() const = 0;
  // Where client i receives its download (ServerDownload().size() bytes).
  virtual std::span<uint8_t> ClientDownloadBuffer(int i) = 0;
  // Client i received the next `bytes` of its download (in order, within ClientDownloadBuffer(i)).
  virtual void ClientReceived(int i, std::span<const uint8_t> bytes) = 0;
  // Client i has its whole download: everything it does before sending; returns its upload.
  virtual absl::StatusOr<std::span<const uint8_t>> ClientUpload(int i) = 0;
  // Where the server receives client i's upload.
  virtual std::span<uint8_t> ServerUploadBuffer(int i) = 0;
  // The server received the next `bytes` of client i's upload.
  virtual void ServerReceived(int i, std::span<const uint8_t> bytes) = 0;
  // Client i's upload is complete.
  virtual absl::Status ServerUploadDone(int i) = 0;
  // Every upload is in: the commit's work.
  virtual absl::Status ServerFinish() = 0;
};

// The work of fl-client (synthetic model of `num_params`, fp32 both ways) and fl-server (FedAvg) for `clients`
// clients. Allocates and touches every buffer up front; the exchange may be repeated (each repetition is one
// round: the model moves on as it would).
class NecessaryWork final : public RoundWork {
 public:
  static absl::StatusOr<std::unique_ptr<NecessaryWork>> Create(int clients, uint64_t num_params);
  ~NecessaryWork() override;

  // Bytes of one download (the codec header and the fp32 body), as of one upload.
  uint64_t payload_bytes() const;

  std::span<const uint8_t> ServerDownload() const override;
  std::span<uint8_t> ClientDownloadBuffer(int i) override;
  void ClientReceived(int i, std::span<const uint8_t> bytes) override;
  absl::StatusOr<std::span<const uint8_t>> ClientUpload(int i) override;
  std::span<uint8_t> ServerUploadBuffer(int i) override;
  void ServerReceived(int i, std::span<const uint8_t> bytes) override;
  absl::Status ServerUploadDone(int i) override;
  absl::Status ServerFinish() override;

 private:
  struct State;
  explicit NecessaryWork(std::unique_ptr<State> state);
  std::unique_ptr<State> s_;
};

}  // namespace fl::bench
