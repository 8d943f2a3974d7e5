// SharedFlags over the shared-memory region's control blocks (transport.h): each rank's slot and
// flag-call counter live in its RankCtl (shm_layout.h), on cache lines of their own, so readers
// polling one rank's slot do not bounce the lines its doorbell and counter sit on.
#include <cstring>

#include "transport/shm/shm.h"
#include "transport/shm/shm_layout.h"

namespace commlib {

class ShmFlags final : public SharedFlags {
 public:
  explicit ShmFlags(ShmTransport& t) : t_(t) {}

  size_t max_bytes() const override { return kFlagSlotBytes; }
  int slots() const override { return kFlagSlots; }

  // The stores of a counter or slot and the loads of the peers' flags_waiting are seq_cst, as are
  // set_waiting's store and the waiter's loads of counters and slots after it (completed, holds):
  // one of the two sides sees the other, by the letter of C++'s model (a store-load pair on each
  // side needs seq_cst on all four; acquire loads would do on x86 and ARMv8 only). A seq_cst load
  // is the same instruction as an acquire load on both (mov; ldar), so the loads cost nothing; the
  // slot's seq_cst store is one xchg more per broadcast on the root.
  uint64_t completed(int rank) const override {
    return t_.ctl(rank).flags_completed.load(std::memory_order_seq_cst);
  }

  void complete(uint64_t n, int wake) override {
    t_.ctl(t_.rank_).flags_completed.store(n, std::memory_order_seq_cst);
    if (wake == kWakeNone) return;
    if (wake >= 0) {
      ring_if_waiting(wake);
      return;
    }
    for (int r = 0; r < t_.size_; ++r)
      if (r != t_.rank_) ring_if_waiting(r);
  }

  void write(int index, uint64_t n, const CallDesc& desc, const void* src, size_t bytes) override {
    auto& s = t_.ctl(t_.rank_).flag_slots[index];
    if (bytes) std::memcpy(s.data, src, bytes);
    s.bytes = bytes;
    s.desc = desc;
    // The data and its description first; seq_cst (not release) because a reader that set its
    // waiting flag loads `written` after it: the Dekker pair below needs this store in the order too.
    s.written.store(n, std::memory_order_seq_cst);
    complete(n, kWakeAll);
  }

  bool holds(int root, int index, uint64_t n) const override {
    return t_.ctl(root).flag_slots[index].written.load(std::memory_order_seq_cst) == n;
  }

  const char* slot(int root, int index, CallDesc* desc, size_t* bytes) const override {
    const auto& s = t_.ctl(root).flag_slots[index];
    *desc = s.desc;
    *bytes = s.bytes;
    return s.data;
  }

  size_t stream_bytes() const override { return t_.stream_bytes_; }
  char* stream(int root) const override { return t_.stream_data(root); }

  // seq_cst for the same Dekker pairing as the slots: a position's store, then the look at the
  // waiting flags; a waiter's flag, then its look at the position.
  uint64_t produced(int root) const override {
    return t_.stream_produced(root).load(std::memory_order_seq_cst);
  }

  void produce(uint64_t position) override {
    t_.stream_produced(t_.rank_).store(position, std::memory_order_seq_cst);
    for (int r = 0; r < t_.size_; ++r)
      if (r != t_.rank_) ring_if_waiting(r);
  }

  uint64_t consumed(int reader) const override {
    return t_.stream_consumed(t_.rank_, reader).load(std::memory_order_seq_cst);
  }

  void consume(int root, uint64_t position) override {
    t_.stream_consumed(root, t_.rank_).store(position, std::memory_order_seq_cst);
    ring_if_waiting(root);
  }

  void set_waiting(bool on) override {
    auto& w = t_.ctl(t_.rank_).flags_waiting;
    if (on)
      w.store(1, std::memory_order_seq_cst);
    else
      w.store(0, std::memory_order_relaxed);
  }

 private:
  void ring_if_waiting(int r) {
    if (t_.ctl(r).flags_waiting.load(std::memory_order_seq_cst)) t_.ring(r);
  }

  ShmTransport& t_;
};

std::unique_ptr<SharedFlags> make_shm_flags(ShmTransport& t) { return std::make_unique<ShmFlags>(t); }

}  // namespace commlib
