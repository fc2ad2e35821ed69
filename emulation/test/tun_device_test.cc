// TUN devices through the real kernel: made inside a network namespace of the test's own (so its addresses
// collide with nothing), an ICMP echo request written into the TUN and the kernel's echo reply read back.
// Where the machine cannot run the packet backend, the tests check that the refusal names what is missing.
#include "fl/emulation/tun_device.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "fl/core/str_cat.h"
#include "fl/sys/process.h"

namespace fl::emulation {
namespace {

using fl::sys::RunCommand;
using ::testing::HasSubstr;
using ::testing::Not;

// The Internet checksum (RFC 1071) over `data`.
uint16_t Checksum(const uint8_t* data, size_t size) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < size; i += 2) sum += (uint32_t{data[i]} << 8) | data[i + 1];
  if (size % 2 == 1) sum += uint32_t{data[size - 1]} << 8;
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

void Put16(std::vector<uint8_t>& p, size_t at, uint16_t v) {
  p[at] = static_cast<uint8_t>(v >> 8);
  p[at + 1] = static_cast<uint8_t>(v & 0xFF);
}

// An IPv4 ICMP echo request from `src` to `dst` (network byte order addresses as 4 octets).
std::vector<uint8_t> EchoRequest(const uint8_t src[4], const uint8_t dst[4], uint16_t id) {
  std::vector<uint8_t> p(20 + 8 + 16, 0);
  p[0] = 0x45;  // IPv4, 20-byte header
  Put16(p, 2, static_cast<uint16_t>(p.size()));
  p[8] = 64;  // TTL
  p[9] = 1;   // ICMP
  std::copy(src, src + 4, p.begin() + 12);
  std::copy(dst, dst + 4, p.begin() + 16);
  Put16(p, 10, Checksum(p.data(), 20));
  p[20] = 8;  // echo request
  Put16(p, 24, id);
  Put16(p, 26, 1);  // sequence
  for (size_t i = 28; i < p.size(); ++i) p[i] = static_cast<uint8_t>(i);
  Put16(p, 22, Checksum(p.data() + 20, p.size() - 20));
  return p;
}

// Runs fn on a thread that joined /run/netns/<name>.
void InNamespace(const std::string& name, const std::function<void()>& fn) {
  std::thread t([&] {
    const int fd = open(StrCat("/run/netns/", name).c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0) << name;
    ASSERT_EQ(setns(fd, CLONE_NEWNET), 0) << name;
    close(fd);
    fn();
  });
  t.join();
}

// A namespace of the test's own, named as the packet backend names its namespaces (so that `fl-link cleanup`
// removes it if the test dies), removed when the test ends.
class ScratchNamespace {
 public:
  ScratchNamespace() : name_(StrCat("flp_", getpid(), "_fff0")) {
    auto s = RunCommand({"ip", "netns", "add", name_});
    ok_ = s.ok();
    EXPECT_TRUE(ok_) << s.status();
  }
  ~ScratchNamespace() {
    if (ok_) (void)RunCommand({"ip", "netns", "del", name_});
  }
  const std::string& name() const { return name_; }
  bool ok() const { return ok_; }

 private:
  std::string name_;
  bool ok_ = false;
};

TEST(TunDeviceTest, SupportIsFoundOrTheRefusalNamesWhatIsMissing) {
  const absl::Status s = PacketBackendSupport();
  const bool tun = access("/dev/net/tun", R_OK | W_OK) == 0;
  if (geteuid() == 0 && tun) {
    EXPECT_TRUE(s.ok()) << s;
    return;
  }
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot run here"));
  if (!tun) {
    EXPECT_THAT(std::string(s.message()), HasSubstr("/dev/net/tun"));
  }
}

TEST(TunDeviceTest, ANameLongerThanAnInterfaceNameIsRefusedNamingIt) {
  auto t = TunDevice::Open("flp_this_name_is_too_long");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("'flp_this_name_is_too_long' has 25 characters"));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("1 to 15"));
  EXPECT_FALSE(TunDevice::Open("").ok());
}

