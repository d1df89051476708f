"""What the tests share: databases (db), private clusters (pgcluster), a primary and its
streaming standby (pgreplica), worker processes and fault checks (fault_tools), the fail-over
scenario's producer, events and comparison (failover_tools, failover_app), Prometheus (prom),
fair-engine checks (fairtools), paths (paths), and the child programs the runtime tests start.
Import as ``from tests.support.X import ...``."""
