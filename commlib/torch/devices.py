"""The devices the "commlib" torch backend tells torch it serves, and how a group answers torch's
helpers that ask it for them.

torch picks devices for its own staging tensors from what a backend registered: object collectives
(``_get_object_coll_device``), ``_get_pg_default_device`` (FSDP's optimizer state, DCP's planner,
sharded state dicts) and ``ShardedTensor``'s gather (which, for any backend but gloo and NCCL, takes
the backend's first non-CPU device). Registering "cuda" where no CUDA tensor can exist sends those
helpers to a device that is not there ("Torch not compiled with CUDA enabled"), so:

* "cpu" is always registered;
* "cuda" is registered when the CUDA path can serve it (``cuda_served``): torch was built with CUDA
  (``torch.version.cuda``), torch sees at least one device (``torch.cuda.device_count()``, which
  asks NVML and so leaves the CUDA runtime of the importing process untouched: a launcher that
  forks after ``import commlib.torch`` still works), and commlib was built with its CUDA module
  (``commlib._C_cuda`` is found). That module is imported at the first call on a CUDA tensor; if
  it cannot load there (say, a driver older than its CUDA runtime), that call raises naming why.

Which path a call takes is decided per call by its tensors (stream_work.py), not by this list:
collectives on CPU tensors always run on the host.

A Python ``ProcessGroup`` subclass cannot register a C++ backend per device, so torch's
``group._device_types`` would be empty (``_get_pg_default_device`` then raises "Default device
not found") and ``group._get_backend(device)`` would raise. ``DeviceTypesMixin`` answers both from
the same source as torch's ``BackendConfig``.
"""
from __future__ import annotations

import importlib.util

import torch
import torch.distributed as dist

BACKEND_NAME = "commlib"


def cuda_served() -> bool:
    """Whether collectives on CUDA tensors can run in this process (see the module docstring)."""
    if torch.version.cuda is None:  # a CPU (or ROCm) build of torch: no CUDA tensor can exist
        return False
    if importlib.util.find_spec("commlib._C_cuda") is None:  # commlib built without nvcc
        return False
    return torch.cuda.device_count() > 0


def served_devices() -> list:
    """The device types to register the backend for: "cpu", and "cuda" where it is served."""
    return ["cpu", "cuda"] if cuda_served() else ["cpu"]


def group_device_types(pg) -> list:
    """The device types torch assigned to commlib for ``pg``: those of the backend string it was
    created with ("commlib" gives every registered device, "cpu:commlib" only "cpu")."""
    entry = dist.distributed_c10d._world.pg_map.get(pg)
    spec = entry[0] if entry is not None else BACKEND_NAME
    try:
        mapping = dist.BackendConfig(spec).get_device_backend_map()
    except (ValueError, KeyError):  # not a backend string torch parses: what was registered
        return list(dist.Backend.backend_capability.get(BACKEND_NAME, ["cpu"]))
    return [d for d, b in mapping.items() if str(b) == BACKEND_NAME]


class DeviceTypesMixin:
    """What torch asks a process group about devices, answered for a Python ProcessGroup that is
    its own backend for every device it serves. The ``supports_*`` flags are the capabilities
    torch reads off the object ``_get_backend`` returns (none of those features here)."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    @property
    def _device_types(self):
        return [torch.device(d) for d in group_device_types(self)]

    def _get_backend(self, device):
        kind = torch.device(device).type
        if kind not in group_device_types(self):
            # torch's own message, which its callers expect as a RuntimeError
            raise RuntimeError(f"No backend type associated with device type {kind}")
        return self

    def supports_tensor_alloc(self, device) -> bool:  # noqa: ARG002 - torch's signature
        """No backend-owned allocator: FSDP2 then allocates with ``torch.empty``."""
        return False


def _named_tensors(name, value):
    """(label, tensor) for every tensor in ``value`` (nested lists labelled ``name[i][j]``)."""
    if isinstance(value, torch.Tensor):
        yield name, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _named_tensors(f"{name}[{i}]", v)


def check_one_device(**named):
    """Refuse, before anything is sent, a call whose tensors (keyword: torch's argument name,
    value: a tensor or nested lists of them) are not all on one device, naming the odd one. The
    path of a call is picked from its outputs (stream_work.cuda_device) and its staging buffers
    are made on its input's device: CUDA outputs with a CPU input would otherwise run a host call
    under the stream path, whose copies out run before that call has finished."""
    first = None
    for name, value in named.items():
        for label, t in _named_tensors(name, value):
            if first is None:
                first = (label, t.device)
            elif t.device != first[1]:
                raise ValueError(f"{label}: is on {t.device} but {first[0]} is on {first[1]}; "
                                 "the tensors of one call must all be on one device")
