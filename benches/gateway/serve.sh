#!/usr/bin/env bash
# Started by the benchmark harness (--extra-cmd): renders the bench policy against the
# mock at $UPSTREAM_BASE, starts a fresh ledger, and runs purser in the foreground.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${UPSTREAM_BASE:?UPSTREAM_BASE is exported by benches/harness/run.sh}"
work=$(mktemp -d "${PURSER_BENCH_LEDGER_DIR:-/tmp}/purser-bench.XXXXXX")
mkdir -p "$work/policies"
sed "s|\${UPSTREAM_BASE}|$UPSTREAM_BASE|" "$here/policy.yaml.template" > "$work/policies/bench.yaml"
export RUST_LOG=${RUST_LOG:-warn}
db="$work/ledger.db"
# PURSER_BENCH_PG_URL (set by gateway.sh for the purser-pg target): the ledger on
# PostgreSQL instead, in a fresh schema of its own.
if [[ -n "${PURSER_BENCH_PG_URL:-}" ]]; then
  schema="purser_bench_$(basename "$work" | tr -dc 'a-zA-Z0-9' | tr 'A-Z' 'a-z')"
  psql -q "$PURSER_BENCH_PG_URL" -c "CREATE SCHEMA $schema" >/dev/null
  sep='?'; [[ "$PURSER_BENCH_PG_URL" == *\?* ]] && sep='&'
  db="${PURSER_BENCH_PG_URL}${sep}options=-c%20search_path%3D${schema}"
fi
# PURSER_EXTRA: more `serve` options, to compare a setting by hand (e.g. `--durability
# normal`); benches/gateway.sh leaves it empty, so its figures are the defaults'.
exec "${PURSER_BENCH_BIN:-$here/../../target/release/purser}" serve --config "$work/policies" --db "$db" \
  --listen "127.0.0.1:${PURSER_BENCH_PORT:-18100}" --log-format json ${PURSER_EXTRA:-}
