"""The pipeline's device message path (communication streams, events, receives posted at need,
the lanes' collective warm-up) on the emulated device with its delay on: every schedule's real
action orders replayed through the real lanes at 2 and 3 ranks, results equal to one process
(rank side and what a broken rule does: pp_device_cases.py). The CUDA runs of the schedules
and of the parameter server are in test_parallel_cuda.py (GPU only)."""
import pytest

from parallel import pp_device_cases as C

# ONE hardware queue for all streams (CUDA_DEVICE_MAX_CONNECTIONS=1, the strictest case): every
# stream's waits hold up the others'. It completes because the inboxes post each receive only
# when the schedule needs it (lanes.Inbox): with receives posted ahead on their own streams it hung
# until the timeout (docs/gpu.md, "Streams sharing hardware queues").
# The replay runs on its own emulated device (pp_device_cases.REPLAY_DEVICE) made with these, in
# the session's plain pools: starting ranks that import torch was most of this test's time.
DELAY_US, CONNECTIONS = 20, 1


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
