#include "policy/auto_policy.h"

#include "schedule/registry.h"

namespace commlib {

LinkProfile link_profile(const Topology& topo) {
  LinkProfile p;
  p.crosses_hosts = topo.hosts() > 1;
  for (int h = 0; h < topo.hosts(); ++h) p.shares_hosts |= topo.ranks_on(h).size() > 1;
  return p;
}

std::string choose_auto_for_links(Collective c, const std::string& env_value, int64_t bytes, int size,
                                  const LinkProfile& links) {
  const bool overridden = !env_value.empty() && env_value != "auto";
  if (!overridden && links.crosses_hosts && links.shares_hosts) {
    for (const std::string& name : algorithms(c))
      if (name == "hierarchical") return name;
  }
  return choose_auto(c, env_value, bytes, size);
}

}  // namespace commlib
