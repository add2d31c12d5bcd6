#!/usr/bin/env bash
# Soak: purser with its defaults under sustained load, streaming and plain requests
# mixed, and whether its memory stays flat.
#
#   benches/soak.sh                 # 10 minutes at c=64 (SOAK_SECONDS, SOAK_CONCURRENCY)
#
# An nginx mock answers instantly: plain chat.completions, and the same answer as an
# OpenAI event stream for the streaming model. wrk sends every other request with
# `stream: true`. PSS (proportional set size) of purser is sampled after a minute's
# warm-up at load (start; its SQLite page cache and allocator fill during it: at 30 s
# it was still 7 MB short), every minute, and at the end, still at load. The ledger is
# on PURSER_BENCH_LEDGER_DIR (default /tmp) at the default durability (full). Needs
# nginx and wrk (benches/harness/install-tools.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${SOAK_SECONDS:-600}
conc=${SOAK_CONCURRENCY:-64}
warmup=${SOAK_WARMUP:-60}
mock_port=${SOAK_MOCK_PORT:-18480}
port=${SOAK_PORT:-18481}
bin=${PURSER_BENCH_BIN:-target/release/purser}
for tool in nginx wrk curl; do
  command -v "$tool" >/dev/null || { echo "benches/soak.sh: $tool is missing; run benches/harness/install-tools.sh" >&2; exit 2; }
done
[[ -n "${PURSER_BENCH_BIN:-}" ]] || cargo build --release --locked --quiet --bin purser
work=$(mktemp -d "${PURSER_BENCH_LEDGER_DIR:-/tmp}/purser-soak.XXXXXX")
mkdir -p "$work/nginx-tmp" "$work/policies"
python3 benches/harness/lib/render.py benches/soak/nginx.conf.template "$work/nginx.conf" \
  "RUN_DIR=$work" "PORT=$mock_port" "BODY=@benches/harness/mock/chat_completion.json" \
  "SSE=@benches/soak/stream.sse"
sed "s|\${UPSTREAM}|http://127.0.0.1:$mock_port|" benches/soak/policy.yaml.template > "$work/policies/soak.yaml"

pids=()
cleanup() { for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done; }
trap cleanup EXIT
setsid nginx -p "$work" -c "$work/nginx.conf" -g 'daemon off;' & pids+=($!)
RUST_LOG=${RUST_LOG:-warn} setsid "$bin" serve --config "$work/policies" --db "$work/ledger.db" \
  --listen "127.0.0.1:$port" --log-format json > "$work/purser.log" 2>&1 & purser=$!; pids+=($purser)
url="http://127.0.0.1:$port/v1/chat/completions"
auth='Authorization: Bearer sk-purser-bench'
for _ in $(seq 1 100); do
  curl -sf -o /dev/null -H "$auth" -H 'content-type: application/json' \
    --data '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' "$url" && break
  sleep 0.2
done
# One of each kind must be served before the soak means anything.
curl -sf -o /dev/null -H "$auth" -H 'content-type: application/json' \
  --data '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' "$url" \
  || { echo "purser does not serve plain requests; see $work/purser.log" >&2; exit 1; }
curl -sfN -H "$auth" -H 'content-type: application/json' \
  --data '{"model":"gpt-4o-mini-stream","stream":true,"messages":[{"role":"user","content":"hi"}]}' "$url" \
  | grep -q '^data: \[DONE\]' \
  || { echo "purser does not serve streaming requests; see $work/purser.log" >&2; exit 1; }

pss_mb() { awk '/^Pss:/{printf "%.1f", $2/1024}' "/proc/$purser/smaps_rollup"; }
echo "soak: c=$conc for ${secs}s after ${warmup}s of warm-up; half the requests stream; ledger $work/ledger.db" >&2
wrk -t1 -c"$conc" -d"$((warmup + secs))s" --timeout 10s -H "$auth" -s benches/soak/mixed.lua "$url" \
  > "$work/wrk.txt" & wrk_pid=$!
sleep "$warmup"
start=$(pss_mb)
echo "t=0s pss=${start} MB (start)" >&2
elapsed=0
while ((elapsed + 60 < secs)); do
  sleep 60
  elapsed=$((elapsed + 60))
  echo "t=${elapsed}s pss=$(pss_mb) MB" >&2
done
# The end sample is taken a second before wrk stops, still at load.
sleep $((secs - elapsed > 1 ? secs - elapsed - 1 : 0))
end=$(pss_mb)
wait "$wrk_pid"
result=$(grep '^RESULT' "$work/wrk.txt" | sed 's/^RESULT //')
echo "t=${secs}s pss=${end} MB (end)" >&2
python3 - "$start" "$end" "$result" "$secs" "$conc" <<'PY'
import json, sys
start, end, result, secs, conc = float(sys.argv[1]), float(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
errors = sum(v for k, v in result.items() if k.startswith("err_"))
print(f"soak c={conc} {secs}s (plus warm-up), streaming and plain mixed: "
      f"{result['requests']} requests, {errors} errors or non-2xx, "
      f"p50 {result['p50_us']/1000:.2f} ms, p99 {result['p99_us']/1000:.2f} ms")
print(f"PSS start {start:.1f} MB, end {end:.1f} MB, change {end - start:+.1f} MB ({(end - start) / start * 100:+.1f}%)")
PY
