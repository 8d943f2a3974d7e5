"""The ordered bucket launcher DDP and ZeRO-2/3 share (commlib/parallel/_buckets.py): buckets go in
their fixed order whatever order their gradients come in, so every rank launches the same
collectives in the same order. No ranks: the launch is recorded."""
from types import SimpleNamespace

from commlib.parallel._buckets import OrderedLauncher, dtype_buckets, param_slots


def _buckets(*sizes):
    return [SimpleNamespace(name=f"b{i}", params=list(range(n)), ready=0) for i, n in enumerate(sizes)]


def test_a_bucket_goes_only_once_complete_and_after_every_bucket_before_it():
    buckets = _buckets(2, 1, 1)
    launched = []
    launcher = OrderedLauncher(buckets, lambda b: launched.append(b.name))
    launcher.begin()
    b0, b1, b2 = buckets
    launcher.gradient_ready(b2)  # complete, but b0 and b1 are not: held back
    launcher.gradient_ready(b0)
    assert launched == []
    launcher.gradient_ready(b1)  # complete, b0 still not
    assert launched == []
    launcher.gradient_ready(b0)  # b0 complete: b0, then the held-back b1 and b2, in order
    assert launched == ["b0", "b1", "b2"]
    assert launcher.launched_early == 3 and len(launcher.launch_times) == 3
    launcher.launch_rest()
    assert launched == ["b0", "b1", "b2"]  # nothing launched twice


def test_backward_end_launches_the_rest_in_order_and_the_next_backward_starts_over():
    buckets = _buckets(1, 2, 1)
    launched = []
    launcher = OrderedLauncher(buckets, lambda b: launched.append(b.name))
    launcher.begin()
    launcher.gradient_ready(buckets[0])
    launcher.gradient_ready(buckets[2])
    launcher.launch_rest()  # b1 never completed (unused parameter): it still goes, before b2
    assert launched == ["b0", "b1", "b2"] and launcher.launched_early == 1
    for b in buckets:
        b.ready = 0
    launcher.reset()
    launcher.begin()
    assert launcher.launched_early == 0 and launcher.launch_times == []
    launcher.gradient_ready(buckets[0])
    assert launched == ["b0", "b1", "b2", "b0"]


def test_buckets_hold_one_dtype_each_in_order_and_every_parameter_has_its_slot():
    import torch
    ps = [torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(4), torch.zeros(8)]
    got = dtype_buckets(ps, 32, 16)  # float32: 16 B, 16 B, 32 B; first bucket closes at 16 B
    assert [(d, [id(p) for p in b]) for d, b in got] == [
        (torch.float32, [id(ps[0])]), (torch.float32, [id(ps[2]), id(ps[3])]), (torch.float64, [id(ps[1])])]
    buckets = [SimpleNamespace(params=b) for _, b in got]
    slots = param_slots(buckets)
    assert slots[id(ps[3])] == (buckets[1], 1) and slots[id(ps[1])] == (buckets[2], 0)
