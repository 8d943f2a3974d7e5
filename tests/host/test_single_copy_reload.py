"""The single-copy crossovers reloaded while a communicator calls (issue #44's per-call cost: the
crossover is read once per plan, without the lock every call used to take; a reload drops the
plans): the next call follows a change, and a reload racing calls never gives a wrong result.
Own pools: the cases change the process-wide crossovers, which no other module should see."""
import pytest

import single_copy_reload_cases as cases
from commlib.testing.ranks import get_pool

FORCED_AUTO = {"COMMLIB_CMA": "auto"}


@pytest.mark.timeout(180)
def test_the_next_call_follows_each_reload():
    results = get_pool(2, env=FORCED_AUTO, own="single_copy_reload").run(cases.next_call_follows_each_change,
                                                                       timeout=120)
    for reads, sent, wrong in results:
        assert reads, "single-copy reads are refused on this machine"
        assert not wrong, wrong
        # [no entry, every call, never, every call, no entry, every call]: one message to the peer
        # single-copy exactly when the crossover says so
        assert sent == [0, 1, 0, 1, 0, 1], sent


@pytest.mark.timeout(180)
def test_an_entrys_smallest_message_decides_which_messages_go_single_copy():
    # the tuning file's "min_message" (commlib/core/tuning.py): the 64 KiB default kept a 32 KiB
    # all_to_all message on the channels where the Intel Xeon VMs gain from reading it (session 35)
    results = get_pool(3, env=FORCED_AUTO, own="single_copy_reload").run(cases.an_entrys_smallest_message_is_followed,
                                                                       timeout=120)
    for sent, wrong in results:
        assert not wrong, wrong
        # [64 KiB default, 32 KiB, 40 KiB, 32 KiB from a larger call, 32 KiB from this call]: 36 KiB
        # blocks, one to each of the two peers
        assert sent == [0, 2, 0, 0, 2], sent


@pytest.mark.timeout(300)
@pytest.mark.parametrize("size", [2, 3])
def test_calls_racing_a_thread_that_reloads_the_crossovers_are_exact(size):
    results = get_pool(size, env=FORCED_AUTO, own="single_copy_reload").run(
        cases.calls_while_another_thread_reloads, timeout=240)
    for wrong, reloads, single, channel in results:
        assert wrong == [], f"wrong results at calls {wrong}"
        assert reloads > 300, reloads  # the table changed during the calls, not once
        assert single > 0 and channel > 0, (single, channel)  # both paths were taken mid-race
