"""Drives a running purser with the official `openai` Python client.

Run by tests/openai_client.rs with PURSER_BASE_URL and PURSER_KEY set; exits non-zero
(with the failing assertion) when the gateway does not look like OpenAI to the client.
"""

import os
import sys

import openai

client = openai.OpenAI(
    base_url=os.environ["PURSER_BASE_URL"],
    api_key=os.environ["PURSER_KEY"],
    max_retries=0,
)
messages = [{"role": "user", "content": "Say hello."}]

# 1. A plain call, with purser's headers readable through the raw response.
raw = client.chat.completions.with_raw_response.create(model="m", messages=messages, max_tokens=32)
reply = raw.parse()
assert reply.choices[0].message.content.startswith("Hello from"), reply
assert reply.usage.prompt_tokens == 12 and reply.usage.completion_tokens == 8, reply.usage
assert raw.headers["x-purser-provider"] == "primary", raw.headers
assert raw.headers["x-purser-fallback"] == "false"
assert raw.headers["x-purser-cost"], raw.headers

# 2. A streaming call: content deltas, a finish reason, then the usage chunk.
text, finish, usage = "", None, None
stream = client.chat.completions.create(
    model="m", messages=messages, stream=True, stream_options={"include_usage": True}
)
for chunk in stream:
    if chunk.choices:
        text += chunk.choices[0].delta.content or ""
        finish = chunk.choices[0].finish_reason or finish
    if chunk.usage:
        usage = chunk.usage
assert text.startswith("Hello from"), text
assert finish == "stop", finish
assert usage is not None and usage.completion_tokens == 8, usage

# 3. Typed errors, read through the client's exceptions.
try:
    client.chat.completions.create(model="not-allowed", messages=messages)
    sys.exit("a model outside the policy was served")
except openai.PermissionDeniedError as e:
    assert e.status_code == 403 and e.code == "model_not_allowed", (e.status_code, e.code)
    assert "not allowed" in e.message, e.message

try:
    client.chat.completions.create(model="m", messages=messages, max_tokens=5_000_000)
    sys.exit("a request over the ceiling was served")
except openai.APIStatusError as e:
    assert e.status_code == 402 and e.code == "ceiling_exceeded", (e.status_code, e.code)
    assert e.body["provider"] is None and e.body["attempts"] == [], e.body

try:
    openai.OpenAI(base_url=os.environ["PURSER_BASE_URL"], api_key="wrong", max_retries=0).chat.completions.create(
        model="m", messages=messages
    )
    sys.exit("an unknown key was served")
except openai.AuthenticationError as e:
    assert e.code == "unauthorized", e.code

# The upstream's own refusal: its words, its provider, its class.
try:
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "refuse me"}])
    sys.exit("the scripted refusal was served")
except openai.BadRequestError as e:
    assert e.code == "content_refusal", e.code
    assert e.body["provider"] == "primary", e.body
    assert "safety system" in e.message, e.message
    assert [a["class"] for a in e.body["attempts"]] == ["content_refusal"], e.body

print("openai client e2e: ok")
