// The round engine's defences against one hostile peer (engine_peers.cc, docs/security.md "Abuse limits"): the
// state both engine_clients.cc (places held and released) and engine_peers.cc use. Private to server/src.
#pragma once

#include <cstdint>
#include <list>
#include <unordered_map>

#include "engine_internal.h"
#include "peer_guard.h"

namespace fl::server {

// What one hostile peer could otherwise grow without bound (docs/security.md, "Abuse limits"): the security_events
// rows of its refusals, and the clients it joins under ever new names and abandons.
struct RoundEngine::Core::PeersState {
  RefusalRows refusal_rows;
  // Clients that never had a task and hold no place, in the order they became idle (the oldest is forgotten
  // first past EngineConfig::max_idle_newcomers), and where each is in that list.
  std::list<ClientInfo*> idle_newcomers;
  std::unordered_map<const ClientInfo*, std::list<ClientInfo*>::iterator> idle_position;
  uint64_t forgotten = 0;  // idle newcomers forgotten so far
};

}  // namespace fl::server
