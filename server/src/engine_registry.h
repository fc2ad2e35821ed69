// The round engine's client registry (loop-owned, server/src only): who is known, who has a live session, who is
// idle, and who holds a place, least recently heard first. Every change of a client's session or place goes
// through it, so that a session message finds its client in O(1) and the heartbeat check looks only at the
// silent front of the places (docs/round-engine.md, "Fleets and overload"). It knows nothing of tasks, rounds or
// records: the core decides, the registry keeps the indexes consistent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "fl/core/clock_sync.h"
#include "fl/proto/convert.h"
#include "fl/server/events.h"

namespace fl::server::engine {

// One client as the engine knows it, from its first Join until it is forgotten.
struct ClientInfo {
  std::string id;
  std::string token;
  std::string peer;         // gRPC's peer string of its last Join
  std::string cert_serial;  // its certificate's serial over mutual TLS (empty in plaintext)
  fl::v1::JoinRequest join;
  std::shared_ptr<SessionChannel> session;  // set and reset only by ClientRegistry (Attach/DetachSession)
  int64_t last_seen_ns = 0;
  std::string open_task;
  uint64_t server_seq = 0;
  // Clock sync: a ping goes out when the session opens and with every heartbeat; pongs feed the estimator.
  core::ClockOffsetEstimator clock;
  uint64_t next_ping_id = 0;
  std::map<uint64_t, int64_t> pings_in_flight;  // ping id -> t1 (server clock), the last few only
  // Its entry in the registry's places while it holds one (a live session, or admitted awaiting one).
  std::list<ClientInfo*>::iterator place;
  bool holds_place = false;
  // Link-aware compression: payload bytes / server-side time of its last finished upload (nullopt: none yet).
  std::optional<double> uplink_bytes_per_s;
  bool tasked = false;  // it was sent a task: it is in the round records, never forgotten (engine_clients.cc)
};

class ClientRegistry {
 public:
  using Clients = std::map<std::string, std::unique_ptr<ClientInfo>>;

  // Known clients by id (nullptr: unknown); At: one that must be known.
  ClientInfo* Find(const std::string& id) const;
  ClientInfo& At(const std::string& id) const { return *clients_.at(id); }
  // The client `id` if `token` is its session token (never an empty one).
  ClientInfo* Authenticate(const std::string& id, const std::string& token) const;
  // The client called `id`, made (with only its id set) if it is new.
  ClientInfo& FindOrAdd(const std::string& id);
  // Forgets `id`: it must hold no session and no place (the caller let them go).
  void Forget(const std::string& id);
  const Clients& all() const { return clients_; }
  size_t size() const { return clients_.size(); }

  // Sessions: `client`'s live session (replacing the one it had), none, and whose a channel is.
  void AttachSession(ClientInfo& client, std::shared_ptr<SessionChannel> channel);
  void DetachSession(ClientInfo& client);
  ClientInfo* ClientOfSession(const SessionChannel* channel) const;
  size_t connected() const { return by_session_.size(); }
  // Connected clients with no open task, in id order.
  std::vector<ClientInfo*> IdleConnected() const;

  // Places: `client` holds one (moved to the back: the most recently heard), heard at `seen_ns` (its last_seen_ns
  // never goes back); true when it did not hold one before. ReleasePlace: true when it held one.
  bool HoldPlace(ClientInfo& client, int64_t seen_ns);
  bool ReleasePlace(ClientInfo& client);
  size_t places_held() const { return places_.size(); }
  // The clients holding a place, least recently heard first.
  const std::list<ClientInfo*>& places() const { return places_; }

 private:
  Clients clients_;
  std::unordered_map<const SessionChannel*, ClientInfo*> by_session_;  // clients with a live session
  std::list<ClientInfo*> places_;
};

}  // namespace fl::server::engine
