// The round engine's client registry (engine_registry.h).
#include "engine_registry.h"

#include <algorithm>
#include <utility>

namespace fl::server::engine {

ClientInfo* ClientRegistry::Find(const std::string& id) const {
  auto it = clients_.find(id);
  return it == clients_.end() ? nullptr : it->second.get();
}

ClientInfo* ClientRegistry::Authenticate(const std::string& id, const std::string& token) const {
  ClientInfo* c = Find(id);
  if (c == nullptr || token.empty() || c->token != token) return nullptr;
  return c;
}

ClientInfo& ClientRegistry::FindOrAdd(const std::string& id) {
  std::unique_ptr<ClientInfo>& slot = clients_[id];
  if (slot == nullptr) {
    slot = std::make_unique<ClientInfo>();
    slot->id = id;
  }
  return *slot;
}

void ClientRegistry::Forget(const std::string& id) {
  auto it = clients_.find(id);
  if (it == clients_.end()) return;
  // The indexes must not keep a pointer to it: a caller that forgets a client with a session or place is a bug.
  DetachSession(*it->second);
  ReleasePlace(*it->second);
  clients_.erase(it);
}

void ClientRegistry::AttachSession(ClientInfo& client, std::shared_ptr<SessionChannel> channel) {
  DetachSession(client);
  by_session_[channel.get()] = &client;
  client.session = std::move(channel);
}

void ClientRegistry::DetachSession(ClientInfo& client) {
  if (client.session == nullptr) return;
  if (auto it = by_session_.find(client.session.get()); it != by_session_.end() && it->second == &client) {
    by_session_.erase(it);
  }
  client.session.reset();
}

ClientInfo* ClientRegistry::ClientOfSession(const SessionChannel* channel) const {
  auto it = by_session_.find(channel);
  return it == by_session_.end() ? nullptr : it->second;
}

std::vector<ClientInfo*> ClientRegistry::IdleConnected() const {
  std::vector<ClientInfo*> out;
  for (const auto& [id, c] : clients_) {
    if (c->session != nullptr && c->open_task.empty()) out.push_back(c.get());
  }
  return out;
}

bool ClientRegistry::HoldPlace(ClientInfo& client, int64_t seen_ns) {
  client.last_seen_ns = std::max(client.last_seen_ns, seen_ns);
  if (client.holds_place) {
    places_.splice(places_.end(), places_, client.place);
    return false;
  }
  client.place = places_.insert(places_.end(), &client);
  client.holds_place = true;
  return true;
}

bool ClientRegistry::ReleasePlace(ClientInfo& client) {
  if (!client.holds_place) return false;
  places_.erase(client.place);
  client.holds_place = false;
  return true;
}

}  // namespace fl::server::engine
