"""fairq: a multi-tenant fair job scheduler on PostgreSQL."""

from fairq._version import __version__
from fairq.app import App, Task
from fairq.errors import ConfigurationError, FairqError, InvalidInput, LeaseLost
from fairq.job import Job
from fairq.models import JobInfo, TenantConfig, TenantExplanation

__all__ = [
    "App",
    "ConfigurationError",
    "FairqError",
    "InvalidInput",
    "Job",
    "JobInfo",
    "LeaseLost",
    "Task",
    "TenantConfig",
    "TenantExplanation",
    "__version__",
]
