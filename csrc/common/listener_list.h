// Callbacks registered by id: the one shape behind the communicator's abort and close listeners
// and the executor's point-to-point probes (the stream engine registers all three and removes
// them when it closes).
//
// Listeners run with the list's lock held, so remove() called from another thread waits until a
// listener running there has returned (an engine being destroyed cannot vanish under its own
// callback). The lock is recursive: a listener run by take_all_and_call may remove itself or add
// another; one run by for_each must leave the list alone (it is being iterated).
#pragma once

#include <mutex>
#include <utility>
#include <vector>

namespace commlib {

template <typename Fn>
class ListenerList {
 public:
  // Registers `fn`; returns its id (never 0).
  int add(Fn fn) {
    return add(std::move(fn), [](Fn&) {});
  }
  // Registers `fn`, then runs then(fn) under the same lock (e.g. to tell a late listener about an
  // event that already happened, without another event slipping in between).
  template <typename Then>
  int add(Fn fn, Then&& then) {
    std::lock_guard<std::recursive_mutex> lk(mu_);
    const int id = ++next_id_;
    items_.emplace_back(id, std::move(fn));
    then(items_.back().second);
    return id;
  }
  // Unregisters `id` (unknown ids are ignored); waits for a listener running on another thread.
  void remove(int id) {
    std::lock_guard<std::recursive_mutex> lk(mu_);
    for (auto it = items_.begin(); it != items_.end(); ++it)
      if (it->first == id) {
        items_.erase(it);
        return;
      }
  }
  // Calls visit(fn) for every listener in registration order (visit may throw: the lock is released).
  template <typename Visit>
  void for_each(Visit&& visit) {
    std::lock_guard<std::recursive_mutex> lk(mu_);
    for (auto& item : items_) visit(item.second);
  }
  // Unregisters every listener, then calls each once (a one-time event, e.g. close).
  template <typename... Args>
  void take_all_and_call(Args&&... args) {
    std::lock_guard<std::recursive_mutex> lk(mu_);
    auto items = std::move(items_);
    items_.clear();
    for (auto& item : items) item.second(args...);
  }

 private:
  std::recursive_mutex mu_;
  std::vector<std::pair<int, Fn>> items_;
  int next_id_ = 0;
};

}  // namespace commlib
