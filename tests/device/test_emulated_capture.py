"""Stream capture and graphs on the emulated device (one process, issue #37 item 4): work enqueued
while capturing is recorded, not run; a replay re-runs it with the values captured; the calls CUDA
forbids inside a capture fail with CUDA's errors and invalidate it; events fork and join streams."""
import threading

import numpy as np
import pytest

import commlib.emulated as emu
import commlib._C as _C

F32 = _C.DType.float32
SUM = _C.RedOp.sum


def _array(values):
    a = emu.from_numpy(np.asarray(values, np.float32))
    emu.current_stream().synchronize()
    return a


def _now(a):
    """The array's memory as it is, after every stream of the device drained (no capture may be
    running: a synchronize is an unsafe call)."""
    emu.synchronize()
    return a.host_view_unsynchronized()


def test_capture_records_without_running_and_replays_rerun_with_captured_values():
    x, y = _array([1, 2, 3, 4]), _array([0, 0, 0, 0])
    dev = emu.device()
    g = emu.Graph()
    with emu.graph(g) as captured:
        s = emu.current_stream()
        assert emu.capture_status(s)[0] == "active" and emu.is_current_stream_capturing()
        dev.reduce(y.data_ptr(), x.data_ptr(), 4, F32, SUM, s._stream)       # y += x
        dev.scale_copy(x.data_ptr(), x.data_ptr(), 4, F32, 2.0, s._stream)   # x *= 2 (scale captured)
    assert captured is g and emu.capture_status(s) == ("none", 0)
    assert list(_now(y)) == [0, 0, 0, 0] and list(_now(x)) == [1, 2, 3, 4]  # nothing ran
    calls = dev.driver_calls()
    for _ in range(3):
        g.replay()
    after = dev.driver_calls()
    # Replays read the memory as it is then, with the arguments as captured: x doubles every time.
    assert list(_now(y)) == [7, 14, 21, 28] and list(_now(x)) == [8, 16, 24, 32]
    assert after["cudaGraphLaunch"] - calls.get("cudaGraphLaunch", 0) == 3
    assert after.get("a reduction kernel launch") == calls.get("a reduction kernel launch")  # no new launch call


def _capture_then(call, mode="global"):
    """Runs `call(stream, array)` inside a capture; returns (the error it raised, end_capture's error)."""
    dev, s, a = emu.device(), emu.Stream(), _array([1])
    dev.begin_capture(s._stream, mode)
    try:
        with pytest.raises(RuntimeError) as raised:
            call(s, a)
        assert emu.capture_status(s)[0] == "invalidated"
    finally:
        with pytest.raises(RuntimeError) as ended:
            dev.end_capture(s._stream)
    assert emu.capture_status(s)[0] == "none"
    return str(raised.value), str(ended.value)


ILLEGAL_IN_GLOBAL_CAPTURE = {
    "synchronize the capturing stream": lambda s, a: s.synchronize(),
    "synchronize another stream": lambda s, a: emu.Stream().synchronize(),
    "query an event": lambda s, a: emu.Event().query(),
    "synchronize an event": lambda s, a: emu.Event().synchronize(),
    "cudaMalloc": lambda s, a: emu.device().allocate(64),
    "an array's allocation": lambda s, a: emu.empty(4),
    "cudaFree": lambda s, a: emu.device().free_async(a.data_ptr(), emu.Stream()._stream),
    "read an array back": lambda s, a: a.numpy(),
}


@pytest.mark.parametrize("name", sorted(ILLEGAL_IN_GLOBAL_CAPTURE))
def test_unsafe_calls_in_a_global_capture_fail_and_invalidate_it(name):
    err, end = _capture_then(ILLEGAL_IN_GLOBAL_CAPTURE[name])
    assert err.startswith("cudaErrorStreamCaptureUnsupported"), err
    assert end.startswith("cudaErrorStreamCaptureInvalidated"), end


def test_capture_modes_decide_which_threads_are_prohibited():
    dev, s = emu.device(), emu.Stream()
    results = {}

    def other_thread(key, mode):
        try:
            with emu.capture_mode(mode):
                emu.Event().query()
            results[key] = "ok"
        except RuntimeError as e:
            results[key] = str(e)

    def run(key, mode):
        t = threading.Thread(target=other_thread, args=(key, mode))
        t.start()
        t.join()

    for capture in ("thread_local", "relaxed", "global"):
        dev.begin_capture(s._stream, capture)
        run((capture, "relaxed"), "relaxed")
        run((capture, "global"), "global")
        status = emu.capture_status(s)[0]
        try:
            dev.end_capture(s._stream)
            results[(capture, "end")] = status
        except RuntimeError as e:
            results[(capture, "end")] = str(e)
    # A thread-local or relaxed capture never prohibits other threads; a global one prohibits the
    # threads in global mode (and is invalidated by their call), never a relaxed thread.
    for key in [("thread_local", "relaxed"), ("thread_local", "global"), ("relaxed", "relaxed"), ("relaxed", "global"),
                ("global", "relaxed")]:
        assert results[key] == "ok", (key, results[key])
    assert results[("global", "global")].startswith("cudaErrorStreamCaptureUnsupported")
    assert results[("thread_local", "end")] == results[("relaxed", "end")] == "active"
    assert results[("global", "end")].startswith("cudaErrorStreamCaptureInvalidated")


