"""compress= on device buffers (stream/copy_path_codec.cc, docs/compression.md "On device
buffers"): on the emulated device, every proven algorithm of all_reduce, reduce_scatter and
all_gather (count 13 or 37, sum or avg) x codecs x dtypes, stochastic rounding included, ends equal to the host engine's
compressed result bit for bit on every rank (3 ranks: uneven splits; 4: powers of two); bad input
is refused naming the argument."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compressed_device_cases as cdc  # noqa: E402
from emulated_pools import DELAY_ENV  # noqa: E402

CODECS = [("int8", "float32", "nearest"), ("int4", "float16", "stochastic"), ("fp8_e4m3", "bfloat16", "nearest"),
          ("bf16", "float32", "stochastic"), ("fp8_e5m2", "float32", "nearest")]


def _cases(size):
    cases, k = [], 0
    for coll in ("all_reduce", "reduce_scatter", "all_gather"):
        for algo in cdc.proven(coll, size, 13):  # count 13 or 37 (several blocks, uneven splits), rotating
            codec, dtype, rounding = CODECS[k % len(CODECS)]
            count = (13, 37)[(k + size) % 2]
            if algo in cdc.proven(coll, size, count):
                cases.append((coll, algo, codec, dtype, rounding, count, "avg" if k % 3 == 0 else "sum"))
            k += 1
    return cases


@pytest.mark.timeout(240)
@pytest.mark.parametrize("size", [3, 4])
def test_device_compressed_equals_host_compressed(pool, size):
    cases = _cases(size)
    results = pool(size, env=DELAY_ENV).run(cdc.run_cases, cases, timeout=200)
    for i, case in enumerate(cases):
        for rank, r in enumerate(results):
            assert r[i][2] == r[i][1], f"{case}: rank {rank}'s device result differs from the host engine's"
        if case[0] != "reduce_scatter":  # every rank holds the whole result
            assert len({r[i][2] for r in results}) == 1, f"{case}: ranks differ on the device"


@pytest.mark.timeout(120)
def test_device_compress_refuses_bad_input(pool):
    results = pool(3, env=DELAY_ENV).run(cdc.refusals, timeout=90)
    for said, _ in results:
        assert not said, said
    assert len({y for _, y in results}) == 1
