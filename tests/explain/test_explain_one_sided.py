"""The explorer's model of one-sided ops (commlib/explain/template/model.js, run under node where
there is one): reduce_to_all and reduce_from_all name no peer, but move bytes between every pair, so
the page draws them as arrows, not as a rank's local op: a get_reduce from every peer (its src
added) and, for reduce_to_all, a put to every peer (the result stored there)."""
import json
import os
import shutil
import subprocess

import pytest

import explain_expected as X

MODEL = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                     "commlib", "explain", "template", "model.js")


def _model(scheds, k):
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to run the page's model")
    with open(MODEL) as f:
        src = f.read()
    script = src + f"\nconst c = {{schedules: {json.dumps(scheds)}}};\n" \
                   f"console.log(JSON.stringify({{m: messages(c)[{k}] || [], l: localOps(c, {k})}}));"
    out = subprocess.run([node, "-e", script], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    return {(m["src"], m["dst"], m["op"]) for m in got["m"]}, [o["op"] for o in got["l"]]


@pytest.mark.parametrize("collective,algorithm,puts", [("all_reduce", "mapped_fused_two_shot", True),
                                                      ("reduce_scatter", "mapped_fused", False)])
def test_ops_over_every_rank_are_drawn_as_arrows_to_every_peer(collective, algorithm, puts):
    P = 3
    scheds = X.schedules(collective, algorithm, P, 6, [0] * P)
    step = next(k for k, ops in enumerate(scheds[0]["steps"]) if any(o["op"].startswith("reduce_") for o in ops))
    arrows, local = _model(scheds, step)
    want = {(q, r, "get_reduce") for r in range(P) for q in range(P) if q != r}
    if puts:
        want |= {(r, q, "put") for r in range(P) for q in range(P) if q != r}
    assert arrows == want
    assert not any(op.startswith("reduce_") for op in local), local  # no longer a local op
