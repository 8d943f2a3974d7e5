"""schedule()/algorithms()/format_schedule() structure, argument errors, and algorithm choice
(env override and tuning table)."""
import pytest

import commlib._C as _C
from commlib.core import schedules
from commlib.core import call_spec
from commlib.core import tuning
from commlib.core.call_spec import COLLECTIVE

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "gather",
         "scatter", "barrier"]


def test_algorithms_lists():
    assert _C.algorithms(_C.Collective.all_reduce)[0] == "ring"
    for c in COLLS:
        names = schedules.algorithms(c)
        assert names and len(set(names)) == len(names) and "auto" not in names
    assert schedules.algorithms("send") == [] and schedules.algorithms("recv") == []
    with pytest.raises(ValueError, match="collective"):
        schedules.algorithms("allreduce")


def test_schedule_structure():
    s = schedules.schedule("all_reduce", "ring", rank=1, size=3, count=7)
    assert set(s) == {"steps", "scratch_count", "algorithm", "lanes"}
    assert s["algorithm"] == "ring" and s["scratch_count"] == 0 and s["lanes"] == 1
    assert len(s["steps"]) == 2 * 2  # reduce-scatter + all-gather, no input->output copy step
    kinds = {"send", "recv", "recv_reduce", "copy", "reduce"}
    for step in s["steps"]:
        assert isinstance(step, list)
        for op in step:
            assert set(op) == {"op", "peer", "dst", "src"}
            assert op["op"] in kinds
            if op["op"] == "send":
                assert op["dst"] is None and isinstance(op["peer"], int)
            elif op["op"] == "recv":
                assert op["src"] is None and isinstance(op["peer"], int)
            elif op["op"] == "recv_reduce":  # the ring reduces from its input: src is given
                assert op["src"][0] == "input" and op["src"][2] == op["dst"][2] and isinstance(op["peer"], int)
            else:
                assert op["peer"] is None
            for reg in (op["dst"], op["src"]):
                if reg is not None:
                    buf, off, n = reg
                    assert buf in ("input", "output", "scratch") and off >= 0 and n >= 0
    # rank 1 of 3: first reduce-scatter step sends block 1 (elements 3:5) of its input to 2, and
    # reduces block 0 from 0 with its input's block 0 into the output
    assert s["steps"][0] == [{"op": "send", "peer": 2, "dst": None, "src": ("input", 3, 2)},
                             {"op": "recv_reduce", "peer": 0, "dst": ("output", 0, 3), "src": ("input", 0, 3)}]
    assert s["steps"][1][0] == {"op": "send", "peer": 2, "dst": None, "src": ("output", 0, 3)}


def test_schedule_scratch_and_auto():
    s = schedules.schedule("all_reduce", "direct", 0, 4, 10)
    assert s["scratch_count"] == 30
    a = schedules.schedule("all_reduce", "auto", 0, 4, 10)
    assert a["algorithm"] in schedules.algorithms("all_reduce")
    # the positional order of the C function
    assert _C.schedule(_C.Collective.broadcast, "binomial", 2, 4, 5, 2) == schedules.schedule("broadcast", "binomial", 2, 4, 5, root=2)


def test_format_schedule():
    s = schedules.schedule("all_reduce", "ring", 0, 3, 6)
    text = schedules.format_schedule(s, "all_reduce", 0, 3, 6)
    lines = text.splitlines()
    assert lines[0].startswith("all_reduce/ring rank 0 of 3 count 6")
    assert len(lines) == 1 + len(s["steps"])
    assert "step 0: send(to 1, input[0:2]) | recv_reduce(from 2, output[4:6] <- input[4:6])" in text
    assert schedules.format_schedule(schedules.schedule("barrier", "dissemination", 0, 1, 0)).startswith("dissemination")


@pytest.mark.parametrize("kwargs,name", [
    (dict(rank=3, size=3), "rank"),
    (dict(rank=-1, size=3), "rank"),
    (dict(size=0), "size"),
    (dict(count=-1), "count"),
    (dict(root=4, size=4, collective="broadcast", algorithm="binomial"), "root"),
    (dict(root=-1, size=4, collective="gather", algorithm="linear"), "root"),
    (dict(algorithm="foo"), "algorithm"),
    (dict(collective="foo"), "collective"),
    (dict(collective="send", algorithm="auto"), "collective"),
    (dict(collective="barrier", algorithm="dissemination", count=3), "count"),
])
def test_bad_arguments(kwargs, name):
    args = dict(collective="all_reduce", algorithm="ring", rank=0, size=2, count=4, root=0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=f"^{name}:"):
        schedules.schedule(**args)


def test_unknown_algorithm_message():
    with pytest.raises(ValueError) as e:
        schedules.schedule("all_reduce", "foo", 0, 2, 4)
    assert str(e.value).startswith("algorithm: unknown all_reduce algorithm 'foo' (expected one of: ring, ")
    with pytest.raises(ValueError, match="^algorithm: unknown all_gather"):
        schedules.verify("all_gather", "rabenseifner", 4, 4)


def test_verify_bad_arguments():
    with pytest.raises(ValueError, match="^size:"):
        schedules.verify("all_reduce", "ring", 16385, 1)
    with pytest.raises(ValueError, match="^size:"):
        schedules.verify("all_reduce", "ring", 0, 1)
    with pytest.raises(ValueError, match="^count:"):
        schedules.verify("all_reduce", "ring", 2, -1)
    with pytest.raises(ValueError, match="^root:"):
        schedules.verify("reduce", "binomial", 2, 1, root=2)
    assert schedules.verify("all_reduce", "ring", 4, 5) == "ring"


