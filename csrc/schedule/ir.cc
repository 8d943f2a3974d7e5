#include "schedule/ir.h"

namespace commlib {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::RecvReduce: return "recv_reduce";
    case OpKind::Copy: return "copy";
    case OpKind::Reduce: return "reduce";
    case OpKind::Get: return "get";
    case OpKind::GetReduce: return "get_reduce";
    case OpKind::Put: return "put";
    case OpKind::Signal: return "signal";
    case OpKind::Wait: return "wait";
    case OpKind::ReduceToAll: return "reduce_to_all";
    case OpKind::ReduceFromAll: return "reduce_from_all";
  }
  return "?";
}

bool uses_one_sided(const Schedule& s) {
  for (const Step& st : s.steps)
    for (const Op& o : st.ops)
      if (is_one_sided(o.kind)) return true;
  return false;
}

const char* buffer_name(BufferId b) {
  switch (b) {
    case BufferId::Input: return "input";
    case BufferId::Output: return "output";
    case BufferId::Scratch: return "scratch";
  }
  return "?";
}

}  // namespace commlib
