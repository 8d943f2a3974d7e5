"""The overlapped hierarchical all_reduce on the host executor (shared memory inside an emulated
host, TCP between hosts, COMMLIB_HOST_ID per rank): built-in and registered intra-host phases
beside the built-in exchange and several inter-host algorithms, 2 hosts of 2 and 3 hosts of 3 (an
odd world), counts of 3 to 16 uneven segments; exact integer results in place and out of place,
and every rank's schedule really mixes inter- and intra-host messages in its steps."""
import pytest

import overlap_cases as cases

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo"}
# ("", ""): the built-in exchange between hosts, on the overlapped lanes too.
# The last two: rail_split (schedule/side_by_side.cc), rail rings beside the overlapped pipeline (each a
# lane: run in list order here, a Python algorithm), and
# rail_halving (its own phases: paired by elements on 2 x 2, hierarchical rabenseifner/ring on 3 x 3),
# rail_lanes (two lanes of rail_halving on 2 x 2, run lane after lane; rail_halving on 3 x 3) and
# rail_window (a lane per segment, 3 to 78 of them on 2 x 2, listed in pipelined order and run in that
# order, its window unused by the executor; on 3 x 3 rail_halving's plain form: one lane), also with
# its segments' intra-host phases direct (session 29).
PAIRS = [("", ""), ("ring", ""), ("two_shot", "direct"), ("rabenseifner", "ring"), ("recursive_doubling", "rail_ring"),
         ("two_shot", "", "rail_split"), ("", "", "rail_halving"), ("", "", "rail_lanes"), ("", "", "rail_window"),
         ("", "direct", "rail_window")]
COUNTS = [64 * 3 + 5, 64 * 16 + 1, 5003]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hosts", [("a", "a", "b", "b"), ("a", "b", "c", "a", "b", "c", "a", "b", "c")],
                         ids=["2x2", "3x3-interleaved"])
def test_overlapped_compositions_run_exactly(pool, hosts):
    got = pool(len(hosts), env={**LOOPBACK, "COMMLIB_HOST_ID": hosts}).run(cases.run, PAIRS, COUNTS, timeout=280)
    for rank, results in enumerate(got):
        for (inter, intra, *algorithm), per_pair in zip(PAIRS, [results[i:i + len(COUNTS)] for i in range(0, len(results), len(COUNTS))]):
            for count, (exact_in, exact_out, mixed) in zip(COUNTS, per_pair):
                assert exact_in and exact_out, (rank, inter, intra, count)
                # (rail_window's steps are each one segment's: intra-host or inter-host, never both;
                # rail_split's parts are lanes of their own since session 27, so a rank whose rings
                # stay inside its host, 3 x 3 interleaved, has its inter-host messages in other steps,
                # run beside them: tests/host/test_laned_calls.py)
                assert mixed >= 2 or algorithm in (["rail_window"], ["rail_split"]), (rank, inter, intra, count, mixed)
