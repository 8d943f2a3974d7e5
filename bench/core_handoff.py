"""How fast the machine's two cores hand data to each other, sampled over time: the probe behind
issue #42's slow spells (bench/RESULTS_collectives.md, session 24).

    python bench/core_handoff.py --seconds 600 --out /tmp/levels.txt &     # beside the runs
    python bench/spells.py run1.json ... --levels /tmp/levels.txt

Two threads pinned to two CPUs (default 0 and 1) take turns, each window ``--window-ms`` long
(default 20) every ``--every`` seconds (default 2; about 1-2% of two cores): a cache line's round
trip, and a 128 KiB buffer written on the first CPU and read (summed) on the second. Each window
prints one line ``epoch_seconds round_trip_ns handoff_ns`` (the minimum over the window's samples:
what the hardware took when both threads ran; -1 when no sample completed, e.g. the other CPU was
busy throughout). On the project's 2-core VMs the round trip has two levels, 80-100 ns and
290-460 ns, in stretches of seconds to minutes, and the 128 KiB hand-off 4.6-4.7 µs against
5.8-7.4 µs; on the slow level a 2-rank 32 KiB reduce_scatter takes 2.8x as long (commlib) and
2.0x (Open MPI): the slow spells of bench/RESULTS_collectives.md session 24. The probe is C (compiled here with ``cc`` into a temporary directory): Python's own
overhead per round trip would hide a 300 ns difference.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define WORDS (128 * 1024 / 8)
static _Alignas(128) atomic_long ping;
static _Alignas(128) atomic_long pong;
static atomic_int stop, active;
static long* buf;
static volatile long sink;
static int cpu_a, cpu_b;
static void pin(int c) { cpu_set_t s; CPU_ZERO(&s); CPU_SET(c, &s); pthread_setaffinity_np(pthread_self(), sizeof s, &s); }
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
static void* echo(void* unused) {
  (void)unused; pin(cpu_b); long last = 0;
  while (!atomic_load(&stop)) {
    if (!atomic_load(&active)) { struct timespec z = {0, 1000000}; nanosleep(&z, 0); continue; }
    long v = atomic_load_explicit(&ping, memory_order_acquire);
    if (v != last) {
      last = v;
      if (v < 0) { long s = 0; for (int i = 0; i < WORDS; i++) s += buf[i]; sink = s; }
      atomic_store_explicit(&pong, v, memory_order_release);
    }
  }
  return 0;
}
/* one round trip (big: after writing the buffer, which the other side reads); -1 after 200 us */
static double trip(long v, int big) {
  if (big) for (int i = 0; i < WORDS; i++) buf[i] = v + i;
  long want = big ? -v : v;
  double t0 = now();
  atomic_store_explicit(&ping, want, memory_order_release);
  while (atomic_load_explicit(&pong, memory_order_acquire) != want) {
    if (now() - t0 > 200000) { while (atomic_load(&pong) != want) sched_yield(); return -1; }
  }
  return now() - t0;
}
int main(int argc, char** argv) {
  int windows = atoi(argv[1]); double window_ns = atof(argv[2]) * 1e6; double every_s = atof(argv[3]);
  cpu_a = atoi(argv[4]); cpu_b = atoi(argv[5]);
  pin(cpu_a); buf = aligned_alloc(4096, WORDS * 8); memset(buf, 0, WORDS * 8);
  pthread_t th; pthread_create(&th, 0, echo, 0);
  long v = 1;
  for (int w = 0; w < windows; w++) {
    atomic_store(&active, 1);
    { struct timespec z = {0, 2000000}; nanosleep(&z, 0); }
    double best_rt = -1, best_big = -1, t0 = now();
    for (int k = 0; now() - t0 < window_ns; k++) {
      double x = trip(++v, 0);
      if (x > 0 && (best_rt < 0 || x < best_rt)) best_rt = x;
      if (k % 4 == 3) { double y = trip(++v, 1); if (y > 0 && (best_big < 0 || y < best_big)) best_big = y; }
    }
    atomic_store(&active, 0);
    struct timespec ts; clock_gettime(CLOCK_REALTIME, &ts);
    printf("%ld.%03ld %.0f %.0f\n", (long)ts.tv_sec, ts.tv_nsec / 1000000, best_rt, best_big);
    fflush(stdout);
    double rest = every_s * 1e9 - (now() - t0);
    if (rest > 0) { struct timespec z = {(time_t)(rest / 1e9), (long)((long long)rest % 1000000000LL)}; nanosleep(&z, 0); }
  }
  atomic_store(&stop, 1); pthread_join(th, 0);
  return 0;
}
"""


def build(directory: str) -> str:
    """Compile the probe into ``directory``; its path. SystemExit naming what is missing."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise SystemExit("core_handoff.py: no C compiler (cc or gcc) on PATH")
    src, exe = os.path.join(directory, "core_handoff.c"), os.path.join(directory, "core_handoff")
    with open(src, "w") as f:
        f.write(SOURCE)
    subprocess.run([cc, "-O2", "-pthread", "-o", exe, src], check=True)
    return exe


def read_levels(path):
    """[(epoch seconds, round trip ns, hand-off ns)] of a probe's output (lines with -1 kept)."""
    out = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3:
                out.append((float(parts[0]), float(parts[1]), float(parts[2])))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--every", type=float, default=2.0, help="seconds between windows (default 2)")
    ap.add_argument("--window-ms", type=float, default=20.0, help="length of a window (default 20 ms)")
    ap.add_argument("--cpus", default="0,1", help="the two CPUs (default 0,1)")
    ap.add_argument("--out", default="-", help="file to write the lines to (default: stdout)")
    a = ap.parse_args(argv)
    cpu_a, cpu_b = (int(x) for x in a.cpus.split(","))
    windows = max(1, int(a.seconds / a.every))
    with tempfile.TemporaryDirectory(prefix="core-handoff-") as tmp:
        exe = build(tmp)
        out = sys.stdout if a.out == "-" else open(a.out, "w")
        try:
            return subprocess.run([exe, str(windows), str(a.window_ms), str(a.every), str(cpu_a), str(cpu_b)],
                                  stdout=out).returncode
        finally:
            if out is not sys.stdout:
                out.close()


if __name__ == "__main__":
    sys.exit(main())
