// fl-island: one rank of one island (DiLoCo / Streaming DiLoCo / the data-parallel baseline).
// See docs/diloco.md and fl/diloco/island/island.h.
#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <iostream>
#include <optional>

#include "fl/core/log_format.h"
#include "fl/diloco/island/island.h"

int main(int argc, char** argv) {
  fl::diloco::IslandOptions o;
  std::string strategy = "strided";
  std::string log_level = "info";
  CLI::App app{"fl-island: one rank of a DiLoCo island (R data-parallel ranks; rank 0 leads the cross-island sync)"};
  app.add_option("--island-id", o.island_id, "unique island id")->capture_default_str();
  app.add_option("--shard", o.shard, "training shard of this island")->capture_default_str();
  app.add_option("--num-shards", o.num_shards, "number of shards (islands)")->capture_default_str();
  app.add_option("--rank", o.rank, "data-parallel rank in the island (0 = leader)")->capture_default_str();
  app.add_option("--ranks", o.ranks, "data-parallel ranks in the island (R)")->capture_default_str();
  app.add_option("--pg-store", o.pg_store, "host:port of the c10d TCPStore (served by rank 0)")->capture_default_str();
  app.add_option("--device", o.device,
                 "auto (cuda where a GPU and NCCL are there, else cpu) | cpu | cuda (fails without both)")
      ->capture_default_str();
  app.add_option("--cuda-device", o.cuda_device, "cuda: GPU index (-1 = (shard x ranks + rank) mod the number of GPUs)")
      ->capture_default_str();
  bool show_device = false;
  app.add_flag("--show-device", show_device,
               "print the device this rank would train on (\"device: <name>\") and why, then exit");
  app.add_option("--threads", o.threads, "intra-op threads (0 = LibTorch default)")->capture_default_str();
  app.add_option("--model", o.model,
                 "char-lm (fortunes) | cnn (Fashion-MNIST) | PATH.pt (a TorchScript model: docs/models-and-data.md)")
      ->capture_default_str();
  app.add_option("--data-dir", o.data_dir, "data directory (default: the Debian package's)");
  app.add_option("--data", o.data, "TorchScript models: a .npz, a Fashion-MNIST IDX directory or a text corpus");
  app.add_option("--task", o.task, "TorchScript models: classification | regression | next-token")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "model init and sampling seed")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "per-rank batch size")->capture_default_str();
  app.add_option("--context", o.context, "char-lm context length")->capture_default_str();
  app.add_option("--d-model", o.d_model, "char-lm width")->capture_default_str();
  app.add_option("--layers", o.num_layers, "char-lm transformer blocks")->capture_default_str();
  app.add_option("--heads", o.num_heads, "char-lm attention heads")->capture_default_str();
  app.add_option("--inner-lr", o.inner_lr, "AdamW learning rate")->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")->capture_default_str();
  app.add_option("--beta1", o.beta1, "AdamW beta1")->capture_default_str();
  app.add_option("--beta2", o.beta2, "AdamW beta2")->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "linear lr warm-up steps")->capture_default_str();
  app.add_option("--total-steps", o.total_steps, "inner steps T")->capture_default_str();
  app.add_option("--eval-every", o.eval_every, "evaluate every n steps (0 = at the end)")->capture_default_str();
  app.add_option("--mode", o.mode, "diloco | data-parallel | onebit-adam")->capture_default_str();
  app.add_option("--inner-optimizer", o.inner_optimizer, "adamw (1-bit Adam needs it)")->capture_default_str();
  app.add_option("--onebit-warmup-steps", o.onebit_warmup_steps,
                 "onebit-adam: exact Adam steps before the variance freezes (= --total-steps: data-parallel Adam)")
      ->capture_default_str();
  app.add_option("--onebit-chunk", o.onebit_chunk, "onebit-adam: values per sign1 scale (a multiple of 8)")
      ->capture_default_str();
  app.add_option("--dp-transport", o.dp_transport, "data-parallel: gloo (one process group) | ring")
      ->capture_default_str();
  app.add_option("--inner-steps", o.outer.inner_steps, "H")->capture_default_str();
  app.add_option("--fragments", o.outer.num_fragments, "P (1 = DiLoCo)")->capture_default_str();
  app.add_option("--fragment-strategy", strategy, "strided | sequential | balanced")->capture_default_str();
  app.add_option("--overlap-steps", o.outer.overlap_steps, "tau")->capture_default_str();
  app.add_option("--mixing-alpha", o.outer.mixing_alpha, "alpha (negative = 0 without overlap, 0.5 with)")
      ->capture_default_str();
  app.add_option("--outer-optimizer", o.outer.outer_optimizer, "core::MakeServerOptimizer spec")->capture_default_str();
  app.add_option("--codec", o.codec, "ring codec: fp32 | bf16 | int8 | int4 | fp4 [:block]")->capture_default_str();
  app.add_option("--error-feedback", o.error_feedback, "error feedback for lossy codecs")->capture_default_str();
  app.add_option("--connections-per-peer", o.connections_per_peer, "ZeroMQ connections per ring neighbour")
      ->capture_default_str();
  // The launcher (fl-experiment) gives the exchange timeout in ms, as fl-coordinator takes it; -s is the older form.
  std::optional<uint32_t> exchange_timeout_ms;
  CLI::Option* timeout_s =
      app.add_option("--exchange-timeout-s", o.exchange_timeout_s, "ring exchange timeout")->capture_default_str();
  app.add_option("--exchange-timeout-ms", exchange_timeout_ms, "ring exchange timeout in ms (as fl-coordinator's)")
      ->excludes(timeout_s);
  app.add_option("--data-endpoint", o.data_endpoint, "ZeroMQ endpoint the leader binds for the ring")
      ->capture_default_str();
  app.add_option("--advertised-endpoint", o.advertised_endpoint, "ring endpoint peers dial (default: data-endpoint)");
  app.add_option("--coordinator", o.coordinator, "fl-coordinator address (host:port)");
  app.add_option("--peer", o.peers, "static ring member id=endpoint (repeat, in ring order)");
  app.add_option("--state-endpoint", o.state_endpoint,
                 "listen address of this island's state server (HOST:0 picks a port; peers are told HOST:port, or "
                 "127.0.0.1:port for a wildcard)");
  app.add_option("--summary", o.summary_path, "write the leader's JSON summary here");
  app.add_option("--metrics", o.metrics_path, "append per-sync / per-eval JSON lines here");
  app.add_option("--tls-ca", o.tls_ca,
                 "CA certificate (PEM) the coordinator's and the other islands' certificates must chain to; with "
                 "--tls-cert and --tls-key: mutual TLS and CurveZMQ on the ring (docs/security.md)");
  app.add_option("--tls-cert", o.tls_cert, "this island's certificate (fl-provision add-island: D/islands/NAME.crt)");
  app.add_option("--tls-key", o.tls_key, "its private key (D/islands/NAME.key)");
  app.add_option("--curve-dir", o.curve_dir,
                 "folder with this island's NAME.curve.key and every ring member's ID.curve.pub (default: the "
                 "folder of --tls-cert)");
  app.add_flag("--insecure", o.insecure,
               "plaintext gRPC and ZeroMQ without TLS/CurveZMQ material: only on a trusted network or in a test");
  app.add_option("--log-level", log_level, "trace | debug | info | warn | error")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (exchange_timeout_ms.has_value()) o.exchange_timeout_s = *exchange_timeout_ms / 1000.0;
  if (o.insecure && o.NeedsTransportSecurity()) {
    std::cerr << "fl-island " << o.island_id << ": --insecure: plaintext: anyone on the network can join the ring or "
              << "the coordinator as this island, read the model and change its updates; use --tls-ca/--tls-cert/"
                 "--tls-key (docs/security.md)\n";
  }
  spdlog::set_level(spdlog::level::from_str(log_level));
  absl::StatusOr<fl::core::FragmentStrategy> parsed = fl::core::ParseFragmentStrategy(strategy);
  if (!parsed.ok()) {
    std::cerr << "fl-island: " << parsed.status().message() << "\n";
    return 2;
  }
  o.outer.strategy = *parsed;
  if (show_device) {
    absl::StatusOr<fl::diloco::DeviceChoice> device =
        fl::diloco::ResolveDevice(o.device, o.device_slot(), o.cuda_device);
    if (!device.ok()) {
      std::cerr << "fl-island: " << device.status() << "\n";
      return device.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    std::cout << "device: " << device->Name() << "\nreason: " << device->reason << "\n";
    return 0;
  }
  absl::StatusOr<fl::diloco::IslandSummary> summary = fl::diloco::RunIsland(o);
  if (!summary.ok()) {
    std::cerr << "fl-island " << o.island_id << " rank " << o.rank << ": " << summary.status() << "\n";
    return summary.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
