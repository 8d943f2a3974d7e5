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

}  // namespace commlib
