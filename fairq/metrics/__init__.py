"""What fairq tells Prometheus and operators: the workers' metrics with bounded label values, the
/metrics and health server, and the database-side reads of the exporter and ``fairq stats``.

One job per module: ``fold`` (which tenants, queues and tasks keep series of their own),
``hist`` (the histogram accumulator), ``fresh_series`` (new series start at zero),
``observer`` (the worker's ``PrometheusObserver``), ``server`` (the HTTP server), ``checks`` and
``health`` (health checks and the worker's health paths), ``start`` (what ``fairq worker
--metrics-port`` installs), ``exporter`` (``fairq exporter``'s database gauges), ``probe``
(planning vs execution time of the claims), ``stats`` (``fairq stats``). The names below are the
package's public interface; ``exporter``, ``probe`` and ``stats`` are imported by their callers.
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
