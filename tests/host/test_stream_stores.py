"""Which calls write their copies with streaming (non-temporal) stores (csrc/policy/stream_stores.h):
the tuning file's "stream" entries decide per collective and world size, COMMLIB_STREAM_BYTES set
overrides them with its footprint rule, and the results stay exact either way (real ranks)."""
import pytest

import stream_stores_cases as cases


@pytest.mark.timeout(120)
@pytest.mark.parametrize("size", [1, 3, 4])
def test_the_tuned_entries_decide_which_calls_stream(pool, size):
    assert pool(size).run(cases.tuned_streaming, timeout=60) == [[]] * size


@pytest.mark.timeout(120)
def test_a_set_stream_bytes_overrides_the_entries(pool):
    p = pool(3, env={"COMMLIB_STREAM_BYTES": "1000"})
    assert p.run(cases.tuned_streaming, True, timeout=60) == [[]] * 3
