// The round engine's client registry (server/src/engine_registry.h) on its own: lookups and tokens, sessions and
// their index, idle clients, and places in the order clients were last heard on an injected ManualClock.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../src/engine_registry.h"
#include "fl/rpc/clock.h"

namespace fl::server::engine {
namespace {

class NullChannel final : public SessionChannel {
 public:
  void Send(fl::v1::ServerMessage) override {}
  void Close(const grpc::Status&) override {}
};

std::vector<std::string> Ids(const std::vector<ClientInfo*>& clients) {
  std::vector<std::string> ids;
  for (const ClientInfo* c : clients) ids.push_back(c->id);
  return ids;
}

std::vector<std::string> PlaceOrder(const ClientRegistry& r) {
  return Ids(std::vector<ClientInfo*>(r.places().begin(), r.places().end()));
}

TEST(ClientRegistryTest, FindsKnownClientsAndAuthenticatesOnlyTheirOwnNonEmptyToken) {
  ClientRegistry r;
  EXPECT_EQ(r.Find("a"), nullptr);
  ClientInfo& a = r.FindOrAdd("a");
  EXPECT_EQ(a.id, "a");
  EXPECT_EQ(&r.FindOrAdd("a"), &a);  // the same client, not a new one
  EXPECT_EQ(r.Find("a"), &a);
  EXPECT_EQ(&r.At("a"), &a);
  EXPECT_EQ(r.Authenticate("a", ""), nullptr);  // no token yet: nothing authenticates
  a.token = "t1";
  EXPECT_EQ(r.Authenticate("a", "t1"), &a);
  EXPECT_EQ(r.Authenticate("a", "t2"), nullptr);
  EXPECT_EQ(r.Authenticate("b", "t1"), nullptr);
  EXPECT_EQ(r.size(), 1u);
}

TEST(ClientRegistryTest, ASessionFindsItsClientAndANewSessionReplacesTheOld) {
  ClientRegistry r;
  ClientInfo& a = r.FindOrAdd("a");
  auto first = std::make_shared<NullChannel>();
  auto second = std::make_shared<NullChannel>();
  r.AttachSession(a, first);
  EXPECT_EQ(r.ClientOfSession(first.get()), &a);
  EXPECT_EQ(r.connected(), 1u);
  r.AttachSession(a, second);  // a reconnect: the old stream no longer finds the client
  EXPECT_EQ(r.ClientOfSession(first.get()), nullptr);
  EXPECT_EQ(r.ClientOfSession(second.get()), &a);
  EXPECT_EQ(r.connected(), 1u);
  r.DetachSession(a);
  EXPECT_EQ(a.session, nullptr);
  EXPECT_EQ(r.ClientOfSession(second.get()), nullptr);
  EXPECT_EQ(r.connected(), 0u);
  r.DetachSession(a);  // idempotent
  EXPECT_EQ(r.connected(), 0u);
}

TEST(ClientRegistryTest, IdleClientsAreConnectedOnesWithoutAnOpenTask) {
  ClientRegistry r;
  ClientInfo& a = r.FindOrAdd("a");
  ClientInfo& b = r.FindOrAdd("b");
  r.FindOrAdd("c");  // never connected
  r.AttachSession(a, std::make_shared<NullChannel>());
  r.AttachSession(b, std::make_shared<NullChannel>());
  EXPECT_EQ(Ids(r.IdleConnected()), (std::vector<std::string>{"a", "b"}));
  b.open_task = "task-1";
  EXPECT_EQ(Ids(r.IdleConnected()), (std::vector<std::string>{"a"}));
  r.DetachSession(a);
  EXPECT_TRUE(r.IdleConnected().empty());
}

TEST(ClientRegistryTest, PlacesAreOrderedByWhenEachClientWasLastHeard) {
  rpc::ManualClock clock;
  ClientRegistry r;
  ClientInfo& a = r.FindOrAdd("a");
  ClientInfo& b = r.FindOrAdd("b");
  ClientInfo& c = r.FindOrAdd("c");
  EXPECT_TRUE(r.HoldPlace(a, clock.NowNs()));
  clock.AdvanceMs(10);
  EXPECT_TRUE(r.HoldPlace(b, clock.NowNs()));
  clock.AdvanceMs(10);
  EXPECT_TRUE(r.HoldPlace(c, clock.NowNs()));
  EXPECT_EQ(PlaceOrder(r), (std::vector<std::string>{"a", "b", "c"}));
  clock.AdvanceMs(10);
  EXPECT_FALSE(r.HoldPlace(a, clock.NowNs()));  // heard again: to the back, still one place
  EXPECT_EQ(PlaceOrder(r), (std::vector<std::string>{"b", "c", "a"}));
  EXPECT_EQ(r.places_held(), 3u);
  EXPECT_EQ(a.last_seen_ns, clock.NowNs());
  // A message stamped before the last one it was heard at (a reactor's older stamp) never moves it back in time.
  const int64_t seen = a.last_seen_ns;
  EXPECT_FALSE(r.HoldPlace(a, seen - 5'000'000));
  EXPECT_EQ(a.last_seen_ns, seen);
  EXPECT_TRUE(r.ReleasePlace(b));
  EXPECT_FALSE(r.ReleasePlace(b));
  EXPECT_FALSE(b.holds_place);
  EXPECT_EQ(PlaceOrder(r), (std::vector<std::string>{"c", "a"}));
}

TEST(ClientRegistryTest, AForgottenClientLeavesNoIndexBehind) {
  ClientRegistry r;
  ClientInfo& a = r.FindOrAdd("a");
  auto channel = std::make_shared<NullChannel>();
  r.AttachSession(a, channel);
  r.HoldPlace(a, 1);
  r.Forget("a");
  EXPECT_EQ(r.Find("a"), nullptr);
  EXPECT_EQ(r.ClientOfSession(channel.get()), nullptr);
  EXPECT_EQ(r.connected(), 0u);
  EXPECT_EQ(r.places_held(), 0u);
  r.Forget("a");  // unknown: nothing happens
  EXPECT_EQ(r.size(), 0u);
}

}  // namespace
}  // namespace fl::server::engine
