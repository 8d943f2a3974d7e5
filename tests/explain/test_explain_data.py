"""The explorer page's embedded data is the library's: every registered algorithm of the five
collectives at P = 2..8, read back from the written page, equals the schedules (_C.schedule), the
verifier's holdings after every step (_C.verify_trace) and the simulator's timeline
(_C.simulate_trace); and the holdings are the verifier's real ones (hand-checked ring steps, the
collective's definition at the end)."""
import dataclasses

import pytest

import commlib._C as _C
from commlib import explain
from commlib.core.call_spec import COLLECTIVE
from commlib.explain.data import hosts_for, sim_summary
from commlib.sim.topology import PRESETS

import explain_expected as X

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_page_data_equals_schedules_verifier_and_simulator(collective, tmp_path):
    count = 6
    algorithms = list(_C.algorithms(COLLECTIVE[collective]))
    path = explain.write_page(collective, algorithms[0], 4, count, str(tmp_path / "page.html"),
                              sizes=list(range(2, 9)), counts=[count], root=1 if collective == "broadcast" else 0)
    data = explain.embedded_data(open(path).read())
    assert [a["name"] for a in data["algorithms"]] == algorithms
    topo = PRESETS["dgx-h100"]
    for alg in algorithms:
        for P in range(2, 9):
            c = data["cases"][f"{alg}/{P}/{count}"]
            hosts = hosts_for(topo, P)
            assert c["hosts"] == hosts == [0] * P
            root = c["root"]
            assert root == (1 if collective == "broadcast" else 0)
            assert c["schedules"] == X.schedules(collective, alg, P, count, hosts, root), (alg, P)
            assert c["holdings"] == X.holdings(collective, alg, P, count, hosts, root), (alg, P)
            steps = max(len(s["steps"]) for s in c["schedules"])
            assert all(len(h) == len(s["steps"]) + 1 for h, s in zip(c["holdings"], c["schedules"]))
            trace = _C.simulate_trace(COLLECTIVE[collective], alg, count, 4, root, topo.engine_dict(P))
            assert c["sim"] == sim_summary(trace, steps), (alg, P)
            assert len(c["sim"]["step_s"]) == steps


def test_ring_all_reduce_holdings_step_by_step():
    # P = 4, 8 elements: blocks of 2; in step k rank r receives block (r - k - 1) mod 4 from
    # rank r - 1 and adds its own input: after step 1 rank 0 holds x3+x0 in output[6:8].
    h = X.holdings("all_reduce", "ring", 4, 8, [])
    assert h[0][0][1] == [[0, 8, -1, []]]  # before any step: output unwritten
    assert h[0][0][0] == [[0, 8, 0, [0]]]  # its input: x0
    assert h[0][1][1] == [[0, 6, -1, []], [6, 2, 6, [0, 3]]]
    assert h[1][1][1] == [[0, 2, 0, [0, 1]], [2, 6, -1, []]]
    after_rs = h[0][3][1]  # after P - 1 steps rank 0 owns block 1 reduced over every rank
    assert [2, 2, 2, [0, 1, 2, 3]] in after_rs
    assert all(X.per_element(per[-1][1]) == [(i, (0, 1, 2, 3)) for i in range(8)] for per in h)


