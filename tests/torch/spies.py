"""The torch tests' one spy on an object's methods (rank side: the Python group a C++ backend could
hand a call to, the communicator its Python backend sends through, a device route, a store)."""
from __future__ import annotations

from contextlib import contextmanager

_ABSENT = object()


@contextmanager
def spy_methods(obj, names, returned_only: bool = False):
    """Inside, a call of any method of ``obj`` named in ``names`` appends the name to the list this
    yields, in call order, and runs the method as before. ``returned_only``: record a call only once
    it returned (a call that raised, an argument check say, did nothing); otherwise record it when
    it is made (whatever it then does, it was reached). Each spy shadows the method on the object
    itself; on leaving, whatever the object held under that name before is put back."""
    seen: list = []
    held = {name: vars(obj).get(name, _ABSENT) for name in names}
    for name in names:
        method = getattr(obj, name)

        def spy(*args, _name=name, _method=method, **kwargs):
            if not returned_only:
                seen.append(_name)
            done = _method(*args, **kwargs)
            if returned_only:
                seen.append(_name)
            return done
        setattr(obj, name, spy)
    try:
        yield seen
    finally:
        for name, before in held.items():
            if before is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, before)
