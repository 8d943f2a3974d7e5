// Releasing the GIL around a blocking call without aborting the process at interpreter exit.
//
// Why not py::gil_scoped_release / Py_BEGIN_ALLOW_THREADS: when a call returns on a non-main thread
// after the interpreter started finalizing, taking the GIL back makes CPython end the thread with
// pthread_exit, whose forced unwind through C++ frames (noexcept destructors, pybind11's catch
// blocks) calls std::terminate: "terminate called without an active exception", SIGABRT, and a job
// that ended well is reported as crashed. A thread that finds the interpreter finalizing parks here
// instead, holding no lock and touching nothing, until the process exits around it.
#pragma once

#include <Python.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace commlib {

inline bool interpreter_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// CPython ends every thread but the finalizing one (the process's main thread, whose thread id is
// the process id) that takes the GIL during finalization.
inline bool thread_would_be_ended() {
  return interpreter_finalizing() && static_cast<pid_t>(syscall(SYS_gettid)) != getpid();
}

// Parks the calling (non-main) thread for good; the process's exit ends it.
[[noreturn]] inline void park_thread_for_exit() {
  for (;;) pause();
}

class ReleaseGil {
 public:
  ReleaseGil() : state_(PyEval_SaveThread()) {}
  ~ReleaseGil() {
    if (thread_would_be_ended()) park_thread_for_exit();
    PyEval_RestoreThread(state_);
  }
  ReleaseGil(const ReleaseGil&) = delete;
  ReleaseGil& operator=(const ReleaseGil&) = delete;

 private:
  PyThreadState* state_;
};

}  // namespace commlib
