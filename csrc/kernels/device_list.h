// The list the device paths run of a laned schedule (schedule/lanes.h; docs/gpu.md "Laned schedules
// on the device", issue #39). The device runs a call's steps one after another (the kernel path: a
// grid barrier after every step, a step's items spread over the blocks; the copy path: a step's
// sends on one stream, its receives on another, the streams joined between steps), so the list
// order of a schedule whose lanes are listed round by round (rail_ring's C channels) would run the
// channels' ring step k one channel after another: C steps and C grid barriers a round. Where the
// lanes are in lock step (each message's send and its receive at the same round index of their
// lane, on every rank), every lane's k-th step is one step of the device list instead
// (sched::merge_rounds, as hierarchical's phases run a laned algorithm): a step of C concurrent
// exchanges, one grid barrier a round, as before the channels were lanes (session 27).
//
// Which lists merge, read off the list itself (every rank's schedule of a call has the same shape):
//   - a list in round order (every lane's k-th step listed before any lane's (k+1)-th): the
//     builders list so exactly where the lanes are in lock step (interleave_rounds: rail_ring's
//     channels on every host map, rail_split where its hierarchical part is in lock step);
//   - a list under a window (rail_window: each lane one segment's rail_halving plain form on equal
//     power-of-two hosts, in lock step; listed diagonally, so not in round order).
// Others stay in list order: rail_lanes (its lanes, each a pipelined rail_halving, listed one after
// another, are not in lock step: merged, a pair's messages of two lanes meet out of order) and
// rail_split where its parts are listed one after another (the hierarchical part not in lock step).
// The device plan check proves the merged lists step for step across ranks (every chunk sent at the
// step index it is received at: check_device_plans), the verifier replays them
// (tests/kernels/test_device_laned_lists.py).
#pragma once

#include "schedule/ir.h"

namespace commlib {

// Whether device_list merges `sched`'s rounds (lanes > 1 and the list in round order or windowed).
bool device_merges_rounds(const Schedule& sched, int lanes);

// The list the device runs: `sched` with its lanes' k-th steps merged into one step (all in lane 0,
// no window) where device_merges_rounds, else `sched` as it is.
Schedule device_list(const Schedule& sched, int lanes);

}  // namespace commlib
