"""What a wrong argument to all_to_all with split sizes raises (the Python path's checks, restated by
the C++ entry: csrc/bindings/device_all_to_allv.cc's plan), shared by the host and the device entry's
tests (tests/host/test_host_a2av_entry.py, tests/stream/test_entry_a2av.py): case name -> (exception
class name, message) at 2 ranks."""

A2AV_ARGUMENT_ERRORS = {
    "input_splits length": ("ValueError", "input_splits: has 1 entries, expected one per rank (2)"),
    "output_splits sum": ("ValueError", "output_splits: sums to 6 but the tensor has 4 elements"),
    "negative split": ("ValueError", "input_splits: negative split size"),
    "own block": ("ValueError", "input_splits/output_splits: this rank sends itself 1 elements but expects 2"),
    "overlap": ("ValueError", "output: overlaps input; all_to_all with splits needs separate buffers"),
    "dtype": ("TypeError", "output: dtype int32 differs from input's int64"),
    "algorithm": ("ValueError", "algorithm: unknown all_to_all algorithm 'nope'"),
}
