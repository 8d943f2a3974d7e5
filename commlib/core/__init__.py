"""The core API over the C++ communicator: Communicator and Work, the argument checks made before
anything is sent (call_checks, p2p_plan), schedules and the verifier
(schedules), auto's tuning table (tuning), and the route of device buffers to the stream engine
(device_route)."""
