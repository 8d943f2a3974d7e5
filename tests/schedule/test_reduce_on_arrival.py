"""reduce_scatter's rings (ring, rail_ring) reduce each partial with the rank's own block as it
arrives (recv_reduce from the input), so the reduction hides behind the transfer (the simulator's
chunked reduction, docs/simulator.md): one message step per ring step, no reduction step after it.
As the intra-host phase of hierarchical all_reduce this is most of what the model gained at 16
DGX nodes (docs/simulator.md, "What bounds it at 16 and 128 nodes")."""
import pytest

from commlib import _C


@pytest.mark.parametrize("algorithm,hosts", [("ring", []), ("rail_ring", [0, 0, 0, 0, 1, 1, 1, 1])])
def test_ring_reduce_scatter_reduces_on_arrival(algorithm, hosts):
    P = 8
    for r in range(P):
        s = _C.schedule(_C.Collective.reduce_scatter, algorithm, r, P, 1000, 0, _C.DType.float32, hosts)
        ops = [o for st in s["steps"] for o in st]
        assert not [o for o in ops if o["op"] == "reduce"], (algorithm, r)
        arriving = [o for o in ops if o["op"] == "recv_reduce"]
        assert arriving and all(o["src"] is not None and o["src"][0] == "input" for o in arriving), (algorithm, r)
    if algorithm == "ring":
        assert len(s["steps"]) == P - 1
    _C._verify_custom(_C.Collective.reduce_scatter, P, 1000,
                      [_C.schedule(_C.Collective.reduce_scatter, algorithm, r, P, 1000, 0, _C.DType.float32, hosts)
                       for r in range(P)], 0)
