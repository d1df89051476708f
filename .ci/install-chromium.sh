#!/usr/bin/env bash
# Make Debian's `chromium` and `chromedriver` available for the console's browser tests
# (tests/system/test_web_browser.py).
set -euo pipefail
here="$(dirname "${BASH_SOURCE[0]}")"
bash "$here/install-deb.sh" chromium chromium
bash "$here/install-deb.sh" chromium-driver chromedriver