@pytest.mark.parametrize("collective,alg", [(c, a) for c in COLLECTIVES for a in _C.algorithms(COLLECTIVE[c])])
def test_last_holdings_are_the_collectives_result(collective, alg):
    P, n = 5, 3
    h = X.holdings(collective, alg, P, n, [r // 3 for r in range(P)], root=2)
    for r, per in enumerate(h):
        got = X.per_element(per[-1][1])
        if collective == "all_reduce":
            want = [(i, tuple(range(P))) for i in range(n)]
        elif collective == "reduce_scatter":
            want = [(r * n + i, tuple(range(P))) for i in range(n)]
        elif collective == "all_gather":
            want = [(i, (j,)) for j in range(P) for i in range(n)]
        elif collective == "all_to_all":
            want = [(r * n + i, (j,)) for j in range(P) for i in range(n)]
        else:
            want = [(i, (2,)) for i in range(n)]
        assert got == want, (collective, alg, r)


def test_sim_summary_marks_the_longest_step_and_counts_link_bytes():
    trace = {"time_s": 5.0, "links": ["a", "b", "c"],
             "steps": [[(0.0, 1.0), (1.0, 4.0)], [(0.0, 2.0), (2.0, 5.0), (5.0, 5.0)]],
             "transfers": [(0, 1, 0, 0, 8.0, 0.0, 1.0, [0, 1]), (1, 0, 1, 1, 4.0, 2.0, 5.0, [1, 2]),
                           (0, 1, 1, 1, 2.0, 1.0, 3.0, [0])]}
    s = sim_summary(trace, 3)
    assert s["step_end_s"] == [2.0, 5.0, 5.0]
    assert s["step_s"] == [2.0, 3.0, 0.0]
    assert s["bounding_step"] == 1
    assert s["link_bytes"] == [[[0, 8.0], [1, 8.0]], [[0, 2.0], [1, 4.0], [2, 4.0]], []]
    assert s["total_link_bytes"] == [[0, 10.0], [1, 12.0], [2, 4.0]]


def test_hosts_follow_nodes_and_reach_the_schedules_and_the_simulator():
    data = explain.embedded_data(explain.render(explain.explorer_data(
        "all_reduce", "hierarchical", 4, 8, nodes=2, sizes=[4], counts=[8], algorithms=["hierarchical"])))
    c = data["cases"]["hierarchical/4/8"]
    assert c["hosts"] == [0, 0, 1, 1]
    assert c["schedules"] == X.schedules("all_reduce", "hierarchical", 4, 8, [0, 0, 1, 1])
    assert c["schedules"] != X.schedules("all_reduce", "hierarchical", 4, 8, [0, 0, 0, 0])
    names = c["sim"]["links"]
    assert any("NIC" in names[link] for link, _ in c["sim"]["total_link_bytes"])


@pytest.mark.parametrize("kwargs,arg", [
    (dict(collective="all_reduce", algorithm="nope", P=4, count=8), "algorithm"),
    (dict(collective="nope", algorithm="ring", P=4, count=8), "collective"),
    (dict(collective="all_reduce", algorithm="ring", P=17, count=8), "size"),
    (dict(collective="all_reduce", algorithm="ring", P=4, count=0), "count"),
    (dict(collective="all_reduce", algorithm="ring", P=4, count=8, topology="nope"), "topology"),
    (dict(collective="all_reduce", algorithm="ring", P=4, count=8, nodes=0), "nodes"),
    (dict(collective="all_reduce", algorithm="ring", P=4, count=8, nodes=2, topology="dgx-h100", elem_bytes=0),
     "elem_bytes"),
    (dict(collective="broadcast", algorithm="binomial", P=4, count=8, root=4), "root"),
    (dict(collective="all_reduce", algorithm="ring", P=4, count=8, topology="one-host.json"), "size: 2 hosts"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, arg):
    if kwargs.get("topology") == "one-host.json":  # a topology without NICs spread over two hosts
        kwargs["topology"] = dataclasses.replace(PRESETS["dgx-h100"], devices_per_host=2, nic_Gbps=0.0)
    with pytest.raises(ValueError, match=arg):
        explain.explorer_data(**kwargs, sizes=[4], counts=[8])


def test_page_is_self_contained(tmp_path):
    page = explain.render(explain.explorer_data("all_gather", "ring", 3, 2, sizes=[3], counts=[2]))
    assert "<script src" not in page and "<link" not in page and "http://" not in page.replace(
        "http://www.w3.org/2000/svg", "") and "https://" not in page
    assert "__DATA__" not in page and "__SCRIPT__" not in page
    with pytest.raises(ValueError, match="page"):
        explain.embedded_data("<html></html>")


def test_command_writes_the_page(tmp_path, capsys):
    from commlib.cli import main
    assert main(["explain", "broadcast", "pipeline", "--size", "3", "--count", "4", "--sizes", "3",
                 "--counts", "4", "--topology", "eth-25g", "-o", str(tmp_path)]) == 0
    data = explain.embedded_data((tmp_path / "broadcast.html").read_text())
    assert data["start"] == {"algorithm": "pipeline", "P": 3, "count": 4}
    assert data["topology"] == "eth-25g" and data["cases"]["pipeline/3/4"]["hosts"] == [0, 1, 2]
    assert "broadcast.html#alg=pipeline" in capsys.readouterr().out
    assert main(["explain", "all_reduce", "hierarchical", "--size", "4", "--count", "8", "--nodes", "2", "--sizes",
                 "2,4", "--counts", "8", "--algorithms", "hierarchical,ring", "--bytes-per-element", "1024",
                 "-o", str(tmp_path)]) == 0
    data = explain.embedded_data((tmp_path / "all_reduce.html").read_text())
    assert [a["name"] for a in data["algorithms"]] == ["hierarchical", "ring"] and data["elem_bytes"] == 1024
    assert set(data["cases"]) == {f"{a}/{P}/8" for a in ("hierarchical", "ring") for P in (2, 4)}
    assert data["cases"]["ring/4/8"]["hosts"] == [0, 0, 1, 1] and data["cases"]["ring/2/8"]["hosts"] == [0, 1]
    with pytest.raises(SystemExit):
        main(["explain", "broadcast", "pipeline", "--sizes", "x", "-o", str(tmp_path)])


@pytest.mark.parametrize("alg", ["ring", "rabenseifner", "two_shot"])
def test_simulator_trace_agrees_with_the_schedules_and_the_simulator(alg):
    P, n, eb = 4, 1 << 12, 4
    engine = PRESETS["dgx-h100"].engine_dict(P)
    trace = _C.simulate_trace(COLLECTIVE["all_reduce"], alg, n, eb, 0, engine)
    assert trace["time_s"] == _C.simulate(COLLECTIVE["all_reduce"], alg, n, eb, 0, engine)["time_s"]
    scheds = X.schedules("all_reduce", alg, P, n, [0] * P)
    assert [len(s) for s in trace["steps"]] == [len(s["steps"]) for s in scheds]
    assert max(spans[-1][1] for spans in trace["steps"]) == trace["time_s"]
    for spans in trace["steps"]:  # each step enters after the one before finished
        assert all(a[1] <= b[0] and a[0] <= a[1] for a, b in zip(spans, spans[1:]))
    sent = sorted((r, o["peer"], k, o["src"][2] * eb) for r, s in enumerate(scheds)
                  for k, ops in enumerate(s["steps"]) for o in ops if o["op"] == "send")
    assert sorted((s, d, k, b) for s, d, k, _, b, *_ in trace["transfers"]) == sent
    names = trace["links"]
    for s, d, *_, links in trace["transfers"]:  # one host: the sender's port out, the receiver's in
        assert [names[link] for link in links] == [f"rank {s} out", f"rank {d} in"]


def test_simulator_trace_plays_the_composition_it_is_given():
    """simulate_trace takes simulate()'s pieces and share: rail_split's trace at two shares is
    simulate()'s at each, and the shares differ in time (a trace that ignored them would not)."""
    engine = PRESETS["dgx-h100"].engine_dict(16)
    args = (COLLECTIVE["all_reduce"], "rail_split", 1 << 16, 4, 0, engine, "two_shot", 0)
    times = []
    for share in (512, 1024):
        trace = _C.simulate_trace(*args, "", 2, share)
        assert (trace["share"], trace["pieces"]) == (share, 2)
        assert trace["time_s"] == _C.simulate(*args, "", pieces=2, share=share)["time_s"]
        times.append(trace["time_s"])
    assert times[0] != times[1]
    with pytest.raises(ValueError, match="share"):
        _C.simulate_trace(*args, "", 0, -1)


def test_traces_refuse_worlds_too_large_to_draw():
    with pytest.raises(ValueError, match="size"):
        _C.verify_trace(COLLECTIVE["all_reduce"], "ring", 65, 8)
    with pytest.raises(ValueError, match="topology"):
        _C.simulate_trace(COLLECTIVE["all_reduce"], "ring", 8, 4, 0, PRESETS["dgx-h100"].engine_dict(65))


def test_the_compact_form_keeps_op_kinds_it_does_not_list():
    from commlib.explain.codec import decode_case, encode_case
    c = {"P": 2, "schedules": [{"steps": [[{"op": "fence", "peer": 1, "dst": None, "src": ["input", 0, 2]},
                                           {"op": "signal", "peer": 1, "dst": None, "src": None, "tag": 3}],
                                          [{"op": "copy", "peer": None, "dst": ["output", 0, 2], "src": ["input", 0, 2]}]],
                                "scratch_count": 0}],
         "holdings": [[[[[0, 2, 0, [0]]], [[0, 2, -1, []]], None], [[[0, 2, 0, [0]]], [[0, 2, 0, [0, 1]]], None]]]}
    assert decode_case(encode_case(c)) == c
