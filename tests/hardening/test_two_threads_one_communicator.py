"""Row 6: two Python threads calling collectives on one communicator.

Before: no error, and 272 of 600 results were wrong (the threads' calls paired up differently on
each rank). Now a blocking call made while another thread's blocking call is in flight raises a
CommError naming the misuse, and the communicator is aborted so every rank hears of it.
"""
import threading
import time

import numpy as np

import commlib


def overlapping_blocking_calls(comm):
    sub = comm.split(0)
    try:
        errors = []

        def call(delay):
            time.sleep(delay)
            try:
                sub.all_reduce(np.ones(8, np.float32))
            except commlib.CommError as e:
                errors.append(str(e))

        if sub.rank == 0:
            first = threading.Thread(target=call, args=(0.0,))
            first.start()        # waits in all_reduce: rank 1 joins only later
            time.sleep(0.3)
            call(0.0)            # a second thread's blocking call while the first is in flight
            first.join(20)
        else:
            call(1.0)
        return errors
    finally:
        sub.close()


def test_concurrent_blocking_calls_raise_on_every_rank(pool):
    errors = pool(2).run(overlapping_blocking_calls, timeout=30)
    assert any("two threads made blocking calls" in e for e in errors[0]), errors
    assert errors[1] and "two threads made blocking calls" in errors[1][0], errors


def hammer(comm, iterations):
    """Two threads per rank, each all_reducing its own tag; count wrong results and errors."""
    sub = comm.split(0)
    wrong, refused = [0], []

    def worker(tag):
        for _ in range(iterations):
            x = np.full(64, tag, np.int64)
            try:
                sub.all_reduce(x)
            except commlib.CommError as e:
                refused.append(str(e))
                return
            if not (x == tag * sub.size).all():
                wrong[0] += 1

    threads = [threading.Thread(target=worker, args=(t,)) for t in (1, 1000)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    sub.close()
    return wrong[0], refused


def test_two_threads_hammering_are_stopped(pool):
    results = pool(2).run(hammer, 300, timeout=60)
    assert all(refused for _, refused in results), results
    assert any("two threads" in msg for _, refused in results for msg in refused), results


def async_from_other_thread(comm):
    """Allowed: async calls from one thread while another thread waits on them (the torch backend's
    completion thread), and blocking calls from different threads one after another."""
    sub = comm.split(0)
    try:
        xs = [np.full(32, i, np.int64) for i in range(20)]
        works = [sub.all_reduce(x, async_op=True) for x in xs]
        waiter = threading.Thread(target=lambda: [w.wait() for w in works])
        waiter.start()
        waiter.join(20)
        y = np.ones(4, np.int64)
        t = threading.Thread(target=sub.all_reduce, args=(y,))
        t.start()
        t.join(20)
        return all((x == i * sub.size).all() for i, x in enumerate(xs)) and (y == sub.size).all()
    finally:
        sub.close()


def test_legitimate_multithreaded_use_still_works(pool):
    assert pool(2).run(async_from_other_thread, timeout=30) == [True, True]
