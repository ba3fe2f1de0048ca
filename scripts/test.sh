#!/usr/bin/env bash
# Runs every check and test of the workspace on a fresh machine:
# formatting, clippy (-D warnings), and all tests with all features.
# Services the tests need are started here (and stopped on exit).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, all features, -D warnings)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

step "start PostgreSQL (scripts/pg.sh)"
trap 'scripts/pg.sh stop' EXIT
EDWARD_TEST_DATABASE_URL="$(scripts/pg.sh start)"
export EDWARD_TEST_DATABASE_URL

step "install chromium + chromium-driver for the page test (scripts/browser.sh)"
scripts/browser.sh >/dev/null

step "cargo test (all features)"
cargo test --workspace --all-features 2>&1 | tee target/test-output.txt
grep -E '^test result:' target/test-output.txt | awk '
  { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
  END { printf "\nall test binaries: %d passed, %d failed\n", p, f; exit (f > 0) }'
