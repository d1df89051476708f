"""fairq's exceptions: the ones users catch."""

from __future__ import annotations


class FairqError(Exception):
    """Base class of fairq's own errors."""


class InvalidInput(FairqError, ValueError):
    """Bad input from the caller, detected before anything is written."""


class LeaseLost(FairqError):
    """The job's lease expired and it was re-claimed, finished or cancelled elsewhere."""


class ConfigurationError(FairqError):
    """fairq cannot find or reach its database."""
