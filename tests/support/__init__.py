"""What the tests share: databases (db), private clusters (pgcluster), worker processes and
fault checks (fault_tools), Prometheus (prom), fair-engine checks (fairtools), paths (paths),
and the child programs the runtime tests start. Import as ``from tests.support.X import ...``."""
