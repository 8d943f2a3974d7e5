// Builds a host communicator's whole stack from what the bootstrap gathered (commlib/init.py through
// csrc/bindings/comm_bindings.cc, whose constructors only call these): the host map checked, the
// shared-memory transport of this host's ranks, TCP to the ranks on other hosts, the Fabric over
// both, and the Communicator on top.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "host/communicator.h"

namespace commlib {

class TcpTransport;

struct CommSpec {
  int rank = 0, size = 1;
  int fd = -1;                          // this host's shared-memory region (a memfd)
  std::vector<int> host_of;             // host index of every rank
  std::vector<std::string> host_names;  // per host index
  double timeout = 0;
  std::string label;
  int debug = 0;
};

// Ranks on one or more hosts: `net` reaches the other hosts (taken from it when the host map
// names two hosts or more; std::invalid_argument if it is empty then). Bad arguments are
// std::invalid_argument naming them, before anything is opened.
std::unique_ptr<Communicator> make_communicator(CommSpec spec, std::unique_ptr<TcpTransport>& net);

// Every rank on this host: the shared-memory region is the whole communicator's.
std::unique_ptr<Communicator> make_local_communicator(int rank, int size, int fd, double timeout,
                                                      const std::string& label, int debug);

}  // namespace commlib
