#include "common/params.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <unordered_map>

namespace commlib {

namespace {

// Keep in step with README's "Settings" table (a test compares them). A row:
//   {name, type, default, meaning}              (names, paths, flags, seconds)
//   {name, type, default, meaning, lo, hi}      (int, bytes: the accepted range, checked on read)
// A bytes value is digits with an optional suffix K, M or G (either case), 1024-based: 64K = 65536,
// 4M = 4194304, 1G = 1073741824 (parse_byte_count; README's Settings table says the same).
const std::vector<Param> kParams = {
    {"COMMLIB_TIMEOUT", "seconds", "300",
     "how long a call waits on a silent peer before raising PeerError"},
    {"COMMLIB_DEBUG", "level", "",
     "INFO: log init and auto's choices; TRACE: also every call"},
    {"COMMLIB_ALGO_<COLLECTIVE>", "name", "",
     "algorithm auto runs for that collective (e.g. COMMLIB_ALGO_ALL_REDUCE=ring); read when a "
     "communicator is created"},
    {"COMMLIB_TUNING", "path", "",
     "auto's tuning file (unset: commlib/core/tuning.json; 0: none)"},
    {"COMMLIB_STREAM_BYTES", "bytes", "33554432",
     "a collective whose outputs, all ranks together, hold at least this much writes with "
     "non-temporal stores (0: never); unset: the tuning file's \"stream\" entry of the collective and "
     "world size where it has one", 0, INT64_MAX},
    {"COMMLIB_COPY_CHUNK_BYTES", "bytes", "65536",
     "chunk size of collectives that only move data, on 4 or more ranks (0: the channel's)", 0, INT64_MAX},
    {"COMMLIB_COMPRESS_PIECE_BYTES", "bytes", "262144",
     "compress=: a message is coded in pieces of this much input, so encoding, the wire and decoding overlap "
     "(on device buffers a step stages one piece per message; 0: whole messages; the same on every rank)", 0,
     INT64_MAX},
    {"COMMLIB_SHM_SLOTS", "int", "4", "chunks in flight per shared-memory channel (2..64)", 2, 64},
    {"COMMLIB_SHM_SLOT_BYTES", "bytes", "0",
     "payload bytes of one channel chunk, a multiple of 64 (0: up to 256 KiB, from the world size)", 0, INT64_MAX},
    {"COMMLIB_SHM_BCAST_BYTES", "bytes", "0",
     "bytes of each rank's shared-memory broadcast stream (the \"shared\" broadcast), a multiple of 64, at least "
     "256; the same on every rank (0: up to 4 MiB, 16 MiB for all ranks together)", 0, INT64_MAX},
    {"COMMLIB_SPIN_US", "int", "-1",
     "microseconds a wait on ranks of this host spins before sleeping (-1: 20; with ranks on other hosts see "
     "COMMLIB_TCP_SPIN_US)", -1, INT64_MAX},
    {"COMMLIB_CMA", "name", "auto",
     "single-copy reads of a peer's buffer on one host (process_vm_readv): auto = from the call size the tuning "
     "file's single_copy section measured faster (none: never); 0 = never; 1 = messages of 64 KiB or more; "
     "N bytes = messages of N or more"},
    {"COMMLIB_CPU_PATH", "name", "",
     "force a lower vector path of the reduction kernels (avx512, avx2, baseline); an unknown name is ignored"},
    {"COMMLIB_HOST_ID", "name", "",
     "this process's host identity (default: the hostname); ranks with equal ids share memory, others talk over TCP"},
    {"COMMLIB_SOCKET_IFNAME", "name", "",
     "interfaces TCP links listen on: comma-separated name prefixes, ^ excludes, = exact (default: first up, not loopback)"},
    {"COMMLIB_SOCKET_FAMILY", "name", "",
     "AF_INET or AF_INET6: the address family TCP links listen on (default: IPv4 first)"},
    {"COMMLIB_HIER_SEGMENT", "int", "262144",
     "elements per pipeline segment of hierarchical all_reduce (2+ hosts; at most 16 segments; same on all ranks; "
     "unset under a cost model: the model chooses the segments)", 1, INT64_MAX},
    {"COMMLIB_TOPOLOGY", "name", "",
     "auto's cost model: a simulator preset (dgx-h100, eth-25g, ...), a topology JSON file or fitted:<bench.json>; auto then picks the candidate the simulator predicts fastest on the communicator's host map (unset: the link-kind rule)"},
    {"COMMLIB_TCP_CHUNK_BYTES", "bytes", "524288",
     "payload bytes of one TCP chunk, a multiple of 64 in 4096..64 MiB (the same on every rank)", 4096, 64ll << 20},
    {"COMMLIB_TCP_SPIN_US", "int", "-1",
     "microseconds a wait polls the sockets to other hosts from the calling thread, offering the core "
     "between polls, before it sleeps (-1: 1000; 0: no polling, the progress thread reads)", -1, 10'000'000},
    {"COMMLIB_TCP_NCONNS", "int", "1",
     "TCP connections per pair of ranks on different hosts, 1..16; chunks are striped over them (the same on every rank)", 1, 16},
    {"COMMLIB_SECRET", "secret", "",
     "the job's shared secret (16+ bytes): store values are signed and checked with it"},
    {"COMMLIB_STORE", "address", "",
     "host:port of a store served outside the ranks (`commlib store`): init() and every rank use it, so it "
     "outlives any rank (unset: MASTER_ADDR:MASTER_PORT, served by rank 0 unless torchrun serves it)"},
    {"COMMLIB_NO_CUDA", "flag", "",
     "build time (setup.py): skip the CUDA module even when nvcc is found"},
    {"COMMLIB_CUDA_ARCHS", "list", "80,90",
     "build time (setup.py): the GPU architectures the CUDA module is compiled for (PTX of the last too); "
     "scripts/gpu_check.sh builds for the lent GPU's alone, which halves the build"},
    {"COMMLIB_CUDA_ONE_PTX", "flag", "",
     "build time (setup.py): compile the CUDA kernels' PTX once, for the first of COMMLIB_CUDA_ARCHS, assembled "
     "for each (every one still checked for spills) and none kept for newer GPUs: the set-up (scripts/setup.sh) "
     "sets it where no GPU is listed, no GPU then running the module; about 40% less nvcc time"},
    {"COMMLIB_UNITY_BINDINGS", "flag", "",
     "build time (setup.py): compile the core's pybind11 files (csrc/bindings) as four files that include them "
     "and the torch backend's (csrc/torch_backend) as three, not one object each: pybind11's headers cost each "
     "file about 6 CPU-s, torch's precompiled header about 10.5 (as unity files they compile without it). CI sets it (.ci/run); without it a one-file "
     "change rebuilds that file alone"},
    {"COMMLIB_BINDINGS_O1", "flag", "",
     "build time (setup.py): compile the pybind11 files (csrc/bindings) and the torch backend's (csrc/torch_backend) "
     "at -O1, not -O3: about 30% less of their CPU. CI sets it (.ci/run), whose build proves them and measures "
     "nothing; the README's set-up keeps -O3"},
    {"COMMLIB_NO_TORCH_BACKEND", "flag", "",
     "build time (setup.py): skip the torch backend's C++ module (commlib._C_torch); groups are then the Python "
     "backend alone"},
    {"COMMLIB_NO_CHROMIUM", "flag", "",
     "set-up time (scripts/setup.sh): do not install Debian's chromium for the explorer's browser test"},
    {"COMMLIB_EMULATED_DELAY_US", "int", "0",
     "microseconds every data operation of an emulated device stream waits before it runs (tests: a missing "
     "wait shows up as wrong data)", 0, 10'000'000},
    {"COMMLIB_EMULATED_CONNECTIONS", "int", "8",
     "hardware queues an emulated device's streams share, as CUDA_DEVICE_MAX_CONNECTIONS (1..32): "
     "operations of streams on one queue run in enqueue order, so a blocked wait holds up the others", 1, 32},
    {"COMMLIB_EMULATED_RESIDENT_BLOCKS", "int", "0",
     "blocks of the kernel executor an emulated device holds resident at once, all processes using it together "
     "(0: no limit), as a GPU's occupancy: blocks beyond it wait until resident ones finish; the kernel path sizes "
     "its grid to fit it beside the other ranks and communicators on the device, or refuses", 0, 4096},
    {"COMMLIB_EMULATED_MACHINE", "name", "",
     "the machine emulated devices belong to: processes with the same machine and device index share one "
     "emulated device's resident blocks and grid budget, as processes on one GPU (unset: every process of this "
     "user; a test that limits the resident blocks names one of its own, so that test runs do not share it)"},
    {"COMMLIB_EMULATED_SMS", "int", "4",
     "multiprocessors an emulated device reports (1..256), as cudaDevAttrMultiProcessorCount: a one-sided "
     "kernel-path launch takes at most a block per SM (each block a host thread), read when an engine is made",
     1, 256},
    {"COMMLIB_EMULATED_DEVICE", "int", "0",
     "the emulated device commlib.emulated uses where none is named (one per rank, as torch.cuda.set_device: "
     "the emulated NCCL, like NCCL, refuses two ranks on one device)", 0, INT64_MAX},
    {"COMMLIB_DEVICE_SLOT_BYTES", "bytes", "0",
     "bytes of one inbox slot of the stream engine (device buffers: a message moves in chunks of a slot), a multiple "
     "of 64, the same on every rank; 0 = auto: about 64 MiB of slots per rank, a power of two between 256 KiB and "
     "4 MiB (4 MiB up to 4 ranks with 4 slots, 2 MiB at 8, 256 KiB from 64)", 0, INT64_MAX},
    {"COMMLIB_DEVICE_SLOTS", "int", "4", "inbox slots per peer of the stream engine (1..64)", 1, 64},
    {"COMMLIB_DEVICE_PATH", "name", "auto",
     "how the stream engine runs a collective on device buffers: kernel = one kernel launch over peer memory, "
     "copy = copy-engine copies ordered by stream memory operations, auto = kernel up to the tuning file's "
     "device_path crossover per rank (default: no crossover, kernel at every size), copy above (the same on every rank)"},
    {"COMMLIB_DEVICE_GRID_PERCENT", "int", "100",
     "kernel path: the share of a GPU's resident blocks one communicator's ranks on it may claim together in the "
     "device-wide grid budget (1..100, the same on every rank); 100 = first come, first served (a job alone takes the "
     "whole GPU); e.g. 50 in each of two jobs sharing a GPU keeps both on the kernel path. A share that leaves a rank "
     "no block is refused, naming this setting", 1, 100},
    {"COMMLIB_DEVICE_BLOCK_BYTES", "bytes", "262144",
     "kernel path, one-sided algorithms (mapped_*): at least this many bytes per block per handshake (fewer "
     "blocks for smaller calls, at most the device's grid), the same on every rank", 1, INT64_MAX},
    {"COMMLIB_DEVICE_STAGING", "name", "pool",
     "kernel path, one-sided algorithms on buffers some rank cannot share: pool stages them in the engine's "
     "symmetric arena (grown to any call, peers read it in place), slots in the slots area (at most "
     "COMMLIB_DEVICE_SLOTS x COMMLIB_DEVICE_SLOT_BYTES per peer, one more handshake per block); the same on every rank"},
    {"COMMLIB_DEVICE_LL_BYTES", "bytes", "8192",
     "kernel path: chunks of at most this many bytes move with the LL protocol (data and flag in one 8-byte store, "
     "no fence; half the bandwidth), larger ones through a slot and a flag; 0 = never; a multiple of 64 up to 65536, "
     "at most COMMLIB_DEVICE_SLOT_BYTES, the same on every rank", 0, INT64_MAX},
    {"COMMLIB_DEVICE_TRACE", "int", "0",
     "kernel path: 1 = every launch (one-sided and message plans) stamps each block's steps (%globaltimer) into a device buffer that "
     "commlib.bench.device_trace.rank_trace(comm) reads after the call (one record per block and step; write_trace "
     "writes them as a Chrome trace); 0 = off, nothing stored", 0, 1},
    {"COMMLIB_DEVICE_COPY_RECV", "name", "mirror",
     "copy path (docs/gpu.md \"The copy path's large-message regression\"): how a step's copies and reductions out "
     "of the inbox and between its buffers run: mirror = kernels gated on a device word the stream copies the stop "
     "word into just before each (one read of host memory per operation), so a mismatched call writes nothing; "
     "gated = the same kernels reading the stop word (host memory) in every block (the same guarantee; 13x slower "
     "at 4 MiB and 52x at 64 MiB on an H200, a diagnostic); ungated = the same kernels without a gate; driver = "
     "plain copies by cudaMemcpyAsync (copy engines), reductions ungated. ungated and driver let a mismatched call "
     "write its output (diagnostics for timing)"},
    {"COMMLIB_DEVICE_STREAMS", "int", "2",
     "streams a call of the stream engine runs its steps on: 2 = sends on one, receives and reductions on another, "
     "joined by events per step; 1 = the caller's stream only", 1, 2},
    {"COMMLIB_NCCL_LIBRARY", "path", "", "the libnccl commlib.nccl loads instead of searching the nvidia-nccl wheels"},
    {"COMMLIB_DEVICE_LINK", "name", "auto",
     "link between ranks for device buffers: auto (peer memory within a host, NCCL across hosts), ipc (every "
     "pair; ranks on one host only) or nccl (every pair); the same on every rank"},
};

// "COMMLIB_ALGO_<COLLECTIVE>" -> "COMMLIB_ALGO_"; "" for a plain name.
std::string family_prefix(const char* declared) {
  std::string s = declared;
  auto lt = s.find('<');
  return lt == std::string::npos ? std::string() : s.substr(0, lt);
}

const char* raw(const std::string& name) {
  param(name);  // declared?
  const char* v = std::getenv(name.c_str());
  return (v && *v) ? v : nullptr;
}

}  // namespace

const std::vector<Param>& params() { return kParams; }

std::string foreign_env(const std::string& name) {
  if (name.rfind("COMMLIB_", 0) == 0) throw std::logic_error(name + ": a commlib setting, read through the table");
  const char* v = std::getenv(name.c_str());
  return v ? v : "";
}

const Param& param(const std::string& name) {
  // Plain names index once; family members (COMMLIB_ALGO_<COLLECTIVE>) match by prefix.
  static const std::unordered_map<std::string, const Param*> by_name = [] {
    std::unordered_map<std::string, const Param*> m;
    for (const Param& p : kParams)
      if (family_prefix(p.name).empty()) m.emplace(p.name, &p);
    return m;
  }();
  if (auto it = by_name.find(name); it != by_name.end()) return *it->second;
  for (const Param& p : kParams) {
    const std::string prefix = family_prefix(p.name);
    if (!prefix.empty() && name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) return p;
  }
  throw std::logic_error("setting " + name + " is not declared in csrc/common/params.cc");
}

bool Param::integer() const { return std::string(type) == "int" || std::string(type) == "bytes"; }

std::string param_string(const std::string& name) {
  const char* v = raw(name);
  return v ? std::string(v) : std::string(param(name).fallback);
}

bool param_set(const std::string& name) { return raw(name) != nullptr; }

namespace {

void check_range(const std::string& name, const std::string& v, int64_t x, int64_t lo, int64_t hi) {
  if (x < lo || x > hi)
    throw std::invalid_argument(name + ": must be in " + std::to_string(lo) + ".." + std::to_string(hi) +
                                ", got " + v);
}

const Param& integer_param(const std::string& name, const char* accessor) {
  const Param& p = param(name);
  if (!p.integer())
    throw std::logic_error(std::string(accessor) + "(" + name + "): declared as " + p.type + ", not int or bytes");
  return p;
}

}  // namespace

int64_t parse_byte_count(const std::string& name, const std::string& v) {
  auto refuse = [&] {
    return std::invalid_argument(name + ": expected a byte count >= 0 (digits, optionally followed by K, M or G: "
                                 "1024-based), got '" + v + "'");
  };
  // Digits first: strtoll alone would also take blanks, a sign or hex.
  if (v.empty() || !std::isdigit(static_cast<unsigned char>(v[0]))) throw refuse();
  char* end = nullptr;
  errno = 0;
  const long long digits = std::strtoll(v.c_str(), &end, 10);
  if (errno == ERANGE) throw refuse();
  int shift = 0;
  if (*end) {
    switch (*end) {
      case 'K': case 'k': shift = 10; break;
      case 'M': case 'm': shift = 20; break;
      case 'G': case 'g': shift = 30; break;
      default: throw refuse();
    }
    if (end[1]) throw refuse();  // one suffix letter, nothing after it
  }
  if (digits > (INT64_MAX >> shift)) throw refuse();  // would overflow
  return static_cast<int64_t>(digits) << shift;
}

int64_t param_int(const std::string& name, int64_t lo, int64_t hi) {
  const Param& p = integer_param(name, "param_int");
  const std::string v = param_string(name);
  int64_t x = 0;
  if (std::string(p.type) == "bytes") {
    x = parse_byte_count(name, v);  // a bytes setting read as an integer takes the same suffixes
  } else {
    char* end = nullptr;
    errno = 0;
    x = std::strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end || errno == ERANGE)
      throw std::invalid_argument(name + ": expected an integer, got '" + v + "'");
  }
  check_range(name, v, x, p.lo, p.hi);
  check_range(name, v, x, lo, hi);
  return x;
}

