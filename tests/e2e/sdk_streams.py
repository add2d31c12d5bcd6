"""Reads streams to their end through purser with the official `openai` client.

Run by tests/sdk_streams.rs with PURSER_BASE_URL, PURSER_KEY, PURSER_MODEL and
PURSER_STREAMS set. Prints one JSON line per stream: the text, the finish reason and
the usage figures the client saw, or the error that ended the stream.
"""

import json
import os

import openai

client = openai.OpenAI(
    base_url=os.environ["PURSER_BASE_URL"],
    api_key=os.environ["PURSER_KEY"],
    max_retries=0,
)
for i in range(int(os.environ["PURSER_STREAMS"])):
    seen = {"stream": i, "text": "", "finish": None, "usage": None, "error": None}
    try:
        stream = client.chat.completions.create(
            model=os.environ["PURSER_MODEL"],
            messages=[{"role": "user", "content": f"stream {i}"}],
            stream=True,
            stream_options={"include_usage": True},
        )
        for chunk in stream:
            if chunk.choices:
                seen["text"] += chunk.choices[0].delta.content or ""
                seen["finish"] = chunk.choices[0].finish_reason or seen["finish"]
            if chunk.usage:
                u = chunk.usage
                seen["usage"] = [u.prompt_tokens, u.completion_tokens, u.total_tokens]
    except Exception as e:  # the comparison in Rust reports it with the stream's number
        seen["error"] = f"{type(e).__name__}: {e}"
    print(json.dumps(seen), flush=True)