def test_a_relaxed_capture_allows_unsafe_calls_but_not_the_conflicting_ones():
    dev, s = emu.device(), emu.Stream()
    e = emu.Event()
    dev.begin_capture(s._stream, "relaxed")
    try:
        dev.free_async(dev.allocate(64), emu.Stream()._stream)  # cudaMalloc / cudaFree: allowed here
        e.record(s)
        with pytest.raises(RuntimeError, match="^cudaErrorCapturedEvent"):
            e.query()
        with pytest.raises(RuntimeError, match="^cudaErrorStreamCaptureUnsupported"):
            s.synchronize()
    finally:
        with pytest.raises(RuntimeError, match="^cudaErrorStreamCaptureInvalidated"):
            dev.end_capture(s._stream)


def test_events_fork_and_join_streams_into_the_capture():
    x, y, z = _array([1, 2]), _array([10, 20]), _array([0, 0])
    dev, main, side = emu.device(), emu.Stream(), emu.Stream()
    g = emu.Graph()
    with emu.graph(g, stream=main):
        fork = main.record_event()
        side.wait_event(fork)                   # side joins the capture
        assert emu.capture_status(side)[0] == "active"
        assert emu.capture_status(side)[1] == emu.capture_status(main)[1]
        dev.reduce(z.data_ptr(), x.data_ptr(), 2, F32, SUM, side._stream)   # z += x on the side stream
        dev.reduce(y.data_ptr(), x.data_ptr(), 2, F32, SUM, main._stream)   # y += x meanwhile
        main.wait_event(side.record_event())    # join
        dev.reduce(y.data_ptr(), z.data_ptr(), 2, F32, SUM, main._stream)   # then y += z
    assert emu.capture_status(side)[0] == "none"
    assert list(_now(y)) == [10, 20] and list(_now(z)) == [0, 0]
    g.replay()
    g.replay()
    # z: x, 2x; y: 10 + x + x, then + x + 2x
    assert list(_now(z)) == [2, 4] and list(_now(y)) == [15, 30]


def test_a_fork_not_joined_back_fails_the_capture():
    dev, main, side = emu.device(), emu.Stream(), emu.Stream()
    x = _array([1])
    dev.begin_capture(main._stream, "global")
    side.wait_event(main.record_event())
    dev.reduce(x.data_ptr(), x.data_ptr(), 1, F32, SUM, side._stream)
    with pytest.raises(RuntimeError, match="^cudaErrorStreamCaptureUnjoined"):
        dev.end_capture(main._stream)
    assert emu.capture_status(side)[0] == emu.capture_status(main)[0] == "none"
    assert list(_now(x)) == [1]


def test_waiting_on_an_event_recorded_outside_the_capture_is_refused():
    eager = emu.Stream().record_event()
    err, end = _capture_then(lambda s, a: s.wait_event(eager))
    assert err.startswith("cudaErrorStreamCaptureIsolation") and end.startswith("cudaErrorStreamCaptureInvalidated")


def test_capture_is_begun_and_ended_by_the_rules():
    dev, s = emu.device(), emu.Stream()
    with pytest.raises(RuntimeError, match="^cudaErrorIllegalState"):
        dev.end_capture(s._stream)
    dev.begin_capture(s._stream, "global")
    with pytest.raises(RuntimeError, match="^cudaErrorIllegalState"):
        dev.begin_capture(s._stream, "global")
    ended = []
    t = threading.Thread(target=lambda: ended.append(pytest.raises(RuntimeError, dev.end_capture, s._stream)))
    t.start()
    t.join()
    assert str(ended[0].value).startswith("cudaErrorStreamCaptureWrongThread")
    dev.end_capture(s._stream)  # from the thread that began it
    with pytest.raises(ValueError, match="capture_error_mode"):
        emu.graph(emu.Graph(), capture_error_mode="local").__enter__()


def test_an_external_wait_on_an_event_recorded_outside_the_capture_is_a_node_waiting_at_each_launch():
    """cudaEventWaitExternal: the capture stays valid, the graph gets an external event wait node,
    and each launch waits for the event's latest record as of that launch. Here every launch comes
    right after a copy into x queued on p behind 30 copies of 16 MiB, and its record; a node that
    waited for the capture's record (or none) would read x before that copy landed."""
    dev, p, s = emu.device(), emu.Stream(), emu.Stream()
    n = 4 << 20
    big, junk = _array(np.ones(n)), _array(np.zeros(n))
    x, y = _array([0]), _array([0])
    ev = emu.Event()
    ev.record(p)  # eager: outside the capture
    calls = dev.driver_calls()
    g = emu.Graph()
    g.capture_begin(s)
    s.wait_event(ev, external=True)
    dev.reduce(y.data_ptr(), x.data_ptr(), 1, F32, SUM, s._stream)  # y += x
    assert emu.capture_status(s)[0] == "active"
    g.capture_end()
    assert dev.driver_calls()["cudaStreamWaitEvent"] == calls.get("cudaStreamWaitEvent", 0) + 1
    for k in (1, 2, 3):
        src = _array([k])
        for _ in range(30):
            junk.copy_(big, stream=p)
        x.copy_(src, stream=p)
        ev.record(p)
        g.replay(s)
        s.synchronize()
        p.synchronize()
    assert list(_now(y)) == [1 + 2 + 3]


def test_an_external_wait_outside_a_capture_or_on_a_captured_event_is_refused():
    """The flag is valid only during stream capture (cudaErrorInvalidValue elsewhere); an external
    wait on an event last recorded inside a capture is not modelled, and says so."""
    p, s = emu.Stream(), emu.Stream()
    eager = p.record_event()
    with pytest.raises(RuntimeError, match="^cudaErrorInvalidValue.*not capturing"):
        s.wait_event(eager, external=True)
    dev = emu.device()
    dev.begin_capture(s._stream, "global")
    try:
        inside = s.record_event()
        with pytest.raises(RuntimeError, match="not modelled"):
            s.wait_event(inside, external=True)
    finally:
        dev.end_capture(s._stream)
