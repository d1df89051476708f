#!/usr/bin/env bash
# install-deb.sh PACKAGE BINARY... : make Debian's PACKAGE available unless every BINARY is
# already on PATH (or in /usr/sbin). Idempotent and quiet; the packaged service is never
# started (policy-rc.d), since tests run their own servers on free ports.
set -euo pipefail
package="$1"; shift
have_all=1
for bin in "$@"; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ] || have_all=0
done
[ "$have_all" -eq 1 ] && exit 0
export DEBIAN_FRONTEND=noninteractive
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
$SUDO apt-get update -qq >/dev/null
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
    $SUDO chmod +x /usr/sbin/policy-rc.d
    trap '$SUDO rm -f /usr/sbin/policy-rc.d' EXIT
fi
# --no-install-recommends keeps node-exporter & co. out of the prometheus install.
$SUDO apt-get install -y -qq --no-install-recommends "$package" >/dev/null
for bin in "$@"; do
    command -v "$bin" >/dev/null 2>&1 || [ -x "/usr/sbin/$bin" ]
done
