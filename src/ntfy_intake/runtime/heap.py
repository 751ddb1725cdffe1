"""The garbage collector and the objects start-up leaves: frozen once the daemon is serving.

By the time the HTTP surface starts, the daemon has imported everything it runs (the HTTP stack
last) and rebuilt its state: tens of thousands of objects that live as long as the process. Each
full (generation 2) collection walks all of them, holding the interpreter lock meanwhile: 15 to
50 ms on a small shared machine, every few dozen console pages (a page's rows, alive during a
younger collection, are promoted and start the next full one), and the writer's thread and the
event loop wait it out. Frozen (`gc.freeze`), they are left out of every later collection, so a
full collection walks only what was made since. Unfrozen when the surface stops, so a process
that runs daemons one after another (the tests) collects each one's objects after it.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen() -> Iterator[None]:
    """Collect once (what is garbage now would stay), freeze the rest, unfreeze on the way out."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
