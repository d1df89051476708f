"""Worker metrics for Prometheus, with bounded label values, and the /metrics + /healthz server.

One job per module: ``fold`` (which tenants, queues and tasks keep series of their own),
``hist`` (the histogram accumulator), ``observer`` (the worker's ``PrometheusObserver``),
``server`` (the HTTP server), ``checks`` (health checks), ``start`` (what ``fairq worker
--metrics-port`` installs). The names below are the package's public interface.
"""

from fairq.metrics.checks import all_of, db_check
from fairq.metrics.fold import ENV_MAX_TENANTS, OTHER, TenantFold, max_tenants_from_env
from fairq.metrics.hist import Hist
from fairq.metrics.observer import (
    CLAIM_BUCKETS,
    OUTCOMES,
    RESULTS,
    RUN_BUCKETS,
    WAIT_BUCKETS,
    PrometheusObserver,
)
from fairq.metrics.server import MetricsServer, serve
from fairq.metrics.start import start_worker_metrics

__all__ = ["CLAIM_BUCKETS", "ENV_MAX_TENANTS", "OTHER", "OUTCOMES", "RESULTS", "RUN_BUCKETS",
           "WAIT_BUCKETS", "Hist", "MetricsServer", "PrometheusObserver", "TenantFold", "all_of",
           "db_check", "max_tenants_from_env", "serve", "start_worker_metrics"]
