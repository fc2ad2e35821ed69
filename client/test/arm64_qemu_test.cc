// The arm64 fl-client (cross-built with LibTorch against build/sysroot-arm64, docs/deploy-raspberry-pi.md) under
// qemu-user against the amd64 fl-server of this build, on loopback: it joins, trains one round of the CNN on a
// small Fashion-MNIST shard, uploads, and the server commits the round; the records show the client as aarch64
// (what the kernel, and qemu-user, call arm64), detected by fl-client itself.
//
// Registered only when the build was configured with -DFL_ARM64_CLIENT=<the arm64 fl-client>: a machine
// without the sysroot does not run it. Once configured, a missing binary, sysroot or qemu-aarch64 is a failure
// that says what to do, never a skip.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "fl/core/str_cat.h"
#include "fl/instrumentation/record_reader.h"
#include "fl/testing/scratch_dir.h"
#include "fl/testing/subprocess.h"

namespace fl::client {
namespace {

using fl::testing::Subprocess;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// ELF e_machine of `path` (183 = EM_AARCH64, 62 = EM_X86_64), or -1 when it is not a 64-bit little-endian ELF.
int ElfMachine(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  unsigned char h[20] = {};
  if (!in.read(reinterpret_cast<char*>(h), sizeof(h))) return -1;
  if (h[0] != 0x7f || h[1] != 'E' || h[2] != 'L' || h[3] != 'F' || h[4] != 2 || h[5] != 1) return -1;
  return h[18] | (h[19] << 8);
}

int WaitForPort(const std::string& port_file, const Subprocess& server) {
  for (int i = 0; i < 3000 && server.running(); ++i) {
    const std::string text = ReadFile(port_file);
    if (!text.empty() && text.back() == '\n') return std::stoi(text);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

TEST(Arm64QemuTest, Arm64ClientTrainsACnnRoundThatTheAmd64ServerCommits) {
  const std::string client_bin = FL_ARM64_CLIENT_BIN;
  const std::string sysroot = FL_ARM64_SYSROOT;
  const std::string qemu = FL_QEMU_AARCH64;
  ASSERT_FALSE(qemu.empty()) << "qemu-aarch64 was not found when this build was configured with FL_ARM64_CLIENT: "
                                "apt-get install qemu-user, then re-run cmake (or configure without FL_ARM64_CLIENT)";
  ASSERT_TRUE(std::filesystem::is_regular_file(client_bin))
      << "FL_ARM64_CLIENT=" << client_bin
      << " does not exist: cross-build it first (tools/arm64-sysroot.sh, then cmake --build build/arm64 --target "
         "fl-client; docs/deploy-raspberry-pi.md \"Cross-building fl-client\")";
  ASSERT_EQ(ElfMachine(client_bin), 183) << "FL_ARM64_CLIENT=" << client_bin
                                         << " is not an arm64 (aarch64) ELF executable: point it at the fl-client of "
                                            "the cross build (build/arm64/client/fl-client)";
  ASSERT_TRUE(std::filesystem::exists(std::filesystem::path(sysroot) / "lib/ld-linux-aarch64.so.1"))
      << "FL_ARM64_SYSROOT=" << sysroot
      << " has no lib/ld-linux-aarch64.so.1: run tools/arm64-sysroot.sh (or give -DFL_ARM64_SYSROOT=<its path>)";

  fl::testing::ScratchDir dir("fl_arm64");
  const std::string db = dir.File("records.db");
  Subprocess server({FL_SERVER_BIN, "--listen", "127.0.0.1:0", "--port-file", dir.File("port"), "--db", db, "--rounds",
                     "1", "--min-fit-clients", "1", "--min-available-clients", "1", "--local-epochs", "1",
                     "--batch-size", "32", "--evaluate-every", "0",
                     // Training runs under an instruction-set emulator: several times slower than native.
                     "--round-deadline-ms", "600000", "--initial-model-deadline-ms", "600000", "--linger-s", "0",
                     "--log-level", "warn", "--insecure"},
                    dir.File("server.log"));
  const int port = WaitForPort(dir.File("port"), server);
  ASSERT_GT(port, 0) << ReadFile(dir.File("server.log"));

  // 1/60 of Fashion-MNIST's training set (1000 images): one epoch under qemu takes seconds, not minutes.
  const std::string client_log = dir.File("client.log");
  Subprocess client(
      {qemu, "-L", sysroot, client_bin, "--server", fl::StrCat("127.0.0.1:", port), "--name", "pi-qemu", "--model",
       "cnn", "--client-index", "0", "--num-clients", "60", "--threads", "2", "--give-up-after-s", "120", "--insecure"},
      client_log);
  ASSERT_EQ(client.Wait(std::chrono::seconds(900)), std::optional<int>(0)) << ReadFile(client_log);
  ASSERT_EQ(server.Wait(std::chrono::seconds(60)), std::optional<int>(0)) << ReadFile(dir.File("server.log"));

  auto reader = instrumentation::RecordReader::Open(db);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto& records = **reader;
  EXPECT_EQ(records.QueryInt("SELECT count(*) FROM rounds WHERE status = 'committed'").value_or(-1), 1);
  EXPECT_EQ(records
                .QueryInt("SELECT count(*) FROM client_rounds JOIN clients USING (experiment_id, client_id) "
                          "WHERE client_name = 'pi-qemu' AND outcome = 'ok'")
                .value_or(-1),
            1);
  // qemu-user answers uname() with the guest's machine, as the Pi's kernel does; with no --device-class and no
  // /proc/device-tree/model naming a Pi, the detected class is that architecture.
  EXPECT_EQ(records.QueryText("SELECT arch FROM clients WHERE client_name = 'pi-qemu'").value_or("?"), "aarch64");
  EXPECT_EQ(records.QueryText("SELECT device_class FROM clients WHERE client_name = 'pi-qemu'").value_or("?"),
            "aarch64");
}

}  // namespace
}  // namespace fl::client
