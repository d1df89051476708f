"""The shop's fairq app and tasks, and the code that enqueues them."""

from __future__ import annotations

from typing import Any

import fairq

app = fairq.App()
SENT: list[tuple[str, int]] = []  # the receipts "sent" (a real shop would call its mailer)


@app.task(name="send_receipt", max_attempts=3)
def send_receipt(job: fairq.Job) -> dict[str, Any]:
    order = job.payload["order"]
    if order < 0:
        raise ValueError(f"no such order {order}")
    SENT.append((job.tenant, order))
    return {"sent": order}


def place_order(shop: str, order: int, connection: Any = None) -> int:
    """Record an order (here: nothing else) and queue its receipt in the same transaction."""
    return send_receipt.enqueue(tenant=shop, payload={"order": order}, connection=connection)
