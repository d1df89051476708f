"""What a scheduling policy is: a name, the named claim statement it runs, its parameters, and
a pure-Python reference model that property tests compare the database against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Policy:
    """A claim policy. Adding one means adding an instance to the registry, not touching workers.

    ``statement`` names a complete statement in ``fairq/sql/*.sql``; ``params`` are the bound
    parameters that select this policy's variant of it (booleans, never SQL fragments).
    """

    name: str
    statement: str
    # The statement has a `wait` parameter: run it again with wait = true when it returned its
    # one row of NULLs (it took nothing while holding a lock, so it could not wait).
    waits: bool = False
    params: tuple[tuple[str, Any], ...] = ()
    description: str = ""

    def claim_params(self, *, queue: str, batch: int, worker: str) -> dict[str, Any]:
        """The full parameter dict for one claim."""
        values: dict[str, Any] = dict(self.params)
        # The fair walk's virtual-time window: one batch ahead of the first runnable tenant.
        values.update(queue=queue, batch=batch, worker=worker, window=float(batch), wait=False)
        return values
