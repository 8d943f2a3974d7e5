// A first-in first-out queue on one array that grows and never shrinks, for the device hot path's
// per-call queues (issue #37, item 2: the engine's calls in flight and waits, the bindings' held
// buffers). std::deque allocates a block every few push_backs and frees one behind pop_front, so a
// steady run of calls allocated every few calls; this queue allocates only when it grows past its
// largest size so far (doubling), never in a steady state. pop_front resets the slot (a held
// reference goes at once, as with deque).
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

namespace commlib {

template <class T>
class RingQueue {
 public:
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }
  T& back() { return (*this)[size_ - 1]; }
  T& operator[](size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const T& operator[](size_t i) const { return slots_[(head_ + i) % slots_.size()]; }

  void push_back(T v) {
    if (size_ == slots_.size()) grow();
    (*this)[size_++] = std::move(v);
  }
  void pop_front() {
    slots_[head_] = T();
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }
  void clear() {
    while (!empty()) pop_front();
  }

  // Oldest first, for range-for (the queue must not change meanwhile).
  template <class Q, class R>
  class Iter {
   public:
    Iter(Q* q, size_t i) : q_(q), i_(i) {}
    R& operator*() const { return (*q_)[i_]; }
    R* operator->() const { return &(*q_)[i_]; }
    Iter& operator++() {
      ++i_;
      return *this;
    }
    bool operator!=(const Iter& o) const { return i_ != o.i_; }

   private:
    Q* q_;
    size_t i_;
  };
  Iter<RingQueue, T> begin() { return {this, 0}; }
  Iter<RingQueue, T> end() { return {this, size_}; }
  Iter<const RingQueue, const T> begin() const { return {this, 0}; }
  Iter<const RingQueue, const T> end() const { return {this, size_}; }

 private:
  void grow() {
    std::vector<T> bigger(slots_.empty() ? 16 : 2 * slots_.size());
    for (size_t i = 0; i < size_; ++i) bigger[i] = std::move((*this)[i]);
    slots_ = std::move(bigger);
    head_ = 0;
  }

  std::vector<T> slots_;
  size_t head_ = 0, size_ = 0;
};

}  // namespace commlib
