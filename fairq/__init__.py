"""fairq: a multi-tenant fair job scheduler on PostgreSQL."""

from fairq.app import App, Task
from fairq.errors import ConfigurationError, FairqError, InvalidInput, LeaseLost
from fairq.models import JobInfo, TenantConfig

__version__ = "0.1.0"

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
    "__version__",
]


def __getattr__(name: str) -> object:
    # fairq.Job lives with the worker runtime; import it lazily to keep `import fairq` light.
    if name == "Job":
        from fairq.job import Job

        return Job
    raise AttributeError(name)
