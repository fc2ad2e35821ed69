#include "fl/rpc/event_loop.h"

#include <climits>
#include <vector>

namespace fl::rpc {

TimerId TimerQueue::At(int64_t when_ns, std::function<void()> fn) {
  const TimerId id = next_id_++;
  timers_.emplace(std::make_pair(when_ns, id), std::move(fn));
  due_.emplace(id, when_ns);
  return id;
}

bool TimerQueue::Cancel(TimerId id) {
  auto it = due_.find(id);
  if (it == due_.end()) return false;
  timers_.erase({it->second, id});
  due_.erase(it);
  return true;
}

int64_t TimerQueue::NextDueNs() const { return timers_.empty() ? INT64_MAX : timers_.begin()->first.first; }

size_t TimerQueue::RunDue(int64_t now_ns) {
  size_t ran = 0;
  while (!timers_.empty() && timers_.begin()->first.first <= now_ns) {
    auto node = timers_.extract(timers_.begin());
    due_.erase(node.key().second);
    node.mapped()();  // may set or cancel timers
    ++ran;
  }
  return ran;
}

}  // namespace fl::rpc