size_t param_bytes(const std::string& name) {
  const Param& p = integer_param(name, "param_bytes");
  if (std::string(p.type) != "bytes")
    throw std::logic_error("param_bytes(" + name + "): declared as " + p.type + ", not bytes");
  const std::string v = param_string(name);
  const int64_t b = parse_byte_count(name, v);
  check_range(name, v, b, p.lo, p.hi);
  return static_cast<size_t>(b);
}

int64_t spin_us_param() {
  const int64_t spin = param_int("COMMLIB_SPIN_US");
  return spin >= 0 ? spin : kDefaultSpinUs;
}

std::string parse_choice(const std::string& name, const std::string& value, const std::vector<std::string>& allowed) {
  const Param& p = param(name);
  if (std::string(p.type) != "name") throw std::logic_error(name + " is not a name setting (params.cc)");
  auto lower = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    return s;
  };
  const size_t a = value.find_first_not_of(" \t\n\r\f\v");
  const std::string v = a == std::string::npos ? "" : value.substr(a, value.find_last_not_of(" \t\n\r\f\v") - a + 1);
  if (v.empty() && !*p.fallback) return "";
  const std::string want = lower(v.empty() ? std::string(p.fallback) : v);
  for (const std::string& c : allowed)
    if (lower(c) == want) return c;
  std::string choices;
  for (const std::string& c : allowed) choices += (choices.empty() ? "" : ", ") + c;
  throw std::invalid_argument(name + ": expected one of " + choices + ", got '" + value + "'");
}

std::string param_choice(const std::string& name, const std::vector<std::string>& allowed) {
  return parse_choice(name, param_string(name), allowed);
}

}  // namespace commlib
