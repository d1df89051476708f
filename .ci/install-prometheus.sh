#!/usr/bin/env bash
# Make `prometheus` and `promtool` available (Debian package) for the dashboard and alert tests.
exec bash "$(dirname "${BASH_SOURCE[0]}")/install-deb.sh" prometheus prometheus promtool
