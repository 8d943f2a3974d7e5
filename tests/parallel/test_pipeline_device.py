"""The pipeline's device message path (communication streams, events, posted-ahead receives,
the lanes' collective warm-up) on the emulated device with its delay on: every schedule's real
action orders replayed through the real lanes at 2 and 3 ranks, results equal to one process
(rank side and what a broken rule does: pp_device_cases.py). The CUDA runs of the schedules
and of the parameter server are in test_parallel_cuda.py (GPU only)."""
import pytest

from parallel import pp_device_cases as C

# A hardware queue per stream: the pipeline's inboxes post receives ahead on their own streams,
# which completes only while a receive's wait does not share a queue with the sends it depends on
# (docs/gpu.md, "Streams sharing hardware queues": no library can promise more; with 8 queues and
# the replay's streams it stalls, as it could on a GPU). This test is about message order.
# The replay runs on its own emulated device (pp_device_cases.REPLAY_DEVICE) made with these, in
# the session's plain pools: starting ranks that import torch was most of this test's time.
DELAY_US, CONNECTIONS = 20, 32


@pytest.mark.timeout(120)
@pytest.mark.parametrize("P", [2, 3])
def test_every_schedule_moves_device_messages_in_order(pool, P):
    cases = [("gpipe", 1, P + 1), ("1f1b", 1, 2 * P + 1), ("interleaved", 2, 2 * P), ("zero_bubble", 1, 2 * P + 1),
             ("1f1b", 2, P + 1)]
    # In the 2- and 4-rank pools test_pipeline.py already started (with torch imported).
    results = pool(2 if P == 2 else 4).run(C.replay_on_first_ranks, P, cases, delay_us=DELAY_US,
                                           connections=CONNECTIONS, timeout=100)
    fails = [f for per_rank in results for f in per_rank]
    assert not fails, "\n".join(fails[:20])
