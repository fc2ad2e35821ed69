#include "fl/sys/process_group.h"

#include <signal.h>

#include <algorithm>
#include <utility>

namespace fl::sys {

ProcessGroup::~ProcessGroup() { StopAll("", std::chrono::seconds(5)); }

absl::StatusOr<pid_t> ProcessGroup::Start(const std::string& name, const std::vector<std::string>& argv,
                                          const std::string& log_path) {
  SpawnOptions o;
  o.argv = argv;
  o.stdin_from = Stdio::Null();
  o.stdout_to = Stdio::File(log_path, /*append_to_it=*/true);
  o.stderr_to = Stdio::ToStdout();
  return Start(name, std::move(o));
}

absl::StatusOr<pid_t> ProcessGroup::Start(const std::string& name, SpawnOptions options) {
  options.name = name;
  absl::StatusOr<Child> child = Child::Spawn(options);
  if (!child.ok()) return child.status();
  const pid_t pid = child->pid();
  children_.push_back(Entry{std::move(*child), false});
  return pid;
}

ChildExit ProcessGroup::Report(Entry& e) {
  e.reported = true;
  const ExitStatus& s = *e.child.exit_status();
  return ChildExit{e.child.name(), s.code, s.signaled(), s};
}

std::optional<ChildExit> ProcessGroup::WaitAny(std::chrono::milliseconds timeout) {
  // One reaped earlier (by StopAll of a stage) and not reported yet comes first.
  for (Entry& e : children_) {
    if (!e.reported && e.child.exit_status().has_value()) return Report(e);
  }
  std::vector<Child*> all;
  for (Entry& e : children_) all.push_back(&e.child);
  const std::optional<size_t> i = fl::sys::WaitAny(all, timeout);
  if (!i.has_value()) return std::nullopt;
  return Report(children_[*i]);
}

bool ProcessGroup::Running(const std::string& name) const {
  return std::any_of(children_.begin(), children_.end(),
                     [&](const Entry& e) { return e.child.name() == name && !e.child.exited(); });
}

size_t ProcessGroup::num_running() const {
  return static_cast<size_t>(
      std::count_if(children_.begin(), children_.end(), [](const Entry& e) { return e.child.running(); }));
}

void ProcessGroup::Signal(const std::string& name, int sig) {
  for (Entry& e : children_) {
    if (e.child.name() == name && e.child.running()) (void)e.child.Signal(sig);
  }
}

std::vector<ChildExit> ProcessGroup::StopAll(const std::string& first, std::chrono::milliseconds grace) {
  return StopAll(first.empty() ? std::vector<std::string>{} : std::vector<std::string>{first}, grace);
}

std::vector<ChildExit> ProcessGroup::StopAll(const std::vector<std::string>& order, std::chrono::milliseconds grace) {
  std::vector<ChildExit> exits;
  for (const std::string& name : order) {
    std::vector<Child*> stage;
    for (Entry& e : children_) {
      if (e.child.name() == name) stage.push_back(&e.child);
    }
    StopTogether(stage, grace);
    for (Entry& e : children_) {
      if (e.child.name() == name && !e.reported && e.child.exit_status().has_value()) exits.push_back(Report(e));
    }
  }
  std::vector<Child*> rest;
  for (Entry& e : children_) rest.push_back(&e.child);
  StopTogether(rest, grace);
  for (Entry& e : children_) {
    if (!e.reported && e.child.exit_status().has_value()) exits.push_back(Report(e));
  }
  return exits;
}

}  // namespace fl::sys
