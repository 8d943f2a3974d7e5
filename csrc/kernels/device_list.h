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
// Which steps merge, read off the list itself (every rank's schedule of a call has the same shape).
// The list falls into blocks, maximal runs of steps whose lanes' spans (a lane's first to last
// step) overlap, run one after another; a block of two lanes or more merges its rounds where
//   - it is listed in round order (every lane's k-th step before any lane's (k+1)-th): the builders
//     list so exactly where the lanes are in lock step (interleave_rounds: rail_ring's channels on
//     every host map, rail_split where its hierarchical part is in lock step);
//   - or the schedule has a window (rail_window: each lane one segment's rail_halving plain form on
//     equal power-of-two hosts, in lock step; listed diagonally, so not in round order). (In list
//     order in session 29, when its copy-path runs across hosts lost data: the emulated NCCL let a
//     group's later send to a peer pass a held one, session 30: nccl_emulated.cc's run_group.)
// Other blocks stay in list order: rail_lanes' (its lanes, each a pipelined rail_halving, listed one
// after another: a block each; they are not in lock step, and merged a pair's messages of two
// lanes meet out of order) and rail_split's hierarchical part where the parts are listed one after
// another (not in lock step: its block as it is, after the rings' block, merged).
// The device plan check proves every chunk of a merged step received at the step index it is sent
// at, step for step across ranks (check_device_plans), the verifier replays the lists
// (tests/kernels/test_device_laned_lists.py).
#pragma once

#include <vector>

#include "schedule/ir.h"

namespace commlib {

// Whether device_list merges some of `sched`'s rounds (above).
bool device_merges_rounds(const Schedule& sched, int lanes);

// The list the device runs: `sched` with each merging block's lanes' k-th steps in one step (rounds
// without an operation dropped), the other blocks' steps as they are, all in lane 0 with no window;
// `sched` itself where nothing merges. `merged` (optional): per step of the result, whether it holds
// the steps of two lanes or more.
Schedule device_list(const Schedule& sched, int lanes, std::vector<bool>* merged = nullptr);

}  // namespace commlib
