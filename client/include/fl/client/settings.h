// fl-client's settings that an experiment manifest sets, each declared once (docs/architecture.md, "Settings"), as
// fl-server's are (fl/server/settings.h): its flag, manifest path, type, unit, default, bounds, help and option
// group (config::SettingSpec) and the member of ClientSettings it lives in. From the one table come
//   - fl-client's options, in option groups (AddClientSettingOptions), and their checks (ClientSettingFlags);
//   - the manifest reader's keys for them (experiments/src/manifest.cc: training.* and clients[].link_kind,
//     clients[].data_share), read and checked through the same functions, so that fl-client and fl-experiment
//     refuse a value in the same words;
//   - fl-experiment's fl-client arguments for them (ClientSettingArgs).
// Adding one is one entry in settings.cc, its member here, and its use. Torch-free (fl::client_config).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "fl/config/field_table.h"
#include "fl/config/setting_spec.h"

namespace CLI {
class App;
}

namespace fl::client {

// The values, each default the declared one (fl-client's and a manifest's alike).
struct ClientSettings {
  std::string model = "cnn";  // cnn, squeezenet, synthetic:<P>[:<ms>], or a TorchScript .pt path
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::string data;                     // bring your own data: .npz, IDX directory or text corpus; "" = data_dir
  std::string task = "classification";  // classification, regression, next-token (TorchScript models)
  std::string buffers = "average";      // average | local: a TorchScript model's float buffers
  uint32_t seq_len = 64;                // next-token on a text corpus: tokens per sequence
  std::string partition = "iid";        // iid, dirichlet:<alpha>, shards:<n>, natural
  uint32_t threads = 1;                 // intra-op training threads; 0: LibTorch's default (every core)
  // A manifest gives these two per client group (clients[].link_kind, clients[].data_share), not in training:.
  std::string link_kind = "ethernet";
  double data_fraction = 1.0;  // the share (0, 1] of its shard a client trains on
  bool operator==(const ClientSettings&) const = default;
};

struct ClientSetting : config::SettingSpec {
  config::Member<ClientSettings> member;  // where its value lives
  // Written in the resolved manifest JSON of experiments recorded before it was in manifests' records.
  bool in_old_manifest_records = true;
  // The value as canonical text in the setting's unit ("64", "0.5", "cnn").
  std::string Get(const ClientSettings& s) const;
  // Sets the value from canonical, checked text (CheckSettingValue's).
  void Set(ClientSettings& s, const std::string& text) const;
};

// Every setting, in the order of fl-client --help.
const std::vector<ClientSetting>& ClientSettingsTable();
// The setting with this name, flag ("--threads") or manifest path ("training.threads"); nullptr when none.
const ClientSetting* FindClientSetting(std::string_view name_flag_or_path);

// The values of fl-client's setting flags as given; ApplyTo checks them (the refusals of config::CheckSettingValue,
// naming the flag) and sets them.
struct ClientSettingFlags {
  std::vector<std::pair<const ClientSetting*, std::string>> given;
  absl::Status ApplyTo(ClientSettings& settings) const;
};

// Declares every setting as an fl-client option in its option group, with its default, unit, bounds and manifest
// path in the help; the values are kept as text in `flags` (CLI11's own conversions would refuse differently).
void AddClientSettingOptions(CLI::App& app, ClientSettingFlags& flags);

// fl-client's arguments for `settings`: "--flag value" for every setting, in the table's order, leaving out a
// setting whose value is empty text (data_dir or data: fl-client's default).
std::vector<std::string> ClientSettingArgs(const ClientSettings& settings);

}  // namespace fl::client