TEST(TunDeviceTest, CongestionControlsAreTheKernelsList) {
  auto cc = DetectCongestionControls();
  ASSERT_TRUE(cc.ok()) << cc.status();
  std::ifstream in("/proc/sys/net/ipv4/tcp_available_congestion_control");
  std::string line;
  std::getline(in, line);
  std::string joined;
  for (const std::string& c : *cc) joined += (joined.empty() ? "" : " ") + c;
  EXPECT_EQ(joined, line);
  // Reno is built into every kernel with TCP.
  EXPECT_THAT(*cc, ::testing::Contains("reno"));
}

TEST(TunDeviceTest, MadeInTheNamespaceOfItsThreadCarriesIpPacketsBothWaysAndGoesWithItsDescriptor) {
  if (!PacketBackendSupport().ok()) {
    // Covered by the refusal test above; without /dev/net/tun or root, opening must fail with a clear error.
    auto t = TunDevice::Open("flptest0");
    if (!t.ok()) {
      EXPECT_THAT(std::string(t.status().message()), HasSubstr("TUN"));
    }
    return;
  }
  ScratchNamespace ns;
  ASSERT_TRUE(ns.ok());
  const std::string name = StrCat("flp", getpid() % 100000, "_t");
  std::unique_ptr<TunDevice> kept;
  InNamespace(ns.name(), [&] {
    auto tun = TunDevice::Open(name);
    ASSERT_TRUE(tun.ok()) << tun.status();
    EXPECT_GE((*tun)->fd(), 0);
    EXPECT_TRUE((fcntl((*tun)->fd(), F_GETFL) & O_NONBLOCK) != 0);
    for (const std::vector<std::string>& step :
         std::vector<std::vector<std::string>>{{"ip", "-n", ns.name(), "addr", "add", "10.214.255.1/30", "dev", name},
                                               {"ip", "-n", ns.name(), "link", "set", name, "up"}}) {
      auto s = RunCommand(step);
      ASSERT_TRUE(s.ok()) << s.status();
    }
    // Nothing is waiting yet: a read says so instead of blocking.
    std::vector<uint8_t> got;
    auto none = (*tun)->Read(&got);
    ASSERT_TRUE(none.ok()) << none.status();
    // (IPv6 router solicitations may already be there; drain whatever is.)
    while (true) {
      auto r = (*tun)->Read(&got);
      ASSERT_TRUE(r.ok());
      if (!*r) break;
    }
    // The kernel answers an echo request from the peer address with an echo reply written into the TUN.
    const uint8_t peer[4] = {10, 214, 255, 2};
    const uint8_t local[4] = {10, 214, 255, 1};
    const std::vector<uint8_t> request = EchoRequest(peer, local, 0x4242);
    auto w = (*tun)->Write(request.data(), request.size());
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_TRUE(*w);
    bool replied = false;
    for (int tries = 0; tries < 50 && !replied; ++tries) {
      pollfd p{(*tun)->fd(), POLLIN, 0};
      ASSERT_GE(poll(&p, 1, 100), 0);
      while (true) {
        auto r = (*tun)->Read(&got);
        ASSERT_TRUE(r.ok()) << r.status();
        if (!*r) break;
        if (got.size() < 28 || (got[0] >> 4) != 4 || got[9] != 1) continue;  // not IPv4 ICMP
        EXPECT_EQ(std::string(got.begin() + 12, got.begin() + 16), std::string(local, local + 4));
        EXPECT_EQ(std::string(got.begin() + 16, got.begin() + 20), std::string(peer, peer + 4));
        EXPECT_EQ(got[20], 0);  // echo reply
        EXPECT_EQ(std::string(got.begin() + 28, got.end()), std::string(request.begin() + 28, request.end()));
        replied = true;
      }
    }
    EXPECT_TRUE(replied) << "no echo reply came out of the TUN";
    kept = *std::move(tun);
  });
  ASSERT_NE(kept, nullptr);
  // It lives in the namespace, not on the host (this thread, and the `ip` it starts, are in the host's).
  EXPECT_TRUE(RunCommand({"ip", "-n", ns.name(), "link", "show", name}).ok());
  EXPECT_FALSE(RunCommand({"ip", "link", "show", name}).ok());
  kept.reset();
  // Closed with its descriptor, the interface is gone.
  EXPECT_FALSE(RunCommand({"ip", "-n", ns.name(), "link", "show", name}).ok());
}

}  // namespace
}  // namespace fl::emulation
