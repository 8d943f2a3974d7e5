// The kernel path's one-sided plans (kernels/one_sided_plan.h, run by kernels/plan_one_sided.cuh):
// their flags and counts in the kernel region, the staged path through the slots area, the grid.
//
// The mapped path. A buffer some rank's plan reads or writes at a peer must be mapped on every
// rank. Where every rank registered its input and output of the call (PeerBuffers::agree, the
// same answer on every rank: StreamEngine::agree_route), the launch takes the call's table of the
// peers' buffers (mapped_table) and reads and writes them in place. Otherwise the staged path.
//
// The staged path. Such buffers are staged through this rank's staging arena (eager calls,
// COMMLIB_DEVICE_STAGING=pool: kernel_path_arena.cc, no slots and no closing handshake) or
// through this rank's slots area (the inbox of the message plans: exported to every peer when the
// engines connect, COMMLIB_DEVICE_SLOTS x COMMLIB_DEVICE_SLOT_BYTES per peer): the kernel copies
// the caller's input in before its first signal and the staged output out after its last wait.
// An all_reduce whose input and output are both addressed at peers (mapped_two_shot,
// mapped_fused_two_shot) is staged in place (one area, the schedule's in-place form, which the verifier proves as well), so the call
// needs N bytes of slots, not 2N. The slots area is also where peers' message plans send chunks:
// a staged launch therefore ends with one more handshake per block with every peer (tag
// kSignalTags, the kernel's own), so no rank starts its next launch, and sends into a peer's
// slots, before every rank's staged launch is over. Message plans leave every chunk consumed at
// their end, so a staged launch never overwrites a chunk in flight.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "common/shapes.h"
#include "kernels/plan_kernel.cuh"
#include "schedule/registry.h"
#include "stream/kernel_path.h"

