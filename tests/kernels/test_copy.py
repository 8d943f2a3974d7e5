"""The executor's bulk copy (csrc/kernels/cpu_copy.cc): byte-exact for every length and alignment,
with and without streaming stores."""
import numpy as np
import pytest

import commlib._C as _C


@pytest.mark.parametrize("stream", [False, True])
def test_copy_every_alignment_and_length(stream):
    rng = np.random.default_rng(7)
    src_all = rng.integers(0, 256, 4096 + 64, dtype=np.uint8)
    for n in (0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1000, 4095):
        for soff in (0, 1, 7, 16, 33):
            for doff in (0, 3, 16, 40):
                dst_all = np.full(n + 128, 0xAB, np.uint8)
                _C.copy_local(dst_all[doff:doff + n], src_all[soff:soff + n], stream)
                assert np.array_equal(dst_all[doff:doff + n], src_all[soff:soff + n]), (n, soff, doff)
                # Nothing outside the destination is touched.
                assert (dst_all[:doff] == 0xAB).all() and (dst_all[doff + n:] == 0xAB).all(), (n, soff, doff)


def test_copy_large_and_checks_sizes():
    src = np.arange(3 << 20, dtype=np.int32)
    dst = np.zeros_like(src)
    _C.copy_local(dst, src, True)
    assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="src"):
        _C.copy_local(dst[:5], src[:6], True)
