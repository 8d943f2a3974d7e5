"""Nested device guards (csrc/device/device.h, DeviceGuard; issue #37): a guard inside a guard
restores the thread's current device exactly, whatever the nesting; a guard nested in a guard of
the same device makes no driver call; and a make_current of another device inside a guard (as
NCCL's set-up makes) is undone by the guard's end, and does not make a nested guard of the outer
device skip setting it. The emulated device keeps its guards as the CUDA device does
(cuda_device.cc: enter_device / leave_device), with the same driver calls, counted here; the CUDA
version is compiled, not run (no GPU was lent while it was written)."""
import commlib._C as _C


def _calls(before):
    after = _C.emulated_thread_driver_calls()
    return {k: after.get(k, 0) - before.get(k, 0) for k in after if after.get(k, 0) != before.get(k, 0)}


def test_nested_guards_restore_the_current_device():
    d0, d1, d2 = (_C.emulated_device(i) for i in range(3))
    cur = _C.emulated_current_device
    previous = cur()
    try:
        _C.set_emulated_current_device(2)  # the caller's own device (torch.cuda.set_device(2))
        with _C.DeviceGuard(d0):
            assert cur() == 0
            before = _C.emulated_thread_driver_calls()
            with _C.DeviceGuard(d0):  # nested in a guard of the same device: current already
                assert cur() == 0
            assert _calls(before) == {} and cur() == 0
            with _C.DeviceGuard(d1):
                assert cur() == 1
                with _C.DeviceGuard(d0):
                    with _C.DeviceGuard(d2):
                        assert cur() == 2
                    assert cur() == 0
                assert cur() == 1
            assert cur() == 0
            _C.make_current(d1)  # inside the guard, another device made current
            before = _C.emulated_thread_driver_calls()
            with _C.DeviceGuard(d0):  # the outer guard's device: set again, not skipped
                assert cur() == 0
            assert cur() == 1 and _calls(before) == {"cudaGetDevice": 1, "cudaSetDevice": 2}
        assert cur() == 2  # the caller's device, whatever happened inside
        _C.set_emulated_current_device(0)
        with _C.DeviceGuard(d0):  # the caller's device is the guard's: no set on entry
            _C.make_current(d1)
        assert cur() == 0  # set back although it was the guard's own device
        before = _C.emulated_thread_driver_calls()
        with _C.DeviceGuard(d0):
            with _C.DeviceGuard(d0):
                pass
        assert _calls(before) == {"cudaGetDevice": 1} and cur() == 0  # one get for both guards
    finally:
        _C.set_emulated_current_device(previous)
