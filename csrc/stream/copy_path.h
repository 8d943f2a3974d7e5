// The stream engine's copy path (issue #36, step 1: out of StreamEngine, beside KernelPath and the
// NCCL link, behind stream/device_path.h): a schedule's steps as copy-engine copies and reduction
// kernels, ordered between ranks by stream memory operations on counters in host memory.
//
// Every rank owns
//   - an inbox (device memory, exported to the peers): nslots slots of slot_bytes per peer;
//   - a control region (host memory in a memfd, opened by the peers of its host, mapped for the
//     device): ready[q] = chunks rank q has put into this rank's inbox, freed[p] = chunks of this
//     rank's messages rank p has consumed, called[p] = the last call rank p's stream signalled, one
//     cache line each; a ring of the last 64 call descriptors this rank's stream reached; the
//     point-to-point descriptor rings (kP2PRing per sender); the stop word's line.
// A send of chunk c to p: the stream waits until freed[p] >= c - nslots + 1 (the slot is free),
// copies the chunk into p's inbox, and writes p's ready[me] = c + 1. A receive of chunk c from q:
// the stream waits until ready[q] >= c + 1, copies or reduces (the shared functors) out of its
// inbox slot, and writes q's freed[me] = c + 1. Within a step, chunk i of every send is enqueued
// before chunk i of every receive, and chunk i before chunk i + 1: a wait on chunk i then only
// depends on peers' operations of lower index, so no step can deadlock, whatever its shape.
// Point-to-point messages (stream_p2p.cc) move through the same chunks and counters.
//
// A call on this path starts with its descriptor check: a host function publishes the descriptor
// (writes only memory), the stream waits (wait_value, on the device) until every other rank
// signalled the same call, and a second host function compares; a difference sets the stop word
// and records MismatchError for the watchdog. Every operation that writes an output or the scratch
// is gated on the stop word (Device::copy_unless and the rest), so a mismatched or failed call
// writes nothing (docs/gpu.md, "A mismatched call writes nothing").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device/device.h"
#include "schedule/ir.h"
#include "stream/device_path.h"
#include "stream/nccl_link.h"

namespace commlib {

struct CodecPiece;  // plan/codec_pieces.h

// One wait_value a stream will execute, for the watchdog (StreamEngine::waits_).
enum class WaitFor : uint8_t { Slot, Data, CallDesc, MessageDesc };
struct StreamWait {
  const uint64_t* flag;  // host address
  uint64_t target;
  int peer;
  bool send;  // waiting for a free slot (send) or for data (receive)
  uint64_t seq;
  WaitFor what = WaitFor::Data;
};

// What the copy path needs of its engine.
class CopyPathHost {
 public:
  virtual ~CopyPathHost() = default;
  virtual void note_wait(const StreamWait& w) = 0;  // the watchdog's view of a wait just enqueued
  // From a host function (it may only record): the watchdog fails the engine with it.
  virtual void fail_from_stream(ErrorKind kind, const std::string& message, uint64_t seq) = 0;
  virtual void publish_call(const CallDesc& desc) = 0;  // the control plane's slot (host calls look there)
};

class CopyPath final : public DevicePathRunner {
 public:
  // Point-to-point message descriptors kept per sender: more than the chunks a sender can have in
  // flight (COMMLIB_DEVICE_SLOTS <= 64), and every message moves at least one chunk, so a sender
  // never overwrites a descriptor its receiver has not checked yet.
  static constexpr uint64_t kP2PRing = 128;
  // COMMLIB_DEVICE_COPY_RECV (docs/gpu.md "The copy path's large-message regression"): mirror, the
  // default (each copy and reduction kernel gated on a device word the stream filled from the stop
  // word just before it: one read of host memory per operation, not per block), gated (the stop
  // word read by every block of every such kernel: the H200's large-message regression, a
  // diagnostic), ungated (those kernels without a gate), driver (plain copies by the driver's copy
  // engines, reductions ungated). ungated and driver let a mismatched call write.
  enum class DataOps : uint8_t { Gated, Mirror, Ungated, Driver };
  // mirror: device words at the inbox's end, one per data operation in turn (a stream's refresh and
  // its kernel's read are stream-ordered; another stream's operation takes another word).
  static constexpr uint64_t kMirrors = 1 << 16;

