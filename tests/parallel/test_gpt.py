"""The tiny GPT trained 10 SGD steps sharded over (tp, cp) on 4 ranks matches single-process
training: per-step loss and final parameters within 1e-5 (gpt_cases.GPT_TOL, fp32)."""
import pytest

from parallel import gpt_cases as C

MODES = [  # (tp, cp, cp_mode, layout, sequence_parallel, ulysses_size)
    (2, 2, "ring", "zigzag", False, None),
    (2, 2, "ring", "contiguous", False, None),
    (2, 2, "ulysses", "contiguous", False, None),
    (2, 2, "ring", "zigzag", True, None),
    (1, 4, "hybrid", "zigzag", False, 2),
    (4, 1, "ring", "contiguous", True, None),
]


@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"tp{m[0]}-cp{m[1]}-{m[2]}-{m[3]}{'-sp' if m[4] else ''}")
def test_gpt_matches_single_process(pool, mode):
    res = pool(4).run(C.gpt_train, *mode)
    worst = max(max(v for k, v in r.items() if not k.endswith("_loss")) for r in res)
    assert worst <= C.GPT_TOL, res[0]
    assert res[0]["last_loss"] < res[0]["first_loss"]
