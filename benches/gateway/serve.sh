#!/usr/bin/env bash
# Started by the benchmark harness (--extra-cmd): renders the bench policy against the
# mock at $UPSTREAM_BASE, starts a fresh ledger, and runs purser in the foreground.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${UPSTREAM_BASE:?UPSTREAM_BASE is exported by ../shared/bench/run.sh}"
work=$(mktemp -d /tmp/purser-bench.XXXXXX)
mkdir -p "$work/policies"
sed "s|\${UPSTREAM_BASE}|$UPSTREAM_BASE|" "$here/policy.yaml.template" > "$work/policies/bench.yaml"
export RUST_LOG=${RUST_LOG:-warn}
exec "$here/../../target/release/purser" serve --config "$work/policies" --db "$work/ledger.db" \
  --listen "127.0.0.1:${PURSER_BENCH_PORT:-18100}" --log-format json