  // Creates the control region, the inbox and (`streams` 2) the send and receive streams.
  CopyPath(std::shared_ptr<Device> device, CopyPathHost& host, NcclLink& nccl, int rank, int size, uint32_t nslots,
           uint64_t slot_bytes, int streams);
  ~CopyPath() override;

  // "ctl:<pid>:<fd>:<bytes>;slots:<nslots>:<slot_bytes>;inbox:<device handle>".
  std::string local_handle() const;
  // A peer's part of its handle, checked (std::invalid_argument naming the setting that differs)
  // before anything is opened: returns its control fields; `inbox` gets its inbox handle.
  std::vector<uint64_t> check_peer_handle(int p, const std::string& handle, std::string* inbox) const;
  // Maps a peer of this host (its control region through /proc, its inbox).
  void map_peer(int p, const std::vector<uint64_t>& ctl, const std::string& inbox);
  // Which peers' messages go in the NCCL group (`grouped`) and whose descriptors go in-band
  // (`remote`: another host, nothing mapped), from the links connect chose.
  void set_links(std::vector<bool> grouped, std::vector<bool> remote);
  int mapped_peers() const;
  bool has_region() const { return ctl_ != nullptr; }  // until release()

  // The schedule of `call` on `stream`: its steps on one stream, or forked onto the path's two.
  Launched enqueue(const PathCall& call, DeviceStream& stream) override;
  // The call's descriptor check against every other rank (not remote ones: remote_descriptors.*).
  void enqueue_call_check(const CallDesc& desc, uint64_t seq, DeviceStream& s);

  // Chunks (point-to-point uses them too): `seq` the engine's ordinal of the call.
  void send_chunk(int peer, const char* src, size_t bytes, uint64_t seq, DeviceStream& s);
  void recv_chunk(int peer, char* dst, const char* src, size_t bytes, bool reduce, DType dtype, RedOp op, uint64_t seq,
                  DeviceStream& s);
  // The descriptor slot of point-to-point message k from `peer` in this rank's region (`dev`: its
  // device address), and in `peer`'s region for this rank's message k to it.
  char* p2p_slot(int peer, uint64_t k, bool dev = false) const;
  char* peer_p2p_slot(int peer, uint64_t k) const;
  bool grouped(int peer) const { return peer != rank_ && grouped_[peer]; }
  bool remote(int peer) const { return peer != rank_ && remote_[peer]; }
  const uint64_t* stop_dev() const;  // the stop word's device address (gated operations)
  // The word a write after a call's launch (avg's divide, on either path) is gated on: by default
  // the stop word mirrored into a device word as the stream reaches the write (one read of host
  // memory, not one per block: up to 8192 blocks per rank at 32 MiB and more); the stop word itself
  // under the other COMMLIB_DEVICE_COPY_RECV settings (the divide stays gated whatever they do).
  const uint64_t* gate_after_call(DeviceStream& s);

  // Sets the stop word (host memory: allowed in a host function).
  void stop_data();
  // Sets the stop word, then raises every counter this rank's stream can wait on (the engine's
  // failure: no stream stays blocked, and what runs on writes nothing).
  void release_waits();
  // Closes the imports of the peers' memory (the engine's close). Then, once the engine's calls
  // drained: free_inbox (stream-ordered; only when every peer closed its import and nothing failed:
  // a peer that failed may still map it) and release (the streams, the control region).
  void close_imports();
  void free_inbox(DeviceStream& stream);
  void free_codec_staging(DeviceStream& stream);  // compress='s staging (stream-ordered), at the engine's release
  void release();

