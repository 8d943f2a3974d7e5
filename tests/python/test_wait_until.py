"""commlib.bootstrap.wait.wait_until, the one store wait loop (init's rendezvous, the device set-ups,
the device route's closing barrier and shrink's agreement wait through it): what it returns, the
order of its checks, its timeout, and its backing-off pause (time.sleep recorded, never timed)."""
import time
import types

import pytest

from commlib.bootstrap import wait


@pytest.fixture
def clock(monkeypatch):
    """The wait module's own `time`, replaced by a namespace: patching `wait.time.sleep` would patch the
    `time` module itself, for every thread of the process (a store server's included)."""
    fake = types.SimpleNamespace(monotonic=time.monotonic, sleep=time.sleep)
    monkeypatch.setattr(wait, "time", fake)
    return fake


@pytest.fixture
def pauses(clock):
    slept = []
    clock.sleep = slept.append
    return slept


def test_returns_the_first_true_value_and_polls_every_round_before_it(pauses):
    answers = iter([None, 0, [], {"claims": 3}])
    polled = []
    got = wait.wait_until(lambda: next(answers), None, on_timeout=lambda: AssertionError("no deadline"),
                          poll=lambda: polled.append(len(pauses)))
    assert got == {"claims": 3}
    assert polled == [0, 1, 2]  # once a round, before that round's pause
    assert pauses == [0.0005, 0.001, 0.002]


def test_the_pause_doubles_up_to_its_cap(pauses):
    rounds = iter(range(10))
    wait.wait_until(lambda: next(rounds) == 9, None, on_timeout=lambda: AssertionError(), max_pause=0.01)
    assert pauses == [0.0005, 0.001, 0.002, 0.004, 0.008, 0.01, 0.01, 0.01, 0.01]
    pauses.clear()
    rounds = iter(range(10))
    wait.wait_until(lambda: next(rounds) == 9, None, on_timeout=lambda: AssertionError())
    assert max(pauses) == wait.MAX_PAUSE_S and pauses[-1] == wait.MAX_PAUSE_S


def test_past_the_deadline_it_raises_what_on_timeout_gives_after_polling(pauses, clock):
    ticks = iter([1.0, 2.0, 3.0])
    clock.monotonic = lambda: next(ticks)
    polled = []
    with pytest.raises(TimeoutError, match="waited for rank 2"):
        wait.wait_until(lambda: False, 1.5, on_timeout=lambda: TimeoutError("waited for rank 2"),
                        poll=lambda: polled.append(1))
    assert polled == [1, 1] and len(pauses) == 1  # the round at 2.0 polled, then timed out


def test_a_poll_that_raises_ends_the_wait(pauses):
    def poll():
        raise RuntimeError("rank 1 reported a failure")
    with pytest.raises(RuntimeError, match="rank 1 reported"):
        wait.wait_until(lambda: False, None, on_timeout=lambda: AssertionError(), poll=poll)
    assert pauses == []


def test_wait_for_key_waits_through_it_and_reads_the_error_key(pauses):
    class Store:
        def __init__(self):
            self.keys, self.checks = {}, 0

        def check(self, keys):
            self.checks += 1
            if self.checks == 4:
                self.keys["p/k"] = b"value"
            return all(k in self.keys for k in keys)

        def get(self, key):
            return self.keys[key]

    store = Store()
    assert wait.wait_for_key(store, "p/k", None, on_timeout=lambda: AssertionError(), error_key="p/error",
                             on_error=lambda why: AssertionError(why)) == b"value"
    store = Store()
    store.keys["p/error"] = b"rank 3: ValueError: bad"
    with pytest.raises(ValueError, match="rank 3: ValueError: bad"):
        wait.wait_for_key(store, "p/k", None, on_timeout=lambda: AssertionError(), error_key="p/error",
                          on_error=ValueError)
