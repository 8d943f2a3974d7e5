"""auto from the cost model on a real communicator (COMMLIB_TOPOLOGY=dgx-h100, emulated hosts over
loopback, no tuning table): auto picks what the engine's resolution predicts fastest on the
communicator's own host map, and the hierarchical schedules with the model's inter-host algorithm
give exact results on equal and uneven hosts. COMMLIB_DEBUG=INFO logs each choice."""
import pytest

import cost_model_cases as cases

LOOPBACK = {"COMMLIB_SOCKET_IFNAME": "lo", "COMMLIB_TOPOLOGY": "dgx-h100"}


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts", [("a", "a", "b", "b"), ("a", "a", "b", "c", "c", "c")], ids=["2x2", "2+1+3"])
def test_auto_follows_the_model_and_composed_schedules_run(pool, hosts):
    results = pool(len(hosts), env={**LOOPBACK, "COMMLIB_HOST_ID": hosts}).run(cases.run, timeout=220)
    failures = [f for _, fails in results for f in fails]
    assert not failures, "\n".join(failures[:20])
    seen = results[0][0]
    assert all(r[0] == seen for r in results)  # every rank chose alike
    for shape, (auto, model, source, _inter) in seen.items():
        assert source == "model" and auto == model, shape
    assert any(inter for *_, inter in seen.values())  # some composed schedule ran
