// The table of fl-client's settings that manifests set (settings.h), and what comes from it.
#include "fl/client/settings.h"

#include <charconv>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include <CLI/CLI.hpp>

#include "fl/core/model_file.h"
#include "fl/core/str_cat.h"

namespace fl::client {
namespace {

using config::SettingType;

constexpr char kModelGroup[] = "Model and data";
constexpr char kTrainingGroup[] = "Local training";
constexpr char kLinkGroup[] = "Link and device";

absl::Status CheckModel(std::string_view m) {
  if (m == "cnn" || m == "squeezenet" || m.starts_with("synthetic:") || core::IsTorchScriptModelPath(m)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(fl::StrCat("unknown model \"", m, "\""));
}

absl::Status CheckPartition(std::string_view p) {
  if (p == "iid" || p == "natural" || p.starts_with("dirichlet:") || p.starts_with("shards:")) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(fl::StrCat("unknown partition \"", p, "\""));
}

// One declaration (the table below reads one setting per statement).
ClientSetting Declare(std::string name, std::string flag, std::string group, SettingType type, std::string unit,
                      double min, double max, std::string manifest, config::Member<ClientSettings> member,
                      std::string help) {
  ClientSetting s;
  s.name = std::move(name);
  s.flag = std::move(flag);
  s.group = std::move(group);
  s.type = type;
  s.unit = std::move(unit);
  s.min = min;
  s.max = max;
  s.manifest = std::move(manifest);
  s.member = member;
  s.help = std::move(help);
  return s;
}

std::vector<ClientSetting> MakeTable() {
  using C = ClientSettings;
  constexpr SettingType kText = SettingType::kString;
  std::vector<ClientSetting> t;
  ClientSetting& model = t.emplace_back(
      Declare("model", "--model", kModelGroup, kText, "", 0, 0, "training.model", &C::model,
              "Model: the built-in ones train on Fashion-MNIST; a .pt is a TorchScript model exported from PyTorch "
              "(docs/models-and-data.md); synthetic is for transport tests and benchmarks (no training)"));
  model.check = CheckModel;
  model.allowed = "cnn, squeezenet, synthetic:<P>[:<train_ms>], or the path of a TorchScript .pt file";
  t.push_back(Declare("data_dir", "--data-dir", kModelGroup, kText, "", 0, 0, "training.data_dir", &C::data_dir,
                      "Fashion-MNIST directory (Debian's dataset-fashion-mnist)"));
  ClientSetting& data = t.emplace_back(Declare(
      "data", "--data", kModelGroup, kText, "", 0, 0, "training.data", &C::data,
      "Data for a TorchScript model: a .npz (x_train, y_train, x_test, y_test[, client_id]), a Fashion-MNIST IDX "
      "directory, or (next-token) a text file or directory; default: --data-dir"));
  data.in_old_manifest_records = false;
  ClientSetting& task = t.emplace_back(Declare("task", "--task", kModelGroup, kText, "", 0, 0, "training.task",
                                               &C::task, "What a TorchScript model learns"));
  task.choices = {"classification", "regression", "next-token"};
  task.in_old_manifest_records = false;
  ClientSetting& buffers = t.emplace_back(
      Declare("buffers", "--buffers", kModelGroup, kText, "", 0, 0, "training.buffers", &C::buffers,
              "A TorchScript model's float buffers (BatchNorm statistics): average (FedAvg) or local (each client "
              "keeps its own, FedBN-style); integer buffers are always local"));
  buffers.choices = {"average", "local"};
  buffers.in_old_manifest_records = false;
  ClientSetting& seq_len = t.emplace_back(Declare("seq_len", "--seq-len", kModelGroup, SettingType::kUnsigned, "tokens",
                                                  1, 1'000'000, "training.seq_len", &C::seq_len,
                                                  "next-token on a text corpus: tokens (bytes) per "
                                                  "training sequence"));
  seq_len.in_old_manifest_records = false;
  ClientSetting& partition =
      t.emplace_back(Declare("partition", "--partition", kModelGroup, kText, "", 0, 0, "training.partition",
                             &C::partition, "How the training set is split (natural: the .npz's client_id)"));
  partition.check = CheckPartition;
  partition.allowed = "iid, dirichlet:<alpha>, shards:<n>, natural";
  t.push_back(Declare("threads", "--threads", kTrainingGroup, SettingType::kUnsigned, "threads", 0, 1024,
                      "training.threads", &C::threads,
                      "Intra-op threads for training; 0: LibTorch's default (every core)"));
  ClientSetting& fraction =
      t.emplace_back(Declare("data_fraction", "--data-fraction", kTrainingGroup, SettingType::kNumber, "", 0, 1,
                             "clients[].data_share", &C::data_fraction, "Train on this share of this client's shard"));
  fraction.min_open = true;
  ClientSetting& link = t.emplace_back(Declare("link_kind", "--link-kind", kLinkGroup, kText, "", 0, 0,
                                               "clients[].link_kind", &C::link_kind, "Link to the server"));
  link.choices = {"ethernet", "wifi", "5g", "other"};
  return t;
}

}  // namespace

std::string ClientSetting::Get(const ClientSettings& s) const {
  return std::visit(
      [&](auto m) -> std::string {
        using M = decltype(m);
        if constexpr (std::is_same_v<M, std::monostate>) {
          return {};
        } else {
          using V = std::remove_cvref_t<decltype(s.*m)>;
          if constexpr (std::is_same_v<V, std::string>) {
            return s.*m;
          } else if constexpr (std::is_same_v<V, bool>) {
            return s.*m ? "true" : "false";
          } else if constexpr (std::is_same_v<V, double>) {
            return config::SettingNumberText(s.*m);
          } else {
            return std::to_string(s.*m);
          }
        }
      },
      member);
}

void ClientSetting::Set(ClientSettings& s, const std::string& text) const {
  std::visit(
      [&](auto m) {
        using M = decltype(m);
        if constexpr (!std::is_same_v<M, std::monostate>) {
          using V = std::remove_cvref_t<decltype(s.*m)>;
          if constexpr (std::is_same_v<V, std::string>) {
            s.*m = text;
          } else if constexpr (std::is_same_v<V, bool>) {
            s.*m = text == "true";
          } else {
            V v{};
            std::from_chars(text.data(), text.data() + text.size(), v);
            s.*m = v;
          }
        }
      },
      member);
}

const std::vector<ClientSetting>& ClientSettingsTable() {
  static const auto& table = *new std::vector<ClientSetting>(MakeTable());
  return table;
}

const ClientSetting* FindClientSetting(std::string_view key) {
  for (const ClientSetting& s : ClientSettingsTable()) {
    if (s.name == key || s.flag == key || s.manifest == key) return &s;
  }
  return nullptr;
}

absl::Status ClientSettingFlags::ApplyTo(ClientSettings& settings) const {
  for (const auto& [s, v] : given) {
    absl::StatusOr<std::string> text = config::CheckSettingValue(*s, v, s->flag);
    if (!text.ok()) return text.status();
    s->Set(settings, *text);
  }
  return absl::OkStatus();
}

void AddClientSettingOptions(CLI::App& app, ClientSettingFlags& flags) {
  const ClientSettings defaults;
  std::map<std::string, CLI::Option_group*> groups;
  for (const ClientSetting& s : ClientSettingsTable()) {
    CLI::Option_group*& group = groups[s.group];
    if (group == nullptr) group = app.add_option_group(s.group);
    const ClientSetting* setting = &s;
    CLI::Option* o = group->add_option_function<std::string>(
        s.flag, [&flags, setting](const std::string& v) { flags.given.emplace_back(setting, v); }, s.OptionHelp());
    o->default_str(s.Get(defaults));
    o->type_name(s.TypeName());
  }
}

std::vector<std::string> ClientSettingArgs(const ClientSettings& settings) {
  std::vector<std::string> args;
  for (const ClientSetting& s : ClientSettingsTable()) {
    const std::string value = s.Get(settings);
    if (value.empty()) continue;
    args.push_back(s.flag);
    args.push_back(value);
  }
  return args;
}

}  // namespace fl::client
