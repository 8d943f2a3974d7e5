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

  uint64_t completed(int rank) const override {
    return t_.ctl(rank).flags_completed.load(std::memory_order_acquire);
  }

  void complete(uint64_t n, int wake) override {
    t_.ctl(t_.rank_).flags_completed.store(n, std::memory_order_release);
    if (wake >= 0) {
      t_.ring(wake);
      return;
    }
    for (int r = 0; r < t_.size_; ++r)
      if (r != t_.rank_) t_.ring(r);
  }

  void write(int index, uint64_t n, const CallDesc& desc, const void* src, size_t bytes) override {
    auto& s = t_.ctl(t_.rank_).flag_slots[index];
    if (bytes) std::memcpy(s.data, src, bytes);
    s.bytes = bytes;
    s.desc = desc;
    s.written.store(n, std::memory_order_release);  // the data and its description first
    complete(n, -1);
  }

  int find(int root, uint64_t n) const override {
    const auto& slots = t_.ctl(root).flag_slots;
    for (int i = 0; i < kFlagSlots; ++i)
      if (slots[i].written.load(std::memory_order_acquire) == n) return i;
    return -1;
  }

  const char* slot(int root, int index, CallDesc* desc, size_t* bytes) const override {
    const auto& s = t_.ctl(root).flag_slots[index];
    *desc = s.desc;
    *bytes = s.bytes;
    return s.data;
  }

 private:
  ShmTransport& t_;
};

std::unique_ptr<SharedFlags> make_shm_flags(ShmTransport& t) { return std::make_unique<ShmFlags>(t); }

}  // namespace commlib