namespace commlib {

namespace {

constexpr size_t kLine = 64;
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// The buffers (BufferId bits) any rank's schedule of this call addresses at a peer.
uint8_t peer_visible_buffers(const ScheduleKey& key, int size) {
  const Collective coll = static_cast<Collective>(key.coll);
  const std::string name = algorithm_name(coll, key.algo);
  uint8_t bits = 0;
  for (int r = 0; r < size; ++r) {
    const Schedule s = build_schedule(CollArgs{coll, r, size, key.count, key.root}, name);
    for (const Step& st : s.steps)
      for (const Op& o : st.ops) {
        // reduce_to_all: every rank's src and dst; reduce_from_all: every rank's src
        if (o.kind == OpKind::Get || o.kind == OpKind::GetReduce || reads_every_rank(o.kind))
          bits |= static_cast<uint8_t>(1u << static_cast<int>(o.src.buf));
        if (o.kind == OpKind::Put || o.kind == OpKind::ReduceToAll)
          bits |= static_cast<uint8_t>(1u << static_cast<int>(o.dst.buf));
      }
  }
  return bits;
}

}  // namespace

size_t KernelPath::os_flags_offset() const {
  return round_up(descs_offset() + static_cast<size_t>(size_) * desc_ring_len() * kexec::kDescWords * 8, kLine);
}
size_t KernelPath::os_flag_words() const { return static_cast<size_t>(size_) * (kplan::kSignalTags + 1) * kexec::kMaxGrid; }
// sent | received | checked (size words each) | barrier (a line) | peer views | LL stages (one per
// block) | one-sided signalled | consumed
size_t KernelPath::os_local_offset() const {
  return views_offset() + round_up(size_ * sizeof(kexec::PeerView), kLine) + round_up(kexec::kMaxBlocks * ll_bytes_, kLine);
}
size_t KernelPath::local_bytes() const { return os_local_offset() + 2 * os_flag_words() * 8; }

// The staged path's capacity: the slots area, as StagedPeerBuffers maps it (connect) and as
// stage_layout's fit is judged, so that every staged call judged to fit has its peers' addresses.
size_t KernelPath::staging_capacity() const { return slots_bytes(); }

void KernelPath::check_one_sided(const ScheduleKey& key) const {
  auto it = plans_.find(key);
  Uploaded mine;
  const Uploaded* u = it != plans_.end() ? &it->second : &mine;
  if (u == &mine) stage_layout(key, mine);
  if (!u->stage_fits) {  // the same on every rank: the one-sided algorithms' shapes are symmetric
    const std::string name = algorithm_name(static_cast<Collective>(key.coll), key.algo);
    throw std::invalid_argument(
        "count: " + std::to_string(key.count) + " elements of " + std::to_string(key.elem_bytes) + " bytes with algorithm " +
        name + " needs " + std::to_string(u->stage_need) + " bytes of staging, the slots area holds " +
        std::to_string(staging_capacity()) + " (COMMLIB_DEVICE_SLOTS x COMMLIB_DEVICE_SLOT_BYTES per peer): " + name +
        " reads peers' buffers in place, and buffers not registered on every rank are staged there; use buffers "
        "every rank can map (commlib.device.empty, cudaMalloc'd tensors), a larger COMMLIB_DEVICE_SLOT_BYTES or "
        "COMMLIB_DEVICE_STAGING=pool (the staging arena, grown to any call; a graph capture stages there once an "
        "eager call of the same shape on buffers some rank cannot map ran since the arena last grew)");
  }
}

void KernelPath::stage_layout(const ScheduleKey& key, Uploaded& u) const {
  const Collective coll = static_cast<Collective>(key.coll);
  const std::string name = algorithm_name(coll, key.algo);
  u.peer_bufs = size_ > 1 ? peer_visible_buffers(key, size_) : 0;
  const uint8_t in_bit = 1u << static_cast<int>(BufferId::Input), out_bit = 1u << static_cast<int>(BufferId::Output);
  if (u.peer_bufs & ~(in_bit | out_bit))
    throw std::invalid_argument("algorithm: " + name + " reads peers' scratch, which no rank maps");
  const BufferShapes shapes = buffer_shapes(coll, key.count, size_, rank_, key.root);
  const uint64_t e = key.elem_bytes;
  const uint64_t in_bytes = static_cast<uint64_t>(std::max<int64_t>(shapes.input, 0)) * e,
                 out_bytes = static_cast<uint64_t>(std::max<int64_t>(shapes.output, 0)) * e;
  u.stage_in_place = coll == Collective::AllReduce && (u.peer_bufs & in_bit) && (u.peer_bufs & out_bit);
  u.stage_bytes[0] = (u.peer_bufs & in_bit) ? in_bytes : 0;
  u.stage_bytes[1] = (u.peer_bufs & out_bit) ? out_bytes : 0;
  // The staged buffers' offsets in the slots area: input at 0, output after it (or at 0 in place).
  u.stage_out_at = u.stage_in_place ? 0 : round_up(u.stage_bytes[0], kStageAlign);
  // (An output never read at a peer is not staged: the need ends with the input, unaligned.) The
  // rule is device auto's too (policy/device_cost.h), which judges the fit before choosing.
  u.stage_need = staged_bytes_need(coll, u.peer_bufs & in_bit, u.peer_bufs & out_bit, in_bytes, out_bytes, kStageAlign);
  u.stage_fits = u.stage_need <= staging_capacity();  // else only the mapped path runs it (check_one_sided)
}

void KernelPath::plan_one_sided(const ScheduleKey& key, Uploaded& u, std::vector<char>& host) const {
  const DevicePlan& p = u.plan;
  const Collective coll = static_cast<Collective>(key.coll);
  const uint64_t e = key.elem_bytes;
  stage_layout(key, u);
  const uint8_t in_bit = 1u << static_cast<int>(BufferId::Input), out_bit = 1u << static_cast<int>(BufferId::Output);
  // The grid: at least block_bytes_ per block per handshake, at most a block per SM within every
  // rank's share of the resident blocks (one_sided_grid_, kernel_occupancy.h): the same on every
  // rank, since the flags are per block and a block's share of an item is a function of the grid.
  // An all_reduce moves a 1/size block per handshake (two-shot), the others a `count` block.
  const uint64_t per_handshake = coll == Collective::AllReduce ? key.count * e / size_ : key.count * e;
  const uint64_t want = std::max<uint64_t>(1, per_handshake / std::max<uint64_t>(block_bytes_, 1));
  u.os_grid = static_cast<unsigned>(std::min<uint64_t>(want, one_sided_grid_));
  // Upload image: items | steps | sends_to | recvs_from (as a message plan's: the descriptor check
  // reads the counts) | the peers' table [size][3].
  const size_t items = p.items.size() * sizeof(kplan::PlanItem), steps = p.steps.size() * sizeof(kplan::PlanStep),
               counts = size_ * sizeof(uint32_t);
  u.table_at = round_up(items + steps + 2 * counts, 8);
  host.assign(u.table_at + static_cast<size_t>(size_) * 3 * 8, 0);
  std::memcpy(host.data(), p.items.data(), items);
  std::memcpy(host.data() + items, p.steps.data(), steps);
  std::memcpy(host.data() + items + steps, p.sends_to.data(), counts);
  std::memcpy(host.data() + items + steps + counts, p.recvs_from.data(), counts);
  if (!u.peer_bufs || !u.stage_fits) return;  // (no staged table: only mapped calls of this shape run)
  if (!staged_peers_) throw std::logic_error("kernel path: a one-sided plan before connect");
  // Only the staged ranges (stage_layout's, within staging_capacity()) are looked up: an empty
  // one (the output of mapped_one_shot, never read at a peer) has no address, whatever its offset.
  std::vector<char*> at_in(size_, nullptr), at_out(size_, nullptr);
  char* const mine = region_ + 2 * flag_bytes();
  if ((u.stage_bytes[0] && !staged_peers_->peer_addresses(mine, u.stage_bytes[0], at_in)) ||
      (u.stage_bytes[1] && !staged_peers_->peer_addresses(mine + u.stage_out_at, u.stage_bytes[1], at_out)))
    throw std::logic_error("kernel path: a peer's slots area is not mapped (" + std::to_string(u.stage_need) +
                           " staged bytes judged to fit " + std::to_string(staging_capacity()) + ")");
  uint64_t* table = reinterpret_cast<uint64_t*>(host.data() + u.table_at);
  for (int q = 0; q < size_; ++q) {
    table[q * 3 + 0] = (u.peer_bufs & in_bit) ? reinterpret_cast<uint64_t>(at_in[q]) : 0;
    table[q * 3 + 1] = (u.peer_bufs & out_bit) ? reinterpret_cast<uint64_t>(at_out[q]) : 0;
  }
}

void KernelPath::fill_one_sided(kexec::PlanLaunch& a, const Uploaded& u, char* const bases[3],
                                const MappedPeers* mapped, bool captured, DeviceStream& stream) {
  a.one_sided = 1;
  a.os_blocks = kexec::kMaxGrid;
  a.peer_bases = reinterpret_cast<const uint64_t*>(static_cast<char*>(u.dev) + u.table_at);
  a.os_flags = reinterpret_cast<uint64_t*>(region_ + os_flags_offset());
  a.os_signalled = reinterpret_cast<uint64_t*>(static_cast<char*>(local_) + os_local_offset());
  a.os_consumed = a.os_signalled + os_flag_words();
  a.stage_user[0] = a.stage_user[1] = nullptr;
  a.stage_bytes[0] = a.stage_bytes[1] = 0;
  a.staged_release = 0;
  if (!u.peer_bufs) return;
  // Every rank's buffers in place: the call's table, no staging, and no closing handshake: the
  // verifier proves that when a schedule returns every peer is done with this rank's buffers (its
  // last wait), and a mapped launch touches no slots (every rank takes the same route).
  if (mapped && mapped->mapped) {
    const uint8_t in_bit = 1u << static_cast<int>(BufferId::Input), out_bit = 1u << static_cast<int>(BufferId::Output);
    std::vector<uint64_t>& words = mapped_words_;  // (kept: no allocation per call)
    words.assign(static_cast<size_t>(size_) * 3, 0);
    for (int q = 0; q < size_; ++q) {
      words[q * 3 + 0] = (u.peer_bufs & in_bit) ? reinterpret_cast<uint64_t>(mapped->in[q]) : 0;
      words[q * 3 + 1] = (u.peer_bufs & out_bit) ? reinterpret_cast<uint64_t>(mapped->out[q]) : 0;
    }
    a.peer_bases = mapped_table(words, stream);
    return;
  }
  // Staged through the staging arena (a captured launch as well, where arena_captures: its graph
  // pins the arena), else through the slots. Every rank takes the same one: the arena grows alike
  // everywhere, and every rank made the same eager calls.
  if (stages_in_arena(u, captured)) return fill_arena_staged(a, u, bases, stream, captured);
  if (!u.stage_fits) throw std::logic_error("kernel path: a staged one-sided call that does not fit (unchecked)");
  a.staged_release = 1;  // the closing handshake (the file's comment says why)
  char* const mine = region_ + 2 * flag_bytes();
  const uint64_t out_at = u.stage_out_at;
  if (u.stage_bytes[0] || u.stage_in_place) {
    a.stage_user[0] = bases[0];
    a.stage_bytes[0] = u.stage_bytes[0];
    a.bases[0] = mine;
  }
  if (u.stage_bytes[1] || u.stage_in_place) {
    a.stage_user[1] = bases[1];
    a.stage_bytes[1] = u.stage_bytes[1];
    a.bases[1] = mine + out_at;
  }
}

const uint64_t* KernelPath::mapped_table(const std::vector<uint64_t>& words, DeviceStream& stream) {
  auto it = mapped_tables_.find(words);
  if (it != mapped_tables_.end()) return static_cast<const uint64_t*>(it->second);
  if (mapped_tables_.size() >= kMappedTables) release_mapped_tables(stream);
  const size_t bytes = words.size() * sizeof(uint64_t);
  void* dev = device_->allocate_ordered(bytes, stream);
  std::vector<char> host(bytes);
  std::memcpy(host.data(), words.data(), bytes);
  stage(host, dev, stream);
  mapped_tables_.emplace(words, dev);
  return static_cast<const uint64_t*>(dev);
}

void KernelPath::release_mapped_tables(DeviceStream& stream) {
  for (auto& [words, dev] : mapped_tables_) device_->free_ordered(dev, stream);
  mapped_tables_.clear();
}

}  // namespace commlib
