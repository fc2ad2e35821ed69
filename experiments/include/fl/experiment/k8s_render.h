// fl-experiment render --launcher kubernetes: the Kubernetes objects that run an experiment manifest on a
// cluster (docs/cluster.md "Kubernetes, rendered"), written as YAML files for `kubectl apply -f DIR`.
//
// The server is a StatefulSet of one pod with a PersistentVolumeClaim for the records database and checkpoints,
// a Service (gRPC and metrics ports) and Prometheus scrape annotations; each client group is an Indexed Job whose
// completion index is the process's offset in the group, so that every fl-client gets the name, shard and flags
// a local run gives it (the runner's own PlanClientProcesses / ClientProcessArgs); the manifest and the link
// profiles are a ConfigMap, the certificates Secrets. Link emulation runs as the userspace relay (fl-link relay)
// inside each client's container: a pod cannot make network namespaces without privileges.
//
// Deterministic: the same manifest and options give the same bytes (keys sorted, no timestamps), except the
// Secrets' certificates, which are made fresh when the CA is a throwaway one.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "fl/experiment/manifest.h"

namespace fl::experiment {

// How long a client pod's fl-client tries to reach fl-server before it exits with an error (and its pod restarts):
// on a cluster the server's pod may still be pulling its image when the clients start.
inline constexpr uint32_t kK8sClientGiveUpS = 600;

struct K8sRenderOptions {
  // "" = the manifest's launcher.image, launcher.namespace, launcher.storage (each with its default there).
  std::string image;
  std::string k8s_namespace;
  std::string storage;
  std::string software_version;  // the default image's tag: fl-testbed:<version>
  // Certificates: `pki_dir` (fl-provision's layout) when given, else the manifest's security.pki_dir, else a
  // throwaway CA made in <out_dir>/pki. Its server certificate must name the Service (K8sServerDnsNames).
  std::string pki_dir;
  std::filesystem::path out_dir;
};

struct K8sRendering {
  // File name (one per object kind: configmap.yaml, job.yaml, ...) and its YAML, in name order.
  std::vector<std::pair<std::string, std::string>> files;
  std::string pki_source;  // which certificates the Secrets hold, for the user ("" with security.mode insecure)
};

// The names fl-server's certificate must carry for clients to reach it through the Service: <svc>, <svc>.<ns>,
// <svc>.<ns>.svc, <svc>.<ns>.svc.cluster.local.
std::vector<std::string> K8sServerDnsNames(const Manifest& manifest, const std::string& k8s_namespace);

// Renders the objects (making the throwaway CA in <out_dir>/pki where one is needed). InvalidArgument or
// FailedPrecondition naming what the renderer cannot express and why (a kernel or packet link backend, files on
// this machine that a pod cannot read, names Kubernetes refuses, a Secret over Kubernetes' 1 MiB).
absl::StatusOr<K8sRendering> RenderKubernetes(const Manifest& manifest, const K8sRenderOptions& options);

// Writes each file of `rendering` into `dir` (created if missing).
absl::Status WriteKubernetes(const K8sRendering& rendering, const std::filesystem::path& dir);

// A JSON document as block YAML, keys in the JSON's (sorted) order; strings quoted where plain YAML would read
// them as something else, multi-line strings as literal blocks. Exposed for its test.
std::string JsonToYaml(const std::string& json);

}  // namespace fl::experiment
