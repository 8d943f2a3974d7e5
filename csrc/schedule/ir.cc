#include "schedule/ir.h"

namespace commlib {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::Send: return "send";
    case OpKind::Recv: return "recv";
    case OpKind::RecvReduce: return "recv_reduce";
    case OpKind::Copy: return "copy";
    case OpKind::Reduce: return "reduce";
  }
  return "?";
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
