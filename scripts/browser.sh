#!/usr/bin/env bash
# Make sure Debian's `chromium` and `chromium-driver` are installed (the
# headless browser test of the web page drives them through chromedriver).
# Prints the chromedriver path on stdout; logs go to stderr.
set -euo pipefail

log() { printf 'browser.sh: %s\n' "$*" >&2; }

find_driver() { command -v chromedriver || ls /usr/lib/chromium/chromedriver 2>/dev/null || true; }

if [[ -z "$(find_driver)" ]] || ! command -v chromium >/dev/null; then
    if [[ "$(id -u)" -ne 0 ]]; then
        log "chromium/chromium-driver are missing and we are not root to apt-get them"
        exit 1
    fi
    log "installing chromium and chromium-driver with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chromium chromium-driver fonts-dejavu-core >&2
fi
driver="$(find_driver)"
if [[ -z "$driver" ]]; then
    log "chromedriver not found after install"
    exit 1
fi
printf '%s\n' "$driver"
