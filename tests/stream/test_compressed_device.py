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


# Emulated hosts a, a, b (one emulated device per rank: the emulated NCCL refuses two ranks on one).
TWO_HOSTS = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_EMULATED_DEVICE": ("0", "1", "2"), "COMMLIB_HOST_ID": ("a", "a", "b")}


@pytest.mark.timeout(200)
def test_device_compressed_across_hosts_equals_host_compressed(pool):
    """Rank 2's messages go over the nccl link (the step's NCCL group carries the encoded bytes),
    ranks 0 and 1 through their inboxes: still the host engine's result, identical on every rank."""
    cases = [("all_reduce", "ring", "int8", "float32", "nearest", 37, "sum"),
             ("all_reduce", "direct", "int4", "float16", "stochastic", 13, "avg"),
             ("reduce_scatter", "ring", "fp8_e4m3", "bfloat16", "nearest", 13, "sum"),
             ("all_gather", "ring", "bf16", "float32", "stochastic", 37, "sum")]
    results = pool(3, env=TWO_HOSTS).run(cdc.across_hosts, cases, timeout=150)
    for i, case in enumerate(cases):
        for rank, (r, _) in enumerate(results):
            assert r[i][2] == r[i][1], f"{case}: rank {rank}'s device result differs from the host engine's"
    assert [said for _, said in results] == [""] * 3


@pytest.mark.timeout(120)
def test_device_compress_refuses_bad_input(pool):
    results = pool(3, env=DELAY_ENV).run(cdc.refusals, timeout=90)
    for said, _ in results:
        assert not said, said
    assert len({y for _, y in results}) == 1