 private:
  struct Peer {
    char* ctl = nullptr;  // host address of the peer's control region (imported)
    uint64_t* ctl_dev = nullptr;
    char* inbox = nullptr;  // imported inbox
  };
  size_t ctl_bytes() const;
  uint64_t* flag(char* ctl, int which, int peer) const;  // which: 0 ready, 1 freed, 2 called
  char* ring_slot(char* ctl, uint64_t seq) const;
  uint64_t* stop_word(char* ctl) const;
  char* dev_ctl() const { return reinterpret_cast<char*>(ctl_dev_); }
  void enqueue_step(const Step& step, char* const bases[3], size_t esize, DType dtype, RedOp op, const CallDesc& desc,
                    uint64_t seq, DeviceStream& send_s, DeviceStream& recv_s);
  // A call with compress= (copy_path_codec.cc): the host's compressed lowering with device codecs.
  Launched enqueue_compressed(const PathCall& call, DeviceStream& s);
  // Whether a compressed call runs encoded here: every compress= call, and compress_inter_only's
  // only where some peer is on another host (on one host it is the plain call).
  bool runs_encoded(const CodecSpec& spec) const;
  // The engine-kept staging of compressed calls, at least `bytes` (grown stream-ordered on `s`;
  // calls are ordered across streams, so the previous call's use is over): no allocation per step
  // or call once it fits, and no host wait ever.
  char* codec_staging(size_t bytes, DeviceStream& s);
  // x = decode(encode(x)) piece by piece through `tmp` (a piece's encoded bytes): a sum's projection.
  void project_region(const CodecSpec& spec, DType dtype, char* base, const std::vector<CodecPiece>& pieces, char* tmp,
                      DeviceStream& s);
  // A step's copy or reduction out of the inbox or between its own buffers, as COMMLIB_DEVICE_COPY_RECV
  // says: gated kernels (on a device mirror of the stop word by default), the same kernels not gated,
  // or plain copies by the driver.
  void data_copy(char* dst, const char* src, size_t bytes, DeviceStream& s);
  void data_reduce(char* dst, const char* src, size_t n, DType dtype, RedOp op, DeviceStream& s);
  const uint64_t* gate(DeviceStream& s);  // the word a data operation is gated on (null: none)
  static DataOps data_ops_from_env();
  void publish_call_desc(const CallDesc& desc);  // run on the stream
  void compare_call_desc(const CallDesc& desc, uint64_t seq);  // run on the stream, after the waits

  std::shared_ptr<Device> device_;
  CopyPathHost& host_;
  NcclLink& nccl_;
  const int rank_, size_;
  const uint32_t nslots_;
  const uint64_t slot_bytes_;
  const int streams_;
  const DataOps data_ops_;
  uint64_t* mirrors_ = nullptr;  // mirror: kMirrors device words
  uint64_t next_mirror_ = 0;
  int ctl_fd_ = -1;
  char* ctl_ = nullptr;  // this rank's control region (host)
  uint64_t* ctl_dev_ = nullptr;
  void* inbox_ = nullptr;
  std::vector<Peer> peers_;
  std::vector<int> others_;  // every rank but this one: whom a call's check waits for
  std::vector<bool> grouped_, remote_;
  std::vector<uint64_t> sent_, received_;  // chunks per peer (enqueue state)
  void* codec_stage_ = nullptr;  // compress='s staging (allocate_ordered), kept across calls
  size_t codec_stage_bytes_ = 0;
  // streams 2: a call's sends run on send_stream_, its local operations and receives on
  // recv_stream_, forked from and joined into the caller's stream by these events.
  std::shared_ptr<DeviceStream> send_stream_, recv_stream_;
  std::shared_ptr<DeviceEvent> fork_, sent_step_, received_step_;
};

}  // namespace commlib
