// The kernel path's grid beside the other ranks' (see kernel_occupancy.h).
#include "stream/kernel_occupancy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <stdexcept>

#include "common/params.h"

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
  unsigned device_blocks = 0, client_blocks = 0, sms = 0, max_launch = 0;
  int32_t pid = 0;
  uint64_t nonce = 0;
  unsigned percent = 100;  // COMMLIB_DEVICE_GRID_PERCENT of the rank
  std::string id;
};

Parsed parse(const std::string& f, size_t rank) {
  std::vector<std::string> parts;
  for (size_t at = 0, c = 0; c != std::string::npos; at = c + 1) parts.push_back(f.substr(at, (c = f.find('.', at)) - at));
  if (parts.size() != 8 || f.find_first_not_of("0123456789abcdef.") != std::string::npos)
    throw std::invalid_argument("kernel path: malformed residency of rank " + std::to_string(rank) + ": '" + f + "'");
  auto u = [&](int i) { return static_cast<unsigned>(std::stoul(parts[i])); };
  return Parsed{u(0), u(1), u(2), u(3), static_cast<int32_t>(std::stol(parts[4])), std::stoull(parts[5], nullptr, 16),
                u(6), unhex(parts[7])};
}

std::vector<Parsed> parse_all(const std::vector<std::string>& fields) {
  std::vector<Parsed> all;
  for (size_t p = 0; p < fields.size(); ++p) all.push_back(parse(fields[p], p));
  // The cap is the communicator's: one value, checked like COMMLIB_DEVICE_PATH (every rank must agree,
  // else the first rank to reach a device's ledger would decide with its own).
  for (size_t p = 1; p < all.size(); ++p)
    if (all[p].percent != all[0].percent)
      throw std::invalid_argument("COMMLIB_DEVICE_GRID_PERCENT: rank 0 uses " + std::to_string(all[0].percent) +
                                  ", rank " + std::to_string(p) + " " + std::to_string(all[p].percent) +
                                  "; every rank must use the same");
  return all;
}

// The most blocks one of `n` ranks of this communicator on the device of `r` may take: the
// device's blocks divided among them, the process's MPS share, and the communicator's cap
// (COMMLIB_DEVICE_GRID_PERCENT of the device's blocks for all of its ranks there together).
unsigned rank_share(const Parsed& r, unsigned n) {
  const unsigned capped = static_cast<unsigned>(uint64_t{r.device_blocks} * r.percent / 100);
  return std::min({r.device_blocks / n, r.client_blocks, capped / n});
}

// A cap that leaves a rank no block refuses the kernel path whatever COMMLIB_DEVICE_PATH says: it
// is a setting to change, not a limit of the machine that auto should route around.
void check_cap(const Parsed& r, unsigned n) {
  const unsigned capped = static_cast<unsigned>(uint64_t{r.device_blocks} * r.percent / 100);
  if (capped / n || r.device_blocks / n == 0) return;  // (a device too small even uncapped: grid_budget's why)
  throw std::invalid_argument(
      "COMMLIB_DEVICE_GRID_PERCENT=" + std::to_string(r.percent) + " caps this communicator at " +
      std::to_string(capped) + " of the " + std::to_string(r.device_blocks) + " resident block(s) of " + r.id +
      ", less than one block for each of its " + std::to_string(n) +
      " rank(s) there (every block of every rank must be resident at once): raise it to at least " +
      std::to_string((100 * n + r.device_blocks - 1) / r.device_blocks) + " or leave it unset (100)");
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

std::string residency_field(const Device& d, unsigned max_launch, uint64_t nonce, unsigned grid_percent) {
  const Device::Residency r = residency_of(d);
  char n[17];
  std::snprintf(n, sizeof n, "%016llx", static_cast<unsigned long long>(nonce));
  return std::to_string(r.device_blocks) + "." + std::to_string(r.client_blocks) + "." +
         std::to_string(d.multiprocessors()) + "." + std::to_string(max_launch) + "." + std::to_string(getpid()) + "." +
         n + "." + std::to_string(grid_percent) + "." + hex(d.physical_id());
}

GridBudget grid_budget(const std::vector<std::string>& fields, const std::vector<bool>& same_host, int rank,
                       unsigned max_grid) {
  const std::vector<Parsed> all = parse_all(fields);
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
    check_cap(all[p], n);
    const unsigned share = rank_share(all[p], n);
    if (share) mine.one_sided = std::min(mine.one_sided, share);
    if (static_cast<int>(p) == rank) mine.blocks = share;
    if (share == 0 && mine.fits) {
      mine.fits = false;
      mine.why = "rank " + std::to_string(p) + "'s grid does not fit: " + all[p].id + " holds " +
                 std::to_string(all[p].device_blocks) + " resident block(s) of the kernel executor, " +
                 std::to_string(all[p].client_blocks) + " for its process" +
                 (all[p].client_blocks < all[p].device_blocks ? " (its MPS share: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE)" : "") +
                 ", shared by " + std::to_string(n) +
                 " rank(s): none left for a block of each (every block of every rank sharing a device must be "
                 "resident at once)";
    }
  }
  return mine;
}

