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
  gate.assign(s.steps.size(), -1);
  std::vector<int> inside;  // the steps inside the host so far, in list order
  for (size_t i = 0; i < s.steps.size(); ++i) {
    bool any = false, all = true;
    for (const Op& o : s.steps[i].ops)
      if (is_message(o.kind)) {
        any = true;
        all = all && host(o.peer) == host(rank);
      }
    if (!any || !all) continue;
    if (inside.size() >= static_cast<size_t>(E)) gate[i] = inside[inside.size() - E];
    inside.push_back(static_cast<int>(i));
  }
}

}  // namespace commlib
