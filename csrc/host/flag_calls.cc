// Broadcasts and barriers of a communicator whose ranks share one host, through the shared-memory
// flags (transport.h SharedFlags) instead of the channels: a small broadcast is one write of the
// root's slot and one counter store per reader, a barrier one counter store per rank (Open MPI's
// shape for them; the channels cost a chunk, a header check and a release per peer and message);
// a large one ("shared") is written once into the root's stream and copied out by every reader,
// one copy per byte on each rank (a chain or tree through the channels copies twice per hop).
// Waits are the executor's: spin, then sleep on the doorbell, with the same checks for failed,
// dead, closed, silent or mismatched peers (on_idle).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "host/executor.h"
#include "kernels/cpu_reduce.h"
#include "host/stall_clock.h"
#include "kernels/cpu_copy.h"
#include "plan/describe.h"

namespace commlib {

namespace {
using Clock = std::chrono::steady_clock;  // (its waits' slices and checks: stall_clock.h's)
// A stream's unit: what a root writes before it publishes, and the most a reader copies before it
// publishes (so the root may reuse that much). Small enough that readers start on a broadcast's
// first bytes while the root writes the rest, large enough that the per-piece stores are noise.
constexpr uint64_t kStreamPiece = 64 << 10;
constexpr uint64_t kStreamLine = 64;  // positions advance in whole cache lines
uint64_t round_line(uint64_t x) { return (x + kStreamLine - 1) / kStreamLine * kStreamLine; }
// A broadcast's first line in the root's stream: the call, so that a reader in another call raises
// MismatchError instead of copying, and its size.
struct StreamHeader {
  CallDesc desc;
  uint64_t bytes;
};
static_assert(sizeof(StreamHeader) <= kStreamLine, "the header is one line");

// Where a broadcast of `bytes` starts in a stream whose last one ended at `pos`: there, unless the
// call takes more than half the ring (two of them never fit side by side, so the root gains little
// by writing the next beside this one), when it starts at the ring's beginning instead. Each call
// then reuses the same lines: on the 2-core Intel Xeon VMs a 2 MiB broadcast in the 4 MiB ring of 4
// ranks took 425-462 us against 490-570 while its calls took turns at the ring's two halves, its lines
// no longer staying in cache (bench/RESULTS_collectives.md, session 39). Smaller calls keep running
// ahead of their readers, up to a ring (256 KiB: 13 us a call, 35 when each started at the ring's
// beginning). Every rank computes it alike from the same positions.
uint64_t stream_start(uint64_t pos, uint64_t bytes, uint64_t ring) {
  const uint64_t span = kStreamLine + round_line(bytes);
  if (2 * span <= ring || span > ring) return pos;
  return (pos + ring - 1) / ring * ring;
}
}  // namespace

bool Executor::flags_fit(size_t bytes) const {
  SharedFlags* f = t_.shared_flags();
  return f && bytes <= f->max_bytes();
}

template <typename Ready>
void Executor::wait_flags(Ready ready, OpKind kind, int only_peer, size_t bytes, const CallDesc& call) {
  if (ready()) return;
  // What on_idle watches: the peers this rank waits for, as the operations it waits on.
  ops_watched_.clear();
  for (int p = 0; p < t_.size(); ++p) {
    if (p == t_.rank() || (only_peer >= 0 && p != only_peer)) continue;
    ExecOp o;
    o.kind = kind;
    o.peer = p;
    o.bytes = bytes;
    o.desc = call;
    ops_watched_.push_back(o);
  }
  SharedFlags& f = *t_.shared_flags();
  struct Waiting {  // peers ring this rank's doorbell only while it is set (transport.h)
    SharedFlags& f;
    ~Waiting() { f.set_waiting(false); }
  } waiting{f};
  f.set_waiting(true);
  const auto start = Clock::now();
  auto last_slow = start;
  for (;;) {
    const uint32_t seen = t_.events();
    if (ready()) return;
    const auto now = Clock::now();
    const bool slow = now - last_slow >= kSlowCheckEvery;
    if (slow) last_slow = now;
    on_idle(ops_watched_, call, start, slow);
    t_.wait_events(seen, kSleepSliceUs);
  }
}

void Executor::wait_peers_passed(uint64_t counter, size_t bytes, const CallDesc& call) {
  if (counter <= flag_readers_done_) return;  // the last look already covers it
  SharedFlags& f = *t_.shared_flags();
  const int me = t_.rank();
  wait_flags(
      [&] {
        uint64_t low = UINT64_MAX;
        for (int p = 0; p < t_.size(); ++p)
          if (p != me) low = std::min(low, f.completed(p));
        flag_readers_done_ = low;
        return low >= counter;
      },
      OpKind::Send, -1, bytes, call);
}

void Executor::flag_broadcast(const char* src, char* dst, size_t bytes, int root, const CallDesc& call) {
  SharedFlags& f = *t_.shared_flags();
  const uint64_t n = ++flag_calls_;
  const int me = t_.rank();
  // Every rank runs every broadcast, so each counts the broadcasts of each root alike: the root's
  // k-th write goes to its slot k mod slots, where every reader looks for it.
  if (flag_writes_.size() < static_cast<size_t>(t_.size())) flag_writes_.resize(t_.size(), 0);
  const int index = static_cast<int>(flag_writes_[root]++ % f.slots());
  if (me == root) {
    // A slot may be written again once every reader has copied what it held (the write `slots`
    // writes back), so a root runs at most that many broadcasts ahead of its slowest reader. The
    // readers' counters are read again only when the last look does not already cover it.
    if (flag_slot_call_.size() < static_cast<size_t>(f.slots())) flag_slot_call_.resize(f.slots(), 0);
    wait_peers_passed(flag_slot_call_[index], bytes, call);
    f.write(index, n, call, src, bytes);
    flag_slot_call_[index] = n;
    if (dst && dst != src && bytes) std::memcpy(dst, src, bytes);
    return;
  }
  // The root rewrites a slot only after this rank completed the call it held, so the slot holds n
  // from the moment it is seen until this rank completes it.
  wait_flags([&] { return f.holds(root, index, n); }, OpKind::Recv, root, bytes, call);
  CallDesc got;
  size_t got_bytes = 0;
  const char* data = f.slot(root, index, &got, &got_bytes);
  if (got != call || got_bytes != bytes)
    fail(ErrorKind::Mismatch, "rank " + std::to_string(me) + " in " + describe_call(call) + " found rank " +
                                  std::to_string(root) + "'s broadcast slot holding " + describe_call(got) + " (" +
                                  std::to_string(got_bytes) + " bytes); expected " + std::to_string(bytes) + " bytes");
  if (bytes) std::memcpy(dst, data, bytes);
  f.complete(n, root);
}

void Executor::flag_barrier(const CallDesc& call) {
  SharedFlags& f = *t_.shared_flags();
  const uint64_t n = ++flag_calls_;
  auto everyone_arrived = [&] {
    for (int p = 0; p < t_.size(); ++p)
      if (p != t_.rank() && f.completed(p) < n) return false;
    return true;
  };
  // Only the arrival that completes the barrier wakes the waiting ranks: an earlier one would only
  // send them round their checks again. The rank whose store comes last (the stores and loads are
  // sequentially consistent) sees every other arrival, so at least one rank rings; a waiter that it
  // does not see waiting sees its arrival instead (SharedFlags::set_waiting), so no wake is lost.
  f.complete(n, SharedFlags::kWakeNone);
  if (everyone_arrived()) {
    f.complete(n, SharedFlags::kWakeAll);
    return;
  }
  wait_flags(everyone_arrived, OpKind::Recv, -1, 0, call);
}

bool Executor::stream_fits() const {
  SharedFlags* f = t_.shared_flags();
  return f && f->stream_bytes() >= 4 * kStreamLine;
}

// One broadcast through the root's stream: a header line (the call and its size), then the bytes,
// padded to a line. Every rank runs every broadcast, so each keeps every root's position alike.
void Executor::stream_broadcast(const char* src, char* dst, size_t bytes, int root, const CallDesc& call,
                                bool stream) {
  SharedFlags& f = *t_.shared_flags();
  const int me = t_.rank(), P = t_.size();
  const uint64_t ring = f.stream_bytes();
  if (stream_pos_.size() < static_cast<size_t>(P)) stream_pos_.resize(P, 0);
  const uint64_t last_end = stream_pos_[root];
  const uint64_t start = stream_start(last_end, bytes, ring), data = start + kStreamLine,
                 end = data + round_line(bytes);
  stream_pos_[root] = end;
  char* base = f.stream(root);
  // Pieces never cross the ring's end: the piece at position p of up to n bytes.
  auto piece = [&](uint64_t p, uint64_t left) { return std::min({left, kStreamPiece, ring - p % ring}); };
  if (me == root) {
    // The room left at position q: what every reader consumed, plus the ring, minus q. Readers
    // consume only what was produced, so a root waits for room only while none is left (waiting
    // for a whole piece could wait on bytes it has not published yet). The readers' lowest position
    // is read again only when the last look leaves no room.
    auto room_at = [&](uint64_t q) {
      if (q < stream_low_ + ring) return stream_low_ + ring - q;
      wait_flags(
          [&] {
            uint64_t low = UINT64_MAX;
            for (int p = 0; p < P; ++p)
              if (p != me) low = std::min(low, f.consumed(p));
            stream_low_ = low;
            return q < low + ring;
          },
          OpKind::Send, -1, bytes, call);
      return stream_low_ + ring - q;
    };
    room_at(start);  // the header's line (positions and the ring are whole lines)
    StreamHeader h{call, bytes};
    std::memcpy(base + start % ring, &h, sizeof(h));
    // Plain stores when the readers want the ring cached, non-temporal ones when taking lines back
    // from their caches costs more (host/ring_stores.h): measured on calls of a piece or more.
    const bool measured = bytes >= kStreamPiece;
    if (measured) ring_stores_.begin_call();
    uint64_t p = data;
    while (p < data + bytes) {
      const uint64_t n = std::min(piece(p, data + bytes - p), room_at(p));
      const bool nt = measured && ring_stores_.next_piece();
      const auto t0 = measured ? Clock::now() : Clock::time_point{};
      if (nt)
        copy_bytes(base + p % ring, src + (p - data), n, true);
      else
        std::memcpy(base + p % ring, src + (p - data), n);
      if (measured && n >= kStreamPiece / 4)
        ring_stores_.piece(n, std::chrono::duration<double, std::nano>(Clock::now() - t0).count());
      p += n;
      f.produce(p);
    }
    if (measured) ring_stores_.end_call();
    if (end != p || bytes == 0) f.produce(end);
    if (dst && dst != src && bytes) std::memcpy(dst, src, bytes);
    return;
  }
  // The bytes up to produced() stay until this rank consumes them: the root waits for that. Lines
  // skipped to start at the ring's beginning are consumed at once (the root waits for them too).
  if (start != last_end) f.consume(root, start);
  uint64_t seen = 0;
  auto until = [&](uint64_t q) {
    if (seen >= q) return;
    wait_flags([&] { return (seen = f.produced(root)) >= q; }, OpKind::Recv, root, bytes, call);
  };
  until(data);
  StreamHeader h;
  std::memcpy(&h, base + start % ring, sizeof(h));
  if (h.desc != call || h.bytes != bytes)
    fail(ErrorKind::Mismatch, "rank " + std::to_string(me) + " in " + describe_call(call) + " found rank " +
                                  std::to_string(root) + "'s broadcast stream holding " + describe_call(h.desc) + " (" +
                                  std::to_string(h.bytes) + " bytes); expected " + std::to_string(bytes) + " bytes");
  // Non-temporal stores as the call decided them (streams_call), from the size streams() takes them.
  const bool nt = stream && bytes >= kStreamMinBytes;
  if (nt) bump(streamed_calls_);
  for (uint64_t p = data; p < data + bytes;) {
    until(p + 1);
    const uint64_t n = piece(p, std::min(seen, data + bytes) - p);
    copy_bytes(dst + (p - data), base + p % ring, n, nt);
    p += n;
    f.consume(root, p);
  }
  f.consume(root, end);
}

// auto's small all_gather, all_to_all, all_reduce and reduce_scatter on one host through the
// shared-memory flags (transport.h SharedFlags), as auto's small broadcast (flag_calls.cc): every
// rank writes its whole input into its own slot once, and each takes what it needs from every slot:
// its blocks (all_gather, all_to_all) or the inputs it reduces, in rank order 0, 1, .., P-1, so every
// rank reduces the same values in the same order and all_reduce's result is the same bits on every
// rank. One write and P-1 reads of a flag per rank, where a schedule through the channels costs a
// chunk, a header check and a release per peer and message, and (reduce_broadcast, tree) a wait per
// hop: with more ranks than cores each hop is a wake-up of a descheduled rank.
//
// A slot of this rank holds an exchange's input until every peer has taken what it needs from it.
// A peer has done that once it started a later flag call (calls are sequential, and it publishes
// its counter when it writes, before it reads), so the slot is written again only when every
// peer's counter passed the call it held: flag_slot_call_ records that bound, as a broadcast's root
// records its readers' (flag_calls.cc).
int64_t Executor::flag_exchange_input_bytes(Collective c, int64_t count, size_t esize, int size) {
  switch (c) {
    case Collective::AllGather:
    case Collective::AllReduce: return count * static_cast<int64_t>(esize);
    case Collective::AllToAll:
    case Collective::ReduceScatter: return count * static_cast<int64_t>(esize) * size;
    default: return -1;
  }
}

void Executor::flag_exchange(Collective coll, const char* in, size_t in_bytes, char* out, size_t block_bytes,
                             size_t count, DType dtype, RedOp op, const CallDesc& call) {
  SharedFlags& f = *t_.shared_flags();
  const uint64_t n = ++flag_calls_;
  const int me = t_.rank(), P = t_.size();
  const size_t slots = static_cast<size_t>(f.slots());
  // Every rank writes in every exchange, so each counts every rank's writes alike: rank p's input
  // of this call is in its slot (its writes so far) mod slots.
  if (flag_writes_.size() < static_cast<size_t>(P)) flag_writes_.resize(P, 0);
  if (flag_slot_call_.size() < slots) flag_slot_call_.resize(slots, 0);
  auto slot_of = [&](int p) { return static_cast<int>((flag_writes_[p] - 1) % slots); };
  for (int p = 0; p < P; ++p) ++flag_writes_[p];
  const int mine = slot_of(me);
  wait_peers_passed(flag_slot_call_[mine], in_bytes, call);
  f.write(mine, n, call, in, in_bytes);  // (also this rank's counter: it is in call n)
  flag_slot_call_[mine] = n + 1;
  // Every peer's input, as it arrives; the peers' slots hold them until this rank starts a later call.
  wait_flags(
      [&] {
        for (int p = 0; p < P; ++p)
          if (p != me && !f.holds(p, slot_of(p), n)) return false;
        return true;
      },
      OpKind::Recv, -1, in_bytes, call);
  auto input_of = [&](int p) {
    CallDesc got;
    size_t got_bytes = 0;
    const char* data = f.slot(p, slot_of(p), &got, &got_bytes);
    if (got != call || got_bytes != in_bytes)
      fail(ErrorKind::Mismatch, "rank " + std::to_string(me) + " in " + describe_call(call) + " found rank " +
                                    std::to_string(p) + "'s slot holding " + describe_call(got) + " (" +
                                    std::to_string(got_bytes) + " bytes); expected " + std::to_string(in_bytes) +
                                    " bytes");
    return data;
  };
  // (This rank's own input is read back from its slot too: in place, `out` overlaps `in`.)
  switch (coll) {
    case Collective::AllGather:
      for (int p = 0; p < P; ++p) std::memmove(out + p * block_bytes, input_of(p), block_bytes);  // (0 bytes: checked)
      break;
    case Collective::AllToAll:
      for (int p = 0; p < P; ++p) std::memmove(out + p * block_bytes, input_of(p) + me * block_bytes, block_bytes);
      break;
    case Collective::AllReduce:
    case Collective::ReduceScatter: {
      const size_t at = coll == Collective::ReduceScatter ? me * block_bytes : 0;
      for (int p = 0; p < P; ++p) {
        const char* src = input_of(p) + at;
        if (!block_bytes) continue;
        if (p == 0)
          std::memmove(out, src, block_bytes);
        else
          reduce_inplace(out, src, count, dtype, op);
      }
      break;
    }
    default:
      throw std::logic_error(std::string("flag_exchange: ") + collective_name(coll) + " is no exchange");
  }
}

}  // namespace commlib
