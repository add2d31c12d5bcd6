#!/usr/bin/env bash
# purser beside the nginx reverse-proxy floor, in one run of the shared harness:
# wrk at concurrency 1, 16 and 64 against the same nginx mock, ledger on.
#   benches/gateway.sh [extra run.sh options, e.g. -d 20 -r 2]
# Prints the harness's table: req/s, p50/p99, latency added over direct, CPU µs per
# request and memory of each target. Compare purser with nginx-proxy as ratios.
# A third target, proxy-floor (benches/gateway/proxy_floor.rs), is axum handing bodies
# to reqwest and back with nothing else: what the stack costs before purser's own work.
# With PURSER_BENCH_POSTGRES (or PURSER_TEST_POSTGRES) set to a PostgreSQL URL, a fourth
# target, purser-pg, is purser with its ledger on that server, in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
HARNESS=${PURSER_BENCH_HARNESS:-../shared/bench}
if [[ ! -x "$HARNESS/run.sh" ]]; then
  echo "benches/gateway.sh: no benchmark harness at $HARNESS (set PURSER_BENCH_HARNESS)." >&2
  echo "It needs nginx with the echo module and wrk: $HARNESS/install-tools.sh installs them" >&2
  echo "(apt packages nginx-light libnginx-mod-http-echo wrk)." >&2
  exit 2
fi
for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "benches/gateway.sh: $tool is missing; run $HARNESS/install-tools.sh" >&2; exit 2; }
done
cargo build --release --locked --quiet --bin purser --example proxy-floor
port=${PURSER_BENCH_PORT:-18100}
floor_port=$((port + 1))
pg_port=$((port + 2))
pg_url=${PURSER_BENCH_POSTGRES:-${PURSER_TEST_POSTGRES:-}}
pg=()
if [[ -n "$pg_url" ]]; then
  pg=(--extra purser-pg "http://127.0.0.1:$pg_port/v1/chat/completions"
      --extra-header purser-pg 'Authorization: Bearer sk-purser-bench'
      --extra-cmd purser-pg "PURSER_BENCH_PORT=$pg_port PURSER_BENCH_PG_URL='$pg_url' benches/gateway/serve.sh")
fi
exec "$HARNESS/run.sh" --skip litellm,portkey \
  --extra nginx-proxy http://127.0.0.1:18090/v1/chat/completions \
  --extra-cmd nginx-proxy "$HARNESS/examples/nginx-proxy.sh" \
  --extra proxy-floor "http://127.0.0.1:$floor_port/v1/chat/completions" \
  --extra-cmd proxy-floor "target/release/examples/proxy-floor 127.0.0.1:$floor_port" \
  --extra purser "http://127.0.0.1:$port/v1/chat/completions" \
  --extra-header purser 'Authorization: Bearer sk-purser-bench' \
  --extra-cmd purser "PURSER_BENCH_PORT=$port benches/gateway/serve.sh" \
  "${pg[@]}" \
  "$@"
