// The kernel path's grid beside the other ranks' (see kernel_occupancy.h).
#include "stream/kernel_occupancy.h"

#include "common/params.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <stdexcept>

namespace commlib {

namespace {

const char kHex[] = "0123456789abcdef";

std::string hex(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string unhex(const std::string& s) {
  std::string out;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    out += static_cast<char>(std::stoi(s.substr(i, 2), nullptr, 16));
  return out;
}

struct Parsed {
  unsigned device_blocks = 0, client_blocks = 0, sms = 0;
  std::string id;
};

Parsed parse(const std::string& f, size_t rank) {
  const size_t a = f.find('.'), b = a == std::string::npos ? a : f.find('.', a + 1),
               c = b == std::string::npos ? b : f.find('.', b + 1);
  if (c == std::string::npos || f.find_first_not_of("0123456789abcdef.") != std::string::npos)
    throw std::invalid_argument("kernel path: malformed residency of rank " + std::to_string(rank) + ": '" + f + "'");
  return Parsed{static_cast<unsigned>(std::stoul(f.substr(0, a))),
                static_cast<unsigned>(std::stoul(f.substr(a + 1, b - a - 1))),
                static_cast<unsigned>(std::stoul(f.substr(b + 1, c - b - 1))), unhex(f.substr(c + 1))};
}

}  // namespace

Device::Residency residency_of(const Device& d) {
  Device::Residency r = d.plan_residency();
  if (!r.mps_client) return r;
  // MPS: a client may use this percentage of the SMs' threads (its own setting, or the daemon's
  // default, which the launcher exports to the clients).
  const std::string mps = foreign_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
  const double pct = mps.empty() ? 0 : std::atof(mps.c_str());
  if (pct > 0 && pct < 100) {
    r.client_blocks = static_cast<unsigned>(r.device_blocks * pct / 100.0);
    r.why += ", " + mps + "% of them for this process (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)";
  }
  return r;
}

std::string residency_field(const Device& d) {
  const Device::Residency r = residency_of(d);
  return std::to_string(r.device_blocks) + "." + std::to_string(r.client_blocks) + "." +
         std::to_string(d.multiprocessors()) + "." + hex(d.physical_id());
}

GridBudget grid_budget(const std::vector<std::string>& fields, const std::vector<bool>& same_host, int rank,
                       unsigned max_grid) {
  std::vector<Parsed> all;
  for (size_t p = 0; p < fields.size(); ++p) all.push_back(parse(fields[p], p));
  std::map<std::string, unsigned> sharing;  // ranks of this host per physical device
  for (size_t p = 0; p < all.size(); ++p)
    if (same_host[p]) ++sharing[all[p].id];
  GridBudget mine;
  mine.one_sided = max_grid;
  for (size_t p = 0; p < all.size(); ++p) {
    if (!same_host[p]) continue;
    // The one-sided grid, the same on every rank: a block per SM at most (kMaxBlocks where the count
    // is unknown), within every rank's share of its device's resident blocks.
    mine.one_sided = std::min(mine.one_sided, all[p].sms ? all[p].sms : std::min(max_grid, 16u));
    if (all[p].device_blocks == 0) continue;  // no limit known there
    const unsigned n = sharing[all[p].id];
    const unsigned share = std::min(all[p].device_blocks / n, all[p].client_blocks);
    if (share) mine.one_sided = std::min(mine.one_sided, share);
    if (static_cast<int>(p) == rank) mine.blocks = share;
    if (share == 0 && mine.fits) {
      mine.fits = false;
      mine.why = "rank " + std::to_string(p) + "'s grid does not fit: " + all[p].id + " holds " +
                 std::to_string(all[p].device_blocks) + " resident block(s) of the kernel executor, " +
                 std::to_string(all[p].client_blocks) + " for its process, shared by " + std::to_string(n) +
                 " rank(s): none left for a block of each (every block of every rank sharing a device must be "
                 "resident at once)";
    }
  }
  return mine;
}

std::shared_ptr<LaunchChain> LaunchChain::of(Device& d) {
  static std::mutex mu;
  static auto* chains = new std::map<const Device*, std::weak_ptr<LaunchChain>>();
  std::lock_guard<std::mutex> lk(mu);
  std::shared_ptr<LaunchChain> c = (*chains)[&d].lock();
  if (!c) (*chains)[&d] = c = std::make_shared<LaunchChain>();
  return c;
}

void LaunchChain::join() {
  std::lock_guard<std::mutex> lk(mu_);
  ++engines_;
}

void LaunchChain::leave(const void* owner) {
  std::lock_guard<std::mutex> lk(mu_);
  --engines_;
  if (last_owner_ == owner) {
    last_owner_ = nullptr;
    last_.reset();
  }
}

void LaunchChain::run(Device& d, DeviceStream& stream, const void* owner, const std::shared_ptr<DeviceEvent>& mine,
                      const std::function<void()>& launch) {
  std::lock_guard<std::mutex> lk(mu_);
  if (engines_ <= 1) return launch();
  if (last_ && last_owner_ != owner) d.wait_event(stream, *last_);
  launch();
  d.record(*mine, stream);
  last_ = mine;
  last_owner_ = owner;
}

}  // namespace commlib
