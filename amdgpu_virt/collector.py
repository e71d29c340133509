"""The cyclic garbage collector, paused while large, long-lived state is
built (an extender's list of a cluster, a plan of a fleet)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Pause the cyclic garbage collector (process-wide) for the block.

    Building the state of a large cluster or fleet makes millions of
    objects that all stay alive; the collector's passes over them, ever
    longer as they grow, cost more than the building itself. Reference
    counting still frees what is dropped; cycles wait for the block's end.
    The collector is resumed only if it ran before.

    At the block's end what it made goes straight to the collector's
    oldest generation (:func:`gc.freeze` then :func:`gc.unfreeze` move
    every tracked object there without walking one), as it would after
    the young generations' passes: those passes would walk every object
    made only to find it alive. Cycles among them are still collected, by
    the next full pass. Nothing is promoted while objects are frozen (the
    process's owner froze them: unfreezing would hand them back to the
    collector).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            if not gc.get_freeze_count():
                gc.freeze()
                gc.unfreeze()
            gc.enable()
