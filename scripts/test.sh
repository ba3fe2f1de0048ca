#!/usr/bin/env bash
# Runs every check and test of the workspace on a fresh machine:
# formatting, clippy (-D warnings), and all tests with all features.
# Services the tests need are started here (and stopped on exit).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "bubblewrap (jails local sandbox commands; tests/jail.rs needs it)"
if ! command -v bwrap >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap) >/dev/null
fi
bwrap --version

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "features compile alone (no default features, then each adapter feature)"
for features in "" local sqlite postgres redis docker openai anthropic gemini tavily http; do
  echo "  edward --no-default-features${features:+ --features $features}"
  cargo check -q -p edward --lib --no-default-features ${features:+--features "$features"}
done
if cargo tree -p edward --no-default-features -e normal --prefix none | grep -qE '^(sqlx|reqwest) '; then
  echo "--no-default-features pulls sqlx or reqwest" >&2
  exit 1
fi

step "start PostgreSQL (scripts/pg.sh)"
trap 'scripts/pg.sh stop; scripts/redis.sh stop; scripts/dockerd.sh stop' EXIT
EDWARD_TEST_DATABASE_URL="$(scripts/pg.sh start)"
export EDWARD_TEST_DATABASE_URL

step "start Redis (scripts/redis.sh)"
EDWARD_TEST_REDIS_URL="$(scripts/redis.sh start)"
export EDWARD_TEST_REDIS_URL

step "start Docker (scripts/dockerd.sh) and build the sandbox image (scripts/docker-image.sh)"
scripts/dockerd.sh start
scripts/docker-image.sh

step "install chromium + chromium-driver for the page test (scripts/browser.sh)"
scripts/browser.sh >/dev/null

step "cargo test (all features)"
cargo test --workspace --all-features --no-fail-fast 2>&1 | tee target/test-output.txt
grep -E '^test result:' target/test-output.txt | awk '
  { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
  END { printf "\nall test binaries: %d passed, %d failed\n", p, f; exit (f > 0) }'
