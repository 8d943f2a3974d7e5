// Lane counts of the algorithms that register one (lanes.h).
#include "schedule/lanes.h"

#include <map>
#include <mutex>
#include <utility>

namespace commlib {

namespace {

std::map<std::pair<int, std::string>, LaneCount>& table() {
  static std::map<std::pair<int, std::string>, LaneCount> t;  // built at static initialisation, read after
  return t;
}

}  // namespace

LanesRegistrar::LanesRegistrar(Collective c, const char* algorithm, LaneCount count) {
  table()[{static_cast<int>(c), algorithm}] = count;
}

int schedule_lanes(const CollArgs& a, const std::string& algorithm) {
  const auto it = table().find({static_cast<int>(a.coll), algorithm});
  return it == table().end() ? 1 : it->second(a);
}

void intra_window_gates(const Schedule& s, int rank, const std::vector<int>& host_of, std::vector<int>& gate) {
  gate.clear();
  const int E = s.intra_window;
  if (E <= 0) return;
  auto host = [&](int r) { return host_of.empty() ? 0 : host_of[static_cast<size_t>(r)]; };
  // A step inside the host: it has messages, every one to a peer on this rank's host.
  auto inside = [&](size_t i) {
    bool any = false;
    for (const Op& o : s.steps[i].ops)
      if (is_message(o.kind)) {
        if (host(o.peer) != host(rank)) return false;
        any = true;
      }
    return any;
  };
  // The k-th step inside waits for the (k - E)-th: a second index `back` walks the same steps E
  // behind, so nothing but `gate` (whose capacity the caller keeps across calls) is allocated: the
  // host executor builds the gates at every laned call (host/lowering.cc).
  gate.assign(s.steps.size(), -1);
  size_t back = 0;
  int seen = 0;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    if (!inside(i)) continue;
    if (seen++ >= E) {
      while (!inside(back)) ++back;
      gate[i] = static_cast<int>(back++);
    }
  }
}

}  // namespace commlib
