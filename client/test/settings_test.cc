// fl-client's settings that manifests set, declared once (settings.h): every one has its flag, manifest path,
// group and help; fl-client's options start from the declared defaults, refuse a value out of bounds in the shared
// words (naming the flag, the setting, its unit and bounds), and read back what ClientSettingArgs writes.
// (The manifest's side of the same settings: experiments/test/manifest_test.cc.)
#include "fl/client/settings.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "absl/status/statusor.h"
#include "fl/core/str_cat.h"
#include "fl/testing/cli_parse.h"

namespace fl::client {
namespace {

// Parses `args` through fl-client's setting options, as fl-client does.
absl::StatusOr<ClientSettings> Parse(const std::vector<std::string>& args) {
  CLI::App app{"client_settings_test"};
  ClientSettingFlags flags;
  AddClientSettingOptions(app, flags);
  if (absl::Status s = testing::ParseCommandLine(app, "fl-client", args); !s.ok()) {
    return absl::InvalidArgumentError(fl::StrCat("CLI11: ", s.message()));
  }
  ClientSettings settings;
  if (absl::Status s = flags.ApplyTo(settings); !s.ok()) return s;
  return settings;
}

TEST(ClientSettingsTest, EverySettingHasANameAFlagAManifestPathAGroupAndHelp) {
  std::set<std::string> names, flags;
  for (const ClientSetting& s : ClientSettingsTable()) {
    SCOPED_TRACE(s.name);
    EXPECT_TRUE(names.insert(s.name).second);
    EXPECT_TRUE(flags.insert(s.flag).second);
    EXPECT_TRUE(s.flag.starts_with("--"));
    EXPECT_FALSE(s.manifest.empty());
    EXPECT_FALSE(s.group.empty());
    EXPECT_FALSE(s.help.empty());
    EXPECT_FALSE(std::holds_alternative<std::monostate>(s.member));
    if (s.type == config::SettingType::kString) {
      EXPECT_TRUE(!s.choices.empty() || s.check || s.name == "data_dir" || s.name == "data");
    } else {
      EXPECT_LT(s.min, s.max);
    }
    EXPECT_EQ(FindClientSetting(s.flag), &s);
    EXPECT_EQ(FindClientSetting(s.manifest), &s);
  }
}

TEST(ClientSettingsTest, NoFlagsGivesTheDeclaredDefaultsAndTheHelpSaysThem) {
  absl::StatusOr<ClientSettings> parsed = Parse({});
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, ClientSettings{});

  CLI::App app{"client_settings_test"};
  ClientSettingFlags flags;
  AddClientSettingOptions(app, flags);
  const ClientSettings defaults;
  for (const ClientSetting& s : ClientSettingsTable()) {
    SCOPED_TRACE(s.name);
    const CLI::Option* o = app.get_option(s.flag);
    EXPECT_EQ(o->get_default_str(), s.Get(defaults));
    EXPECT_NE(o->get_description().find(fl::StrCat("[manifest: ", s.manifest)), std::string::npos);
  }
  const std::string help = app.help();
  for (const char* group : {"Model and data", "Local training", "Link and device"}) {
    EXPECT_NE(help.find(group), std::string::npos) << group;
  }
}

TEST(ClientSettingsTest, AValueOutOfBoundsIsRefusedNamingTheFlagTheSettingItsUnitAndBounds) {
  absl::StatusOr<ClientSettings> threads = Parse({"--threads", "2000"});
  ASSERT_FALSE(threads.ok());
  EXPECT_EQ(threads.status().message(),
            "--threads: 2000 threads is out of bounds for setting threads (--threads, manifest training.threads) in "
            "threads, within [0, 1024] (whole numbers)");

  absl::StatusOr<ClientSettings> fraction = Parse({"--data-fraction", "0"});
  ASSERT_FALSE(fraction.ok());
  EXPECT_EQ(fraction.status().message(),
            "--data-fraction: 0 is out of bounds for setting data_fraction (--data-fraction, manifest "
            "clients[].data_share), within (0, 1]");

  absl::StatusOr<ClientSettings> kind = Parse({"--link-kind", "carrier-pigeon"});
  ASSERT_FALSE(kind.ok());
  EXPECT_NE(kind.status().message().find("one of ethernet, wifi, 5g, other"), std::string::npos) << kind.status();

  absl::StatusOr<ClientSettings> partition = Parse({"--partition", "halves"});
  ASSERT_FALSE(partition.ok());
  EXPECT_NE(partition.status().message().find("unknown partition \"halves\""), std::string::npos) << partition.status();
}

TEST(ClientSettingsTest, TheArgumentsOfSettingsReadBackAsTheSameSettings) {
  ClientSettings s;
  s.model = "synthetic:1000:5";
  s.data_dir = "/data/fmnist";
  s.data = "/data/mine.npz";
  s.task = "regression";
  s.buffers = "local";
  s.seq_len = 128;
  s.partition = "dirichlet:0.5";
  s.threads = 0;
  s.link_kind = "5g";
  s.data_fraction = 0.25;
  absl::StatusOr<ClientSettings> parsed = Parse(ClientSettingArgs(s));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, s);

  // Empty paths are fl-client's defaults, left out.
  ClientSettings empty;
  empty.data_dir.clear();
  for (const std::string& arg : ClientSettingArgs(empty)) EXPECT_NE(arg, "--data-dir");
}

}  // namespace
}  // namespace fl::client
