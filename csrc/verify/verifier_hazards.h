// Hazards of one-sided schedules (ir.h): which accesses of a rank's buffers are ordered before which.
// Every rank keeps a vector clock: its own entry is its step + 1 (0: before the call), and a wait
// joins in the clock the matching signal carried, so access A happens before access B when B's
// rank's clock covers A's (rank, time). Every element of every rank's arena keeps its last write and
// the reads since (per reader, the latest): a read must come after the last write, a write after the
// last write and every read since; two accesses by one rank in one step conflict as ops of one step
// do. Before the call every rank wrote all of its own buffers (a peer needs its "ready" signal to
// touch them); when it returns it touches them all again (a peer must be done with them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace commlib {
namespace verify {

struct Access {
  int rank = -1;
  int64_t time = 0;  // the rank's step + 1; 0: before the call
  bool write = false;
};

class Hazards {
 public:
  // arena[q]: elements of rank q's arena.
  void init(const std::vector<int64_t>& arena);
  // Rank `by` at clock `vc` reads or writes [a, a+n) of rank `owner`'s arena. False (with the
  // first access it is not ordered after, and the element) on a hazard; nothing is recorded then.
  bool access(int owner, int64_t a, int64_t n, int by, const std::vector<int64_t>& vc, bool write, Access* prior,
              int64_t* pos);
  // Rank `owner` returned at clock vc: false (with the first peer access not ordered before it,
  // and the element) unless every peer's access of its arena happened before.
  bool release(int owner, const std::vector<int64_t>& vc, Access* prior, int64_t* pos) const;

 private:
  struct Cell {
    int64_t end;
    Access last_write;
    std::vector<Access> reads;  // since the last write; one per rank, its latest
  };
  void split(int owner, int64_t pos);
  std::vector<std::map<int64_t, Cell>> cells_;
};

}  // namespace verify
}  // namespace commlib
