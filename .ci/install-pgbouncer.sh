#!/usr/bin/env bash
# Make `pgbouncer` available (Debian package) for tests/test_pgbouncer.py. Idempotent and quiet;
# the packaged service is never started (each test runs its own pgbouncer on a free port).
set -euo pipefail
if command -v pgbouncer >/dev/null 2>&1 || [ -x /usr/sbin/pgbouncer ]; then
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq >/dev/null
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
$SUDO apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null
