"""The test mode: run jobs without a worker, and assert on what was enqueued (docs/testing.md).

- ``inline(app)``: inside the block an enqueue runs its task at once (nothing is written) and
  the handler's exception propagates; outside it (the default, "manual") jobs are enqueued for
  real.
- ``drain(app, queue=..., tenant=...)``: every due job run in this thread, in fair order, until
  none is due; returns the ``Outcome`` of each.
- ``enqueued``, ``assert_enqueued``, ``refute_enqueued``: what the app's schema holds.
- ``fresh_schema(app)``: the app on a new migrated schema for a block; the pytest plugin's
  ``fairq_app`` and ``fairq_connection`` fixtures are built on it.
"""

from fairq.testing.asserts import assert_enqueued, enqueued, refute_enqueued
from fairq.testing.drain import drain, statuses
from fairq.testing.inline import InlineRun, inline
from fairq.testing.outcome import Outcome
from fairq.testing.schema import fresh_schema

__all__ = ["InlineRun", "Outcome", "assert_enqueued", "drain", "enqueued", "fresh_schema",
           "inline", "refute_enqueued", "statuses"]
