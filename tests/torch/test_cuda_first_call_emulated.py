"""The C++ backend's first call on a group and device (issues #44, #37): the stream engine is set up
from C++ (csrc/bindings/device_engines.h, device_engine_setup.h; the backend asks through
_C.device_setup_api in csrc/torch_backend/device_calls.cc), so a spy on the Python device route sees
nothing, not even the set-up; the set-up's failures keep their kinds and messages (tests/stream's
set-up cases for the Python route's). Rank side: native_first_call_cases.py, driven with emulated
memory through the backend's test seam, on the emulated device with its delay on."""
import pytest

pytest.importorskip("torch")

import native_first_call_cases as cases  # noqa: E402

from emulated_pools import DELAY_ENV as ENV  # noqa: E402  (the device matrix's pools)

SECRET = "0123456789abcdef0123456789abcdef"  # (COMMLIB_SECRET: 32 characters)

pytestmark = pytest.mark.usefixtures("cpp_backend")  # (tests/torch/conftest.py)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("size", [2, 3])
def test_the_first_call_sets_the_engine_up_without_the_python_route(pool, size):
    for rank, (seen, ran, engines, wrong, right, engines_after) in enumerate(
            pool(size, env=ENV).run(cases.first_call_sets_up_from_cpp, timeout=150)):
        assert seen == [], (rank, seen)  # no call, no set-up through the Python route
        assert ran and engines == 1, (rank, ran, engines)
        assert wrong == [], (rank, wrong)
        # The Python communicator's later call on that device adopts the engine (no second set-up).
        assert right and engines_after == 1, (rank, right, engines_after)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("size", [2, 3])
def test_a_first_batch_of_sends_and_receives_sets_up_without_the_python_route(pool, size):
    for rank, (seen, batches, right) in enumerate(pool(size, env=ENV).run(cases.first_batch_sets_up_from_cpp,
                                                                          timeout=60)):
        assert seen == [] and batches == 1 and right, (rank, seen, batches, right)


@pytest.mark.timeout(90)
def test_a_peer_in_a_host_call_is_a_mismatch_on_both_ranks(pool):
    results = pool(2, env=ENV).run(cases.host_call_against_cpp_first_call, timeout=60)
    for rank, (seen, took, route) in enumerate(results):
        assert seen.startswith("MismatchError"), (rank, seen)
        assert took < 10, (rank, took)  # the timeout is 30 s
    assert "on device buffers" in results[0][0], results[0]
    assert results[0][2] == [], results[0]  # rank 0's set-up never entered the route


@pytest.mark.timeout(90)
def test_a_peer_gone_before_its_first_call_is_a_peer_error_naming_it(pool):
    seen, took = pool(2, env=ENV).run(cases.peer_gone_before_its_first_call, timeout=60)[0]
    # (the backend names the call and rank first: "commlib device call on rank 0: ...")
    assert seen.startswith("PeerError") and "all_reduce: stream engine set-up" in seen, seen
    assert "rank 1 is gone" in seen, seen
    assert took < 10, took  # the timeout is 30 s


@pytest.mark.timeout(90)
def test_a_silent_peer_times_out_naming_it(pool):
    seen, took = pool(2, env=ENV).run(cases.peer_silent_past_the_timeout, timeout=60)[0]
    assert seen.startswith("CommError"), seen
    assert "stream engine set-up: rank 0 waited 1.5 s (COMMLIB_TIMEOUT) for rank 1," in seen, seen
    assert 1.4 < took < 20, took


@pytest.mark.timeout(90)
def test_a_first_call_with_a_bad_argument_sets_nothing_up(pool):
    """Arguments are checked before the set-up meets anyone: declined at once (the Python backend
    then raises naming the argument), no engine, no wait for the peer that makes no device call."""
    got, took, engines = pool(2, env=ENV).run(cases.bad_first_call_sets_nothing_up, timeout=60)[0]
    assert got == ["", ""], got  # declined, nothing raised by the set-up (it would time out after 3 s)
    assert engines == 0, engines
    assert took < 2.5, took


@pytest.mark.timeout(90)
def test_a_set_up_error_reaches_every_rank(pool):
    (seen0, took0), (seen1, _) = pool(2, env=ENV).run(cases.set_up_failure_reaches_every_rank, timeout=60)
    assert seen1.startswith("ValueError") and "COMMLIB_DEVICE_LINK" in seen1, seen1
    assert seen0.startswith("CommError") and "stream engine set-up failed: rank 1: ValueError" in seen0, seen0
    assert took0 < 10, took0  # the timeout is 30 s


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size,signed", [(2, False), (3, False), (2, True)], ids=["2", "3", "2-signed"])
def test_a_torch_group_sets_up_through_its_c10d_store_from_cpp(pool, size, signed):
    env = dict(ENV, **({"COMMLIB_SECRET": SECRET} if signed else {}))
    for rank, (seen, python_ops, python_store, right, cls, over_torch, store_seen) in enumerate(
            pool(size, env=env).run(cases.first_call_over_torchs_store, timeout=100)):
        assert seen == [] and right, (rank, seen, right)
        assert cls == ("SignedStore" if signed else "PrefixStore") and over_torch, (rank, cls, over_torch)
        # torch's store called from C++ (signed there too): no store operation went through a Python
        # object, neither torch's binding nor the SignedStore's methods.
        assert python_store is False and python_ops == 0 and store_seen == [], (
            rank, python_store, python_ops, store_seen)


@pytest.mark.timeout(150)
def test_a_bad_handle_in_a_signed_torch_store_is_refused_from_cpp_as_signedstore_refuses_it(pool):
    """Under COMMLIB_SECRET, a set-up over torch's store reads a peer's handle in C++ and refuses
    what SignedStore.get refuses (tampered, replayed under another key, signed with another secret,
    unsigned) with its class and text, through no Python store call. The torch caller gets the
    store's own class, commlib.errors.RendezvousError, as the Python path raises it (session 27: the
    core's error kinds carry the store's, core_api.h kCoreRendezvousError; before, RuntimeError)."""
    out = pool(2, env=dict(ENV, COMMLIB_SECRET=SECRET)).run(cases.signed_torch_store_refuses_bad_handles,
                                                            timeout=120)[0]
    assert sorted(out) == sorted(["tampered", "replayed under another key", "another secret", "unsigned"]), out
    for kind, (got, expected, python_ops) in out.items():
        assert expected.startswith("RendezvousError: "), (kind, expected)
        # (the store's class, and its text after the backend's "commlib <call> on rank <r>: ", as every
        # error the backend raises is prefixed; through the Python SignedStore it also carried
        # pybind11's traceback lines)
        text = expected[len("RendezvousError: "):]
        assert got == f"RendezvousError: commlib device call on rank 0: {text}", (kind, got, expected)
        assert python_ops == 0, (kind, python_ops)
