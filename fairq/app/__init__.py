"""The public Python API: ``fairq.App``, its tasks (``fairq.Task``), enqueueing, and tenant and
group settings; one module each."""

from fairq.app.application import App, PeriodicDecorator, TaskDecorator
from fairq.app.depth import QueueDepth
from fairq.app.enqueue import Item
from fairq.app.task import Task
from fairq.app.tenants import KEEP, Groups, Tenants

__all__ = ["KEEP", "App", "Groups", "Item", "PeriodicDecorator", "QueueDepth", "Task", "TaskDecorator",
           "Tenants"]
