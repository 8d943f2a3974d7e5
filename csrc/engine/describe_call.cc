// describe_call (declared with CallDesc in transport/transport.h): the one place a call is put into
// words for error messages and traces. It lives in the engine because it names algorithms, which
// only the schedule registry knows.
#include <string>

#include "schedule/registry.h"
#include "transport/transport.h"

namespace commlib {

std::string describe_call(const CallDesc& d) {
  const Collective c = static_cast<Collective>(d.coll);
  const DType t = static_cast<DType>(d.dtype);
  std::string s = std::string(collective_name(c)) + " #" + std::to_string(d.seq) + " (";
  if (c != Collective::Send && c != Collective::Barrier && d.algo) {
    auto names = algorithms(c);
    s += (d.algo <= names.size() ? names[d.algo - 1] : std::string("algorithm ") + std::to_string(d.algo)) + ", ";
  }
  s += std::to_string(d.count) + " x " + dtype_name(t);
  if (collective_reduces(c)) s += std::string(", ") + op_name(static_cast<RedOp>(d.op));
  if (collective_has_root(c)) s += ", root " + std::to_string(d.root);
  return s + ")";
}

}  // namespace commlib