void claim_grid(const std::vector<std::string>& fields, const std::vector<bool>& same_host, int rank,
                GridBudget& budget, GridClaims& claims) {
  if (!budget.fits) return;
  const std::vector<Parsed> all = parse_all(fields);
  // Every device of this host's ranks with a known limit, in the order its first rank comes:
  // every rank claims on every one (the same requests everywhere, so the same grants).
  std::map<std::string, std::vector<size_t>> on;
  std::vector<std::string> order;
  for (size_t p = 0; p < all.size(); ++p) {
    if (!same_host[p] || all[p].device_blocks == 0) continue;
    if (on[all[p].id].empty()) order.push_back(all[p].id);
    on[all[p].id].push_back(p);
  }
  for (const std::string& id : order) {
    const std::vector<size_t>& ranks = on[id];
    const Parsed& first = all[ranks.front()];
    const unsigned n = static_cast<unsigned>(ranks.size());
    unsigned use = 0;  // the most a launch of its ranks takes
    for (size_t p : ranks) use = std::max(use, all[p].max_launch);
    GridClaimRequest r;
    r.device = id;
    r.capacity = first.device_blocks;
    r.comm = all.front().nonce;
    r.per_rank = std::min(rank_share(first, n), use ? use : first.device_blocks);
    for (size_t p : ranks) r.pids.push_back(all[p].pid);
    GridGrant g;
    try {
      g = claims.claim(r);
    } catch (const std::runtime_error& e) {  // no ledger (/dev/shm unwritable, a name taken): no budget to hold
      claims.release_granted();  // what earlier devices granted goes back (see below)
      budget.fits = false;
      budget.why = "the device-wide grid budget of " + id + " cannot be kept (" + e.what() +
                   "): without it, communicators in other processes on the device could deadlock this one's kernels";
      return;
    }
    if (std::find(ranks.begin(), ranks.end(), static_cast<size_t>(rank)) != ranks.end())
      budget.blocks = std::min(budget.blocks ? budget.blocks : g.per_rank, g.per_rank);
    if (g.per_rank) {
      budget.one_sided = std::min(budget.one_sided, g.per_rank);
      continue;
    }
    // Refused here: the blocks earlier devices granted go back now, not at the engine's close (auto
    // runs on the copy path meanwhile, and another job could use them). The refusal itself (an
    // entry of 0 blocks) stays held until then, so every later rank of the communicator reaching
    // this device finds it and refuses alike; a later rank reaching a released device claims
    // there again and releases it again when it meets the refusal.
    claims.release_granted();
    budget.fits = false;
    budget.why = "the grids of rank(s) on " + id + " do not fit beside the other communicators' kernels there: it holds " +
                 std::to_string(first.device_blocks) + " resident block(s) of the kernel executor, " +
                 std::to_string(g.claimed_by_others) + " of them claimed by " + std::to_string(g.others) +
                 " other communicator(s) (the device-wide grid budget, /dev/shm/" + grid_claims_ledger(id) +
                 "), none left for a block of each of this communicator's " + std::to_string(n) +
                 " rank(s) there (every block of every kernel spinning on a device must be resident at once)";
    return;
  }
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
