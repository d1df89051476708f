#!/usr/bin/env bash
# Make `pgbouncer` available (Debian package) for tests/runtime/test_pgbouncer.py.
exec bash "$(dirname "${BASH_SOURCE[0]}")/install-deb.sh" pgbouncer pgbouncer
