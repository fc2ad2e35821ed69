// fl-experiment render --launcher kubernetes (issue 31 item 3): the rendered objects against golden files and
// against the Kubernetes object schema (tools/k8s_schema_check.py over python3-kubernetes' models), the pods'
// scripts expanding to the local run's fl-client arguments, and what the renderer refuses.
//
// Regenerate the golden files (experiments/test/golden/k8s/<case>/) after an intended change with
//   FL_UPDATE_GOLDEN=1 ctest --test-dir build/<dir> -R experiments_k8s_render_test
// and read the diff: the Secrets' certificates are made fresh each time and compared as "<pem>".
#include "fl/experiment/k8s_render.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include "fl/core/str_cat.h"
#include "fl/emulation/link_profile.h"
#include "fl/experiment/manifest.h"
#include "fl/experiment/runner.h"
#include "fl/testing/run_tool.h"
#include "fl/testing/scratch_dir.h"

namespace fl::experiment {
namespace {

namespace fs = std::filesystem;

const fs::path kExperiments = FL_EXPERIMENTS_DIR;
const fs::path kGolden = kExperiments / "test" / "golden" / "k8s";
const fs::path kChecker = fs::path(FL_SOURCE_DIR) / "tools" / "k8s_schema_check.py";

std::string Read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Each PEM block (-----BEGIN ... -----END ...-----) becomes one "<pem>" line at its indentation: certificates
// and keys are made fresh each time.
std::string MaskPem(const std::string& text) {
  std::istringstream in(text);
  std::string out;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("-----BEGIN ");
    if (!inside && at != std::string::npos) {
      out += fl::StrCat(line.substr(0, at), "<pem>\n");
      inside = line.find("-----END ") == std::string::npos;
      continue;
    }
    if (inside) {
      inside = line.find("-----END ") == std::string::npos;
      continue;
    }
    out += line + "\n";
  }
  return out;
}

using fl::testing::ToolResult;

// The checker itself, or why it cannot run here (python3-kubernetes missing: deploy/install-deps.sh).
ToolResult RunChecker(const fs::path& target, const fl::testing::ScratchDir& dir) {
  return fl::testing::RunTool({"/usr/bin/python3", kChecker.string(), target.string()}, dir);
}

K8sRenderOptions Options(const fs::path& out) {
  K8sRenderOptions o;
  o.image = "fl-testbed:golden";  // not the version's tag: the golden files outlive versions
  o.software_version = "golden";
  o.out_dir = out;
  return o;
}

class K8sGoldenTest : public ::testing::TestWithParam<std::pair<std::string, std::string>> {};

TEST_P(K8sGoldenTest, MatchesGoldenFilesAndTheSchema) {
  const auto& [name, manifest_path] = GetParam();
  fl::testing::ScratchDir tmp{"fl_k8s"};
  absl::StatusOr<Manifest> m = LoadManifest(manifest_path);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<K8sRendering> r = RenderKubernetes(*m, Options(tmp.path()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NE(r->pki_source.find("a throwaway CA made in "), std::string::npos) << r->pki_source;
  const fs::path rendered = tmp.path() / "k8s";
  ASSERT_TRUE(WriteKubernetes(*r, rendered).ok());

  const fs::path golden = kGolden / name;
  if (const char* update = std::getenv("FL_UPDATE_GOLDEN"); update != nullptr && std::string(update) == "1") {
    fs::remove_all(golden);
    fs::create_directories(golden);
    for (const auto& [file, text] : r->files) std::ofstream(golden / file, std::ios::binary) << MaskPem(text);
  }
  std::vector<std::string> want_files, got_files;
  for (const fs::directory_entry& e : fs::directory_iterator(golden)) want_files.push_back(e.path().filename());
  for (const auto& [file, text] : r->files) got_files.push_back(file);
  std::sort(want_files.begin(), want_files.end());
  EXPECT_EQ(got_files, want_files) << "the rendered files differ from " << golden << "'s";
  for (const auto& [file, text] : r->files) {
    EXPECT_EQ(MaskPem(text), Read(golden / file))
        << file << " differs from " << (golden / file) << " (FL_UPDATE_GOLDEN=1 rewrites it; see the diff)";
  }

  // Every document against the Kubernetes models (unknown fields, types, required fields).
  const ToolResult check = RunChecker(rendered, tmp);
  EXPECT_EQ(check.code, 0) << (check.code == 2 ? "the schema checker cannot run here (python3-kubernetes, "
                                                 "deploy/install-deps.sh): "
                                               : "")
                           << check.output;

  // Each group's link profile in the ConfigMap reads back (what fl-link relay loads in the pod) as the group's link.
  const std::vector<YAML::Node> configmaps = YAML::LoadAll(Read(rendered / "configmap.yaml"));
  ASSERT_EQ(configmaps.size(), 1u);
  for (const ClientGroup& g : m->clients) {
    if (!g.link.has_value()) continue;
    const YAML::Node text = configmaps[0]["data"][fl::StrCat("link-", g.name, ".yaml")];
    ASSERT_TRUE(text.IsScalar()) << g.name;
    const fs::path profile = tmp.path() / fl::StrCat(g.name, ".yaml");
    std::ofstream(profile) << text.as<std::string>();
    absl::StatusOr<emulation::LinkProfile> loaded = emulation::LoadLinkProfile(profile);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
    EXPECT_EQ(loaded->name, g.link->name);
    EXPECT_TRUE(loaded->uplink == g.link->uplink) << g.name;
    EXPECT_TRUE(loaded->downlink == g.link->downlink) << g.name;
  }

  // The same manifest renders the same bytes (certificates aside): nothing depends on the time or the run.
  absl::StatusOr<K8sRendering> again = RenderKubernetes(*m, Options(tmp.path()));
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_EQ(again->files.size(), r->files.size());
  for (size_t i = 0; i < r->files.size(); ++i) EXPECT_EQ(MaskPem(again->files[i].second), MaskPem(r->files[i].second));
}

INSTANTIATE_TEST_SUITE_P(
    Manifests, K8sGoldenTest,
    ::testing::Values(std::make_pair(std::string("quickstart"), (kExperiments / "quickstart.yaml").string()),
                      std::make_pair(std::string("two-groups"), (kGolden / "two-groups.yaml").string())),
    [](const auto& param) { return param.param.first == "two-groups" ? "TwoGroups" : "Quickstart"; });

// The checker can fail: each kind of error is found and named by its path.
TEST(K8sSchemaCheckTest, RejectsABrokenDocumentNamingEachPath) {
  fl::testing::ScratchDir tmp{"fl_k8s"};
  const fs::path bad = tmp.path() / "bad.yaml";
  std::ofstream(bad) << "apiVersion: batch/v1\nkind: Job\nmetadata: {name: x}\nspec:\n  completions: \"3\"\n"
                        "  completionMod: Indexed\n  template:\n    spec:\n      containers:\n      - image: i\n"
                        "---\napiVersion: v1\nkind: Job\nmetadata: {name: y}\n";
  const ToolResult e = RunChecker(bad, tmp);
  ASSERT_NE(e.code, 2) << "the schema checker cannot run here: " << e.output;
  EXPECT_EQ(e.code, 1) << e.output;
  EXPECT_NE(e.output.find("Job.spec.completions: is a string ('3'), must be int"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("Job.spec.completionMod: unknown field of V1JobSpec"), std::string::npos) << e.output;
  EXPECT_NE(e.output.find("Job.spec.template.spec.containers[0].name: missing, required by V1Container"),
            std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("apiVersion: v1 is not Job's (batch/v1)"), std::string::npos) << e.output;
}

// A client pod's script, run by /bin/sh with its completion index, execs fl-client with exactly the arguments
// the local runner gives that process (ClientProcessArgs), and starts one relay per client with the local seed.
// The programs in the image are replaced by scripts that print their arguments: what is tested is the shell.
void CheckPodScripts(const fs::path& manifest, const std::vector<DeviceEmulation>& devices) {
  fl::testing::ScratchDir tmp{"fl_k8s"};
  absl::StatusOr<Manifest> m = LoadManifest(manifest);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<K8sRendering> r = RenderKubernetes(*m, Options(tmp.path()));
  ASSERT_TRUE(r.ok()) << r.status();
  const fs::path bin = tmp.path() / "bin";
  fs::create_directories(bin);
  for (const std::string program : {"fl-client", "fl-link"}) {
    std::ofstream(bin / program) << "#!/bin/sh\nprintf '%s\\n' \"$0\" \"$@\" > " << (tmp.path() / program).string()
                                 << "-$$.args\n";
    fs::permissions(bin / program, fs::perms::owner_all);
  }
  // The scripts, read back from job.yaml's literal blocks (after "- |" under command), one per group.
  std::string jobs;
  for (const auto& [file, text] : r->files) {
    if (file == "job.yaml") jobs = text;
  }
  std::vector<std::string> scripts;
  std::istringstream in(jobs);
  std::string line, current;
  bool inside = false;
  size_t indent = 0;
  while (std::getline(in, line)) {
    if (inside && (line.empty() || line.find_first_not_of(' ') >= indent)) {
      current += (line.empty() ? "" : line.substr(indent)) + "\n";
      continue;
    }
    if (inside) scripts.push_back(current), inside = false;
    if (line.ends_with("- |")) {
      inside = true;
      current.clear();
      indent = line.find('-') + 4;
    }
  }
  if (inside) scripts.push_back(current);
  ASSERT_EQ(scripts.size(), m->clients.size()) << jobs;

  for (const ClientProcess& p : PlanClientProcesses(*m, "userspace", devices)) {
    std::string script = scripts[static_cast<size_t>(p.group - m->clients.data())];
    for (size_t at; (at = script.find("/usr/local/bin/")) != std::string::npos;) {
      script.replace(at, std::string("/usr/local/bin/").size(), bin.string() + "/");
    }
    // No waiting in a test, and the relays in the foreground, so that their arguments are written when it ends.
    for (size_t at; (at = script.find(" &\n")) != std::string::npos;) script.replace(at, 3, "\n");
    script = fl::StrCat("sleep() { :; }\ntimeout() { shift 3; \"$@\"; }\n", script);
    const fs::path file = tmp.path() / "script.sh";
    std::ofstream(file) << script;
    for (const fs::directory_entry& e : fs::directory_iterator(tmp.path())) {
      if (e.path().extension() == ".args") fs::remove(e.path());
    }
    const ToolResult run = fl::testing::RunTool(
        {"/usr/bin/env", fl::StrCat("JOB_COMPLETION_INDEX=", p.group_offset), "/bin/sh", file.string()}, tmp);
    ASSERT_EQ(run.code, 0) << p.name << ": " << run.output;
    std::vector<std::string> client_argv;
    std::map<std::string, std::vector<std::string>> relays;  // by their --listen
    for (const fs::directory_entry& e : fs::directory_iterator(tmp.path())) {
      if (e.path().extension() != ".args") continue;
      std::vector<std::string> argv;
      std::istringstream args(Read(e.path()));
      for (std::string a; std::getline(args, a);) argv.push_back(a);
      if (e.path().filename().string().starts_with("fl-client")) {
        client_argv = argv;
      } else {
        ASSERT_GE(argv.size(), 7u);
        relays[argv[6]] = argv;
      }
    }
    const uint32_t links = std::max<uint32_t>(p.instances, 1);
    std::string server_addr;
    ASSERT_EQ(relays.size(), links) << p.name;
    for (uint32_t i = 0; i < links; ++i) {
      const std::string listen = fl::StrCat("127.0.0.1:", 20000 + i);
      server_addr += fl::StrCat(i > 0 ? "," : "", listen);
      const std::vector<std::string> relay = {bin.string() + "/fl-link",
                                              "--log-level",
                                              "warn",
                                              "relay",
                                              fl::StrCat("/etc/fl/manifest/link-", p.group->name, ".yaml"),
                                              "--listen",
                                              listen,
                                              "--target",
                                              fl::StrCat(m->name, "-server:50051"),
                                              "--seed",
                                              std::to_string(m->settings.seed * 100'003 + p.index + i)};
      EXPECT_EQ(relays[listen], relay) << p.name << " relay " << i;
    }
    const std::vector<std::string> want =
        ClientProcessArgs(*m, p, bin.string() + "/fl-client", server_addr, "/etc/fl/pki", true,
                          fl::StrCat(m->name, "-server"), kK8sClientGiveUpS);
    EXPECT_EQ(client_argv, want) << p.name;
  }
}

TEST(K8sRenderTest, PodScriptsExpandToTheLocalArgumentsProcessPerClient) {
  std::vector<DeviceEmulation> devices(2);
  devices[0].mode = "cpu-quota";  // rpi4 at host_relative_speed 4: 2 threads / 4 = 0.5 cores
  devices[0].slowdown = 4;
  devices[0].cores = 0.5;
  devices[1].mode = "host";
  CheckPodScripts(kGolden / "two-groups.yaml", devices);
}

TEST(K8sRenderTest, PodScriptsExpandToTheLocalArgumentsVirtualClients) {
  std::vector<DeviceEmulation> devices(1);
  devices[0].mode = "host";
  CheckPodScripts(kExperiments / "quickstart.yaml", devices);
}

// The command: render --launcher kubernetes writes the files and says where the certificates come from; a launcher
// it does not know, or none, is refused naming it (exit 2, nothing written).
TEST(K8sRenderTest, RenderCommand) {
  fl::testing::ScratchDir tmp{"fl_k8s"};
  const fs::path out = tmp.path() / "objects";
  ToolResult r = fl::testing::RunTool(
      {FL_EXPERIMENT_BIN, "render", "--launcher", "kubernetes", (kExperiments / "quickstart.yaml").string(), "--out",
       out.string(), "--namespace", "fl", "--image", "registry.example/fl-testbed:1"},
      tmp);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(fl::StrCat("certificates: a throwaway CA made in ", (out / "pki").string())),
            std::string::npos)
      << r.output;
  EXPECT_NE(Read(out / "statefulset.yaml").find("image: \"registry.example/fl-testbed:1\""), std::string::npos);
  EXPECT_NE(Read(out / "job.yaml").find("namespace: fl\n"), std::string::npos);
  EXPECT_TRUE(fs::exists(out / "pki" / "ca" / "ca.key"));
  // The CA's key stays in <out>/pki: none of its lines is in the Secrets.
  std::istringstream ca_key(Read(out / "pki" / "ca" / "ca.key"));
  const std::string secrets = Read(out / "secret.yaml");
  for (std::string line; std::getline(ca_key, line);) {
    if (line.size() > 40) {
      EXPECT_EQ(secrets.find(line), std::string::npos) << "the CA key is in secret.yaml";
    }
  }

  r = fl::testing::RunTool({FL_EXPERIMENT_BIN, "render", "--launcher", "nomad",
                            (kExperiments / "quickstart.yaml").string(), "--out", (tmp.path() / "nomad").string()},
                           tmp);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("render needs a cluster launcher: --launcher slurm or kubernetes"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("(it is nomad)"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(tmp.path() / "nomad"));

  r = fl::testing::RunTool({FL_EXPERIMENT_BIN, "render", (kExperiments / "quickstart.yaml").string()}, tmp);
  EXPECT_EQ(r.code, 2) << r.output;
  EXPECT_NE(r.output.find("(it is local)"), std::string::npos) << r.output;
}

absl::Status RenderText(const std::string& yaml, const fs::path& dir, K8sRenderOptions o = {}) {
  absl::StatusOr<Manifest> m = ParseManifest(yaml, "bad.yaml", kExperiments);
  if (!m.ok()) return m.status();
  o.out_dir = dir;
  return RenderKubernetes(*m, o).status();
}

constexpr char kSmall[] =
    "name: small\nserver: {rounds: 1, selection: {min_fit_clients: 2, min_available_clients: 2}}\n"
    "training: {model: cnn, dataset: fashion-mnist, threads: 1}\n";

// What a pod cannot do or Kubernetes cannot hold is refused, naming what and why, before anything is written.
TEST(K8sRenderTest, RefusesWhatItCannotExpress) {
  fl::testing::ScratchDir tmp{"fl_k8s"};
  const std::string clients = "clients: [{name: c, count: 2, link: ethernet}]\n";
  absl::Status s = RenderText(fl::StrCat(kSmall, "emulation: {backend: kernel}\n", clients), tmp.path());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("emulation.backend is kernel, which needs network namespaces and root"), std::string::npos)
      << s;
  EXPECT_NE(s.message().find("use backend: userspace or auto"), std::string::npos) << s;

  s = RenderText(fl::StrCat("name: Small_1\n", std::string(kSmall).substr(12), clients), tmp.path());
  EXPECT_NE(s.message().find("name 'Small_1' cannot name Kubernetes objects"), std::string::npos) << s;

  s = RenderText(fl::StrCat(kSmall, "clients: [{name: Group, count: 2}]\n"), tmp.path());
  EXPECT_NE(s.message().find("clients group 'Group': its Job 'small-Group'"), std::string::npos) << s;

  s = RenderText(
      fl::StrCat(std::string(kSmall).substr(0, std::string(kSmall).size() - 2), ", data_dir: /tmp}\n", clients),
      tmp.path());
  EXPECT_NE(s.message().find("training.data_dir is /tmp, a file on this machine that the pods cannot read"),
            std::string::npos)
      << s;

  K8sRenderOptions o;
  o.storage = "lots";
  s = RenderText(fl::StrCat(kSmall, clients), tmp.path(), o);
  EXPECT_NE(s.message().find("launcher.storage 'lots' is not a Kubernetes quantity"), std::string::npos) << s;

  o = {};
  o.k8s_namespace = "Team_A";
  s = RenderText(fl::StrCat(kSmall, clients), tmp.path(), o);
  EXPECT_NE(s.message().find("launcher.namespace 'Team_A' is not a Kubernetes namespace name"), std::string::npos) << s;

  s = RenderText(
      "name: small\nserver: {rounds: 1}\ntraining: {model: cnn, dataset: fashion-mnist, threads: 0}\n"
      "emulation: {devices: cpu-quota, host_relative_speed: 4, virtual_clients: false}\n"
      "clients: [{name: c, count: 2, device: rpi4}]\n",
      tmp.path());
  EXPECT_NE(s.message().find("emulation.devices is cpu-quota, but training.threads is 0"), std::string::npos) << s;

  s = RenderText(fl::StrCat(kSmall, "clients: [{name: c, count: 3, instances_per_process: 2}]\n"), tmp.path());
  EXPECT_NE(s.message().find("instances_per_process 2 of 3 clients is not rendered for Kubernetes yet"),
            std::string::npos)
      << s;
  EXPECT_FALSE(fs::exists(tmp.path() / "pki")) << "refused after making a CA";
}

// Certificates from a CA the user gives: the Secrets say so, and a directory missing a client's is refused.
TEST(K8sRenderTest, GivenCaIsUsedAndChecked) {
  fl::testing::ScratchDir tmp{"fl_k8s"};
  const std::string manifest = fl::StrCat(kSmall, "clients: [{name: c, count: 2}]\n");
  const fs::path first = tmp.path() / "first";
  absl::StatusOr<Manifest> m = ParseManifest(manifest, "small.yaml", kExperiments);
  ASSERT_TRUE(m.ok()) << m.status();
  K8sRenderOptions o = Options(first);
  absl::StatusOr<K8sRendering> made = RenderKubernetes(*m, o);
  ASSERT_TRUE(made.ok()) << made.status();
  o.out_dir = tmp.path() / "second";
  o.pki_dir = (first / "pki").string();
  absl::StatusOr<K8sRendering> given = RenderKubernetes(*m, o);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_NE(given->pki_source.find(fl::StrCat("the CA in ", o.pki_dir)), std::string::npos) << given->pki_source;
  EXPECT_FALSE(fs::exists(tmp.path() / "second" / "pki")) << "made a CA although one was given";
  std::string secrets;
  for (const auto& [file, text] : given->files) {
    if (file == "secret.yaml") secrets = text;
  }
  EXPECT_NE(secrets.find("a CA given to fl-experiment render"), std::string::npos) << secrets;
  // The same certificate as in the given directory.
  EXPECT_NE(secrets.find(Read(first / "pki" / "clients" / "c-1.crt").substr(0, 200).substr(28, 64)), std::string::npos);

  fs::remove(first / "pki" / "clients" / "c-1.key");
  absl::Status s = RenderKubernetes(*m, o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("c-1.key"), std::string::npos) << s;
}

// security.mode insecure renders no Secrets and --insecure on both sides; a group without a link dials the Service
// itself (no relay), and the objects still pass the schema.
TEST(K8sRenderTest, InsecureAndUnlinkedGroups) {
  fl::testing::ScratchDir tmp{"fl_k8s"};
  absl::StatusOr<Manifest> m = ParseManifest(
      fl::StrCat(kSmall, "security: {mode: insecure}\nclients: [{name: c, count: 2}]\n"), "small.yaml", kExperiments);
  ASSERT_TRUE(m.ok()) << m.status();
  absl::StatusOr<K8sRendering> r = RenderKubernetes(*m, Options(tmp.path()));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->pki_source, "");
  EXPECT_FALSE(fs::exists(tmp.path() / "pki"));
  std::map<std::string, std::string> files(r->files.begin(), r->files.end());
  EXPECT_EQ(files.count("secret.yaml"), 0u);
  EXPECT_NE(files["statefulset.yaml"].find("--insecure"), std::string::npos);
  EXPECT_NE(files["job.yaml"].find("--server small-server:50051 \\\n"), std::string::npos) << files["job.yaml"];
  EXPECT_NE(files["job.yaml"].find("--insecure"), std::string::npos);
  EXPECT_EQ(files["job.yaml"].find("fl-link"), std::string::npos);
  EXPECT_EQ(files["job.yaml"].find("/etc/fl/pki"), std::string::npos);
  ASSERT_TRUE(WriteKubernetes(*r, tmp.path() / "k8s").ok());
  const ToolResult check = RunChecker(tmp.path() / "k8s", tmp);
  EXPECT_EQ(check.code, 0) << check.output;
}

TEST(K8sRenderTest, YamlQuotesWhatPlainYamlWouldMisread) {
  EXPECT_EQ(JsonToYaml(R"({"a":"true","b":"9464","c":"fl-testbed:1","d":"plain/text-1.2","e":"","f":"x y"})"),
            "a: \"true\"\nb: \"9464\"\nc: \"fl-testbed:1\"\nd: plain/text-1.2\ne: \"\"\nf: \"x y\"\n");
  EXPECT_EQ(JsonToYaml(R"({"l":[{"k":1,"m":[]},"s"],"o":{},"t":"one\ntwo\n","u":"x\ny","y":"n"})"),
            "l:\n- k: 1\n  m: []\n- s\no: {}\nt: |\n  one\n  two\nu: |-\n  x\n  y\n\"y\": \"n\"\n");
}

}  // namespace
}  // namespace fl::experiment
