"""Trace context from an enqueue to its job's attempts (docs/tracing.md)."""
