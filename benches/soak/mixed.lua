-- wrk script of the soak: every other request streams (stream: true, the streaming
-- model); the rest are the benchmark's plain request. Prints one RESULT line.
local plain = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"What is the capital of France? Keep the answer short."}],"max_tokens":128}'
local streamed = '{"model":"gpt-4o-mini-stream","stream":true,"messages":[{"role":"user","content":"What is the capital of France? Keep the answer short."}],"max_tokens":128}'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local n = 0
request = function()
  n = n + 1
  if n % 2 == 0 then
    return wrk.format(nil, nil, nil, streamed)
  end
  return wrk.format(nil, nil, nil, plain)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%d,"duration_us":%d,"p50_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"err_connect":%d,"err_read":%d,"err_write":%d,"err_status":%d,"err_timeout":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max,
    e.connect, e.read, e.write, e.status, e.timeout))
end
