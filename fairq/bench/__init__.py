"""``fairq bench``: scenarios run under fifo, the lab's round robin, fairq's policies and the peer
queues, in a scratch database, with one report.

``options`` (the command's arguments, light), ``scenarios`` (the workloads), ``runners`` and
``rr`` (one run each, recording a ``recording.RunData``), ``metrics`` (figures from a run),
``report`` (Markdown and plots), ``suite`` (the whole run) and ``peers`` (PgQueuer and
Procrastinate driven the same way). The developer benchmarks in the repository's
``benchmarks/`` import from here.
"""
