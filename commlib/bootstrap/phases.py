"""Named steps of a rendezvous (``commlib.init``'s and a shrink's), where a test can make a rank
stall or die at exactly that point: set ``hook`` to a function of (store prefix, step name). The
steps: ``hosts`` (the ranks found), ``mapped`` (this rank mapped its host's region), ``created``
(the communicator is built, single-copy reads not probed yet); a shrink adds ``claimed`` (its
claim published), ``decided`` (its final set published), ``built`` (the new communicator built)
and ``committed`` (this rank told the others so). Nothing but tests sets ``hook``."""
from __future__ import annotations

from typing import Callable, Optional

hook: Optional[Callable[[str, str], None]] = None


def reached(prefix: str, step: str) -> None:
    """This rank reached ``step`` of the rendezvous under ``prefix``."""
    if hook is not None:
        hook(prefix, step)
