"""Hosts with fewer NICs than GPUs (docs/simulator.md "NIC-shared hosts"): the published A100 point's
machine, dgx-a100 with 4 NICs, two local ranks on each.

- The rail schedules give every NIC direction exactly its share of a host's inter-host bytes whichever
  local ranks share a NIC (the presets' i % nics, or the PCIe switch's 2k, 2k + 1), as the flat
  ring, which crosses every host boundary through one NIC, does not.
- auto's search places the model with the topology's own NIC map (policy/candidate_search.cc
  placed_model), so its predictions are the simulator's times on that map.
Cost: about 3 s of CPU in all (the second test ranks 75 candidates at 16 ranks, twice)."""
import dataclasses

import pytest

from commlib import _C, tuning
from commlib.sim import topology as sim_topology

L, NICS = 8, 4
SHARING = {  # which local ranks share a NIC
    "i % nics (the presets)": lambda i: i % NICS,
    "2k, 2k + 1 (a PCIe switch's pair)": lambda i: i // (L // NICS),
}


def four_nic_hosts(hosts: int, sharing) -> dict:
    d = dataclasses.replace(sim_topology.load("dgx-a100"), nics=NICS).engine_dict(hosts * L)
    d["nic_of"] = [sharing(r % L) for r in range(hosts * L)]
    return d


@pytest.fixture
def no_tuning():
    _C.clear_tuning()  # this machine's measured table says nothing about the simulated cluster
    yield
    tuning.load_default()


@pytest.mark.parametrize("sharing", SHARING.values(), ids=SHARING.keys())
@pytest.mark.parametrize("algorithm,segments,pieces,balanced", [
    ("rail_ring", 0, 0, True),
    ("rail_window", 16, 0, True),  # 16 segments, each a lane
    ("rail_lanes", 8, 4, True),  # 4 lanes of 2 segments
    ("hierarchical", 0, 0, True),  # the owners of block i: local rank i of every host
    ("ring", 0, 0, False),  # one NIC a host boundary: 4x its share (the test's control)
])
def test_every_nic_direction_carries_its_share(sharing, algorithm, segments, pieces, balanced):
    hosts, count = 4, (16 << 20) // 4
    d = four_nic_hosts(hosts, sharing)
    out = _C.simulate(_C.Collective.all_reduce, algorithm, count, 4, 0, d, "", count // segments if segments else -1,
                      "", pieces=pieces, share=0)
    share_s = out["bytes_inter"] / (hosts * NICS) / d["nic_Bps"]  # a host's bytes out, spread over its NICs
    assert out["bytes_inter"] > 0
    if balanced:
        assert out["nic_busy_s"] == pytest.approx(share_s, rel=1e-9)
    else:
        assert out["nic_busy_s"] == pytest.approx(NICS * share_s, rel=1e-9)


def test_auto_ranks_on_the_topologys_nic_map(no_tuning):
    # 2 hosts of 8, 16 MiB: the built-in hierarchical schedule pairs its rounds differently when ranks
    # 2k, 2k + 1 share a NIC (200.7 us) than when ranks i, i + 4 do (193.0 us); auto's prediction for
    # it must be the time on the topology it was given, not on the presets' i % nics.
    count = (16 << 20) // 4
    predicted = {}
    for name, sharing in SHARING.items():
        d = four_nic_hosts(2, sharing)
        cands = _C.predict_candidates(_C.Collective.all_reduce, count, 4, 0, d)
        hier = [c for c in cands if c["algorithm"] == "hierarchical" and c["inter_algorithm"] in ("", "two_shot")
                and c["intra_algorithm"] == ""]
        assert len(hier) == 2
        for c in hier:
            played = _C.simulate(_C.Collective.all_reduce, "hierarchical", count, 4, 0, d, c["inter_algorithm"],
                                 c["segment"], "", pieces=c["pieces"], share=c["share"])
            assert c["predicted_s"] == pytest.approx(played["time_s"], rel=1e-9), (name, c)
            predicted[name, c["inter_algorithm"]] = c["predicted_s"]
    a, b = SHARING
    assert predicted[b, ""] > 1.02 * predicted[a, ""]  # the two maps differ here, so the check above can fail