def test_root_ignored_for_unrooted():
    assert schedules.schedule("all_reduce", "ring", 0, 2, 4, root=7) == schedules.schedule("all_reduce", "ring", 0, 2, 4)


@pytest.fixture
def clean(monkeypatch):
    for c in COLLS:
        monkeypatch.delenv("COMMLIB_ALGO_" + c.upper(), raising=False)
    _C.clear_tuning()
    yield monkeypatch
    _C.clear_tuning()
    tuning.load_default()  # as the import left it: a later test in this process may read the shipped table


def test_choose_explicit_and_heuristic(clean):
    assert _C.choose_algorithm(_C.Collective.all_reduce, "ring", 1 << 30, 8) == "ring"
    with pytest.raises(ValueError, match="^algorithm: unknown all_reduce algorithm 'nope'"):
        _C.choose_algorithm(_C.Collective.all_reduce, "nope", 8, 8)
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 64, 8) == "recursive_doubling"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 1 << 28, 8) == "ring"
    assert _C.choose_algorithm(_C.Collective.barrier, "auto", 0, 8) == "dissemination"
    for c in COLLS:
        for size in (1, 2, 3, 8, 64):
            for nbytes in (0, 100, 1 << 16, 1 << 26):
                assert _C.choose_algorithm(COLLECTIVE[c], "auto", nbytes, size) in schedules.algorithms(c)


def test_choose_env_override(clean):
    clean.setenv("COMMLIB_ALGO_ALL_REDUCE", "tree")
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 64, 8) == "tree"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "ring", 64, 8) == "ring"  # explicit name wins
    assert schedules.schedule("all_reduce", "auto", 0, 4, 8)["algorithm"] == "tree"
    assert _C.choose_algorithm(_C.Collective.all_gather, "auto", 64, 8) != "tree"  # per collective
    clean.setenv("COMMLIB_ALGO_ALL_TO_ALL", "bruck")
    assert _C.choose_algorithm(_C.Collective.all_to_all, "auto", 1 << 30, 2) == "bruck"
    clean.setenv("COMMLIB_ALGO_ALL_REDUCE", "auto")
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 64, 8) == "recursive_doubling"
    clean.setenv("COMMLIB_ALGO_ALL_REDUCE", "bogus")
    with pytest.raises(ValueError, match="^COMMLIB_ALGO_ALL_REDUCE: unknown all_reduce algorithm 'bogus'"):
        _C.choose_algorithm(_C.Collective.all_reduce, "auto", 64, 8)


def test_tuning_table(clean):
    _C.set_tuning(_C.Collective.all_reduce, [(4, -1, "ring"), (4, 1024, "direct"), (4, 65536, "two_shot"), (8, 100, "tree")])
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 10, 4) == "direct"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 1024, 4) == "direct"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 1025, 4) == "two_shot"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 1 << 30, 4) == "ring"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 50, 8) == "tree"
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 500, 8) == "recursive_doubling"  # heuristic
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 50, 5) == "recursive_doubling"  # no rows: heuristic
    assert _C.choose_algorithm(_C.Collective.all_reduce, "rabenseifner", 10, 4) == "rabenseifner"
    clean.setenv("COMMLIB_ALGO_ALL_REDUCE", "rabenseifner")  # env beats the table
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 10, 4) == "rabenseifner"
    clean.delenv("COMMLIB_ALGO_ALL_REDUCE")
    _C.set_tuning(_C.Collective.all_reduce, [])  # replacing with no rows clears that collective
    assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 10, 4) == "recursive_doubling"
    _C.set_tuning(_C.Collective.broadcast, [(2, -1, "pipeline")])
    _C.clear_tuning()
    assert _C.choose_algorithm(_C.Collective.broadcast, "auto", 10, 2) == "binomial"
    with pytest.raises(ValueError, match="^tuning: unknown all_gather algorithm 'rabenseifner'"):
        _C.set_tuning(_C.Collective.all_gather, [(4, 10, "rabenseifner")])
    with pytest.raises(ValueError, match="collective"):
        _C.set_tuning(call_spec.collective("nope"), [])


def test_tuning_thread_safety(clean):
    import threading
    stop = False
    errors = []

    def reader():
        while not stop:
            try:
                assert _C.choose_algorithm(_C.Collective.all_reduce, "auto", 10, 4) in ("direct", "recursive_doubling")
            except Exception as e:  # pragma: no cover
                errors.append(e)

    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    for _ in range(300):
        _C.set_tuning(_C.Collective.all_reduce, [(4, -1, "direct")])
        _C.clear_tuning()
    stop = True
    for t in ts:
        t.join()
    assert not errors


def test_auto_resolves_from_bytes_not_elements(clean):
    # 50 elements: 200 bytes of float32, 50 of int8. verify() once passed the element count where
    # the chooser takes bytes, so float32 calls resolved like int8 ones.
    _C.set_tuning(_C.Collective.all_reduce, [(4, 100, "tree"), (4, -1, "two_shot")])
    assert schedules.verify("all_reduce", "auto", 4, 50) == "two_shot"
    assert schedules.verify("all_reduce", "auto", 4, 50, dtype="int8") == "tree"
    assert schedules.verify("all_reduce", "auto", 4, 50, dtype="float64") == "two_shot"
    assert schedules.schedule("all_reduce", "auto", 0, 4, 50)["algorithm"] == "two_shot"
    assert schedules.schedule("all_reduce", "auto", 0, 4, 50, dtype="int8")["algorithm"] == "tree"
