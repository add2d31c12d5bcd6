#!/usr/bin/env bash
# purser beside the stack's floor and the nginx reverse proxy, in one run of the harness
# in benches/harness (nginx mock upstream + wrk; benches/harness/install-tools.sh
# installs nginx and wrk from Debian's packages):
#
#   benches/gateway.sh [run.sh options, e.g. -d 8 -r 3]
#
# 1. the fsync time of the ledger's filesystem (median and p99 of 4 kB synced writes);
# 2. an instant mock at c = 1, 16, 64: nginx-proxy, proxy-floor, purser (and purser-pg
#    with PURSER_BENCH_POSTGRES or PURSER_TEST_POSTGRES set to a PostgreSQL URL);
# 3. a 200 ms mock (the shape of an LLM call, shorter) at c = 1024: proxy-floor and purser
#    (PURSER_BENCH_SKIP_SLOW=1 skips it);
# 4. purser ÷ floor and the aims of issue #23 (benches/harness/lib/aims.py);
# 5. the design floor (benches/gateway/design_floor.rs) beside them: the proxy floor plus
#    only the money path DESIGN asks of every request, built as purser is; the aims are
#    judged for it too;
# 6. the ledger's floor (benches/gateway/ledger_floor.rs): the least two SQLite commits
#    per request cost on the ledger's disk, run before the load in step 1's directory.
#
# proxy-floor (benches/gateway/proxy_floor.rs) is axum handing bodies to reqwest and
# back with nothing else, on purser's runtime shape and allocator: what the stack costs
# before purser's own work. purser runs with its defaults. Rounds (-r) interleave the
# targets; every figure is the median over rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
HARNESS=${PURSER_BENCH_HARNESS:-benches/harness}
for tool in nginx wrk; do
  command -v "$tool" >/dev/null || { echo "benches/gateway.sh: $tool is missing; run $HARNESS/install-tools.sh" >&2; exit 2; }
done
cargo build --release --locked --quiet --bin purser --example proxy-floor --example ledger-floor \
  --example design-floor
# c = 1024 needs that many sockets in wrk, the gateway and the mock at once.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
port=${PURSER_BENCH_PORT:-18100}
floor_port=$((port + 1))
pg_port=$((port + 2))
design_port=$((port + 3))
pg_url=${PURSER_BENCH_POSTGRES:-${PURSER_TEST_POSTGRES:-}}
ledger_dir=${PURSER_BENCH_LEDGER_DIR:-/tmp}
export PURSER_BENCH_LEDGER_DIR=$ledger_dir
out=${BENCH_WORK:-/tmp/purser-bench}/gateway-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$out"

python3 "$HARNESS/lib/fsync.py" "$ledger_dir" > "$out/fsync.txt"
echo "ledger filesystem ($ledger_dir): $(cat "$out/fsync.txt")" >&2
# What the write-ahead alone costs on that disk, with no schema of purser's (issue #23's
# latency aims leave 0.10 ms over the floor and one fsync).
fsync_p50=$(sed -n 's/.*fsync_p50_ms=\([0-9.]*\).*/\1/p' "$out/fsync.txt")
target/release/examples/ledger-floor "$ledger_dir" "$fsync_p50" > "$out/ledger-floor.txt"
cat "$out/ledger-floor.txt" >&2

floor=(--extra proxy-floor "http://127.0.0.1:$floor_port/v1/chat/completions"
       --extra-cmd proxy-floor "target/release/examples/proxy-floor 127.0.0.1:$floor_port")
# The proxy floor plus DESIGN's money path alone, built as purser is (benches/gateway/
# design_floor.rs): an aim it misses is out of reach for purser's shape on this machine.
design=(--extra design-floor "http://127.0.0.1:$design_port/v1/chat/completions"
        --extra-cmd design-floor "target/release/examples/design-floor 127.0.0.1:$design_port $ledger_dir")
purser=(--extra purser "http://127.0.0.1:$port/v1/chat/completions"
        --extra-header purser 'Authorization: Bearer sk-purser-bench'
        --extra-cmd purser "PURSER_BENCH_PORT=$port benches/gateway/serve.sh")
pg=()
if [[ -n "$pg_url" ]]; then
  pg=(--extra purser-pg "http://127.0.0.1:$pg_port/v1/chat/completions"
      --extra-header purser-pg 'Authorization: Bearer sk-purser-bench'
      --extra-cmd purser-pg "PURSER_BENCH_PORT=$pg_port PURSER_BENCH_PG_URL='$pg_url' benches/gateway/serve.sh")
fi

"$HARNESS/run.sh" --skip litellm,portkey --out "$out/instant" \
  --extra nginx-proxy http://127.0.0.1:18090/v1/chat/completions \
  --extra-cmd nginx-proxy "$HARNESS/examples/nginx-proxy.sh" \
  "${floor[@]}" "${design[@]}" "${purser[@]}" "${pg[@]}" "$@"

slow_csv=""
if [[ "${PURSER_BENCH_SKIP_SLOW:-0}" != 1 ]]; then
  "$HARNESS/run.sh" --skip litellm,portkey --out "$out/slow" \
    "${floor[@]}" "${design[@]}" "${purser[@]}" "$@" --concurrency 1024 --upstream-delay-ms 200
  slow_csv="$out/slow/results.csv"
fi

python3 "$HARNESS/lib/aims.py" "$out/instant/results.csv" "$slow_csv" "$out/fsync.txt" \
  | tee "$out/aims.md"
{ echo; echo '```'; cat "$out/ledger-floor.txt"; echo '```'; } | tee -a "$out/aims.md"
echo "results: $out" >&2
