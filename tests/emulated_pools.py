"""The environment of the rank pools on the emulated device that tests of several directories
share (tests/stream, tests/device, tests/host's error matrix, tests/torch): a pool is cached per
world size and environment (commlib.testing.get_pool), so one environment means one pool of each
size for all of them, not one per module.

The stream delay is on (COMMLIB_EMULATED_DELAY_US: every emulated operation is perturbed), and the
inbox slots are 256 KiB (auto would take 4 MiB up to 4 ranks): the ~1M-element calls of the device
matrix then move in many chunks per message, so it keeps checking slot reuse and chunk boundaries,
and the point-to-point cases' larger messages take several chunks."""

DELAY_ENV = {"COMMLIB_EMULATED_DELAY_US": "20", "COMMLIB_DEVICE_SLOT_BYTES": "262144"}
