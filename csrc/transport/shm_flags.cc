// SharedFlags over the shared-memory region's control blocks (transport.h): each rank's slot and
// flag-call counter live in its RankCtl (shm_layout.h), on cache lines of their own, so readers
// polling one rank's slot do not bounce the lines its doorbell and counter sit on.
#include <cstring>

#include "transport/shm.h"
#include "transport/shm_layout.h"

namespace commlib {

class ShmFlags final : public SharedFlags {
 public:
  explicit ShmFlags(ShmTransport& t) : t_(t) {}

  size_t max_bytes() const override { return kFlagSlotBytes; }

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

  void write(uint64_t n, const CallDesc& desc, const void* src, size_t bytes) override {
    ShmTransport::RankCtl& me = t_.ctl(t_.rank_);
    if (bytes) std::memcpy(me.flag_data, src, bytes);
    me.flag_bytes = bytes;
    me.flag_desc = desc;
    me.flag_written.store(n, std::memory_order_release);  // the data and its description first
    complete(n, -1);
  }

  uint64_t written(int root) const override { return t_.ctl(root).flag_written.load(std::memory_order_acquire); }

  const char* slot(int root, CallDesc* desc, size_t* bytes) const override {
    const ShmTransport::RankCtl& c = t_.ctl(root);
    *desc = c.flag_desc;
    *bytes = c.flag_bytes;
    return c.flag_data;
  }

 private:
  ShmTransport& t_;
};

std::unique_ptr<SharedFlags> make_shm_flags(ShmTransport& t) { return std::make_unique<ShmFlags>(t); }

}  // namespace commlib
