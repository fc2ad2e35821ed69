// Addresses of an islands experiment: the host the coordinator and each island bind and advertise (what their
// peers dial, and what the coordinator's certificate names), and the check that no process advertises a loopback
// address to peers that run on another node or network namespace, where 127.0.0.1 is somebody else.
// Shared by the local launcher (islands_experiment.h: everything on this machine, 127.0.0.1 by default) and the
// Slurm launcher (islands_slurm.h: each process advertises its node's address).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace fl::experiment {

// 127.0.0.0/8, "localhost" (and *.localhost), ::1 and 0.0.0.0 (which names no host a peer could dial).
bool IsLoopbackHost(std::string_view host);

// An IPv4 literal (a.b.c.d, each 0..255).
bool IsIpv4Literal(std::string_view host);

// A host a process can advertise: an IPv4 literal or a DNS name (letters, digits, '-', '.'), no port, no
// wildcard. `who` names the process for the error ("the coordinator", "island-1").
absl::Status CheckAdvertisableHost(std::string_view who, std::string_view host);

// A free TCP port on `host` (an address of this machine): bound and released, so the usual race with
// whoever binds next applies. Errors name the host and say it must be one of this machine's addresses.
absl::StatusOr<int> FreePortOn(const std::string& host);

// Where one process of the experiment runs and what it advertises.
struct ProcessPlacement {
  std::string name;  // "coordinator", "island-0", ...
  std::string node;  // the node (or network namespace) it runs on
  std::string host;  // the address it advertises
};

// Refuses a process that advertises a loopback address while another process of the experiment runs on
// another node: its peers there would dial themselves. The error names the process, its address and node,
// the peers elsewhere, and what to do.
absl::Status CheckPeersCanReach(const std::vector<ProcessPlacement>& placements);

}  // namespace fl::experiment
