#!/usr/bin/env python3
"""Scripted OpenAI-compatible mock LLM for integration tests (stdlib only).

    python3 mock_llm.py --port 0 [--log FILE]

Binds 127.0.0.1 (port 0 = ephemeral), prints `listening <port>` as its first stdout line, and
exits as soon as its stdin closes, so a killed test never leaves it behind (keep stdin open:
pipe it from the parent, or `sleep infinity | python3 mock_llm.py` by hand).

GET  /v1/models            -> mock-model, mock-large
POST /v1/chat/completions  -> the body is appended as one JSON line to --log, then the reply is
scripted by the LAST role=user message (text parts of list content are joined):

  [[tool]]     no tool result after that user message yet: "Let me plan this." plus a call to
               `todo` ({"todos": [...2 items...]}), finish_reason "tool_calls"; once a tool
               result follows it: "The plan is ready." (finish "stop")
  [[slowtool]] like [[tool]], but the first call streams "Let me plan this." a word a second
               (6 s) before its tool call: time for a steer to arrive during the run's first
               model call (Hermes hands it to the next call, as the newest user message)
  [[reason]]   reasoning_content "Thinking about the question." then "Reasoned answer."
  [[slow]]     "word1 word2 ... word80", one word every 0.25 s; stops quietly if the client goes
  [[stream N RATE]]  N tokens "word1", " word2", ... at RATE tokens a second (0: as fast as it
               can); [[stream N RATE BYTES]] makes every token BYTES long ("x" and a space)
  [[fail500]]  HTTP 500 with an OpenAI error body
  [[escape]]   worst-case JSON escaping: ~300 KB of reasoning and ~400 KB of content made of
               control characters, quotes and backslashes (each escapes to 2-6 bytes), in 16 KB
               pieces
  [[danger PATH]]  no tool result after that user message yet: "I will clear PATH." plus a call
               to `terminal` with `rm -rf PATH` (a command Hermes flags: "delete in root path");
               once a tool result follows it: "Tool said: <the first 300 chars of that result>"
  [[media PATH...]]  "Here it is.\nMEDIA:PATH\n" (one MEDIA: line per space-separated PATH) then
               "Enjoy.", streamed 5 characters a chunk so every tag is split across deltas (one
               chunk every 0.25 s when the message also says [[slow]])
  [[inline N]] "Look: ![chart](data:image/png;base64,DATA) done.", DATA being inline_png(N): a
               1x1 PNG padded with zero bytes to N bytes (cut to N when N is smaller), streamed
               7 characters a chunk
  [[inline76 N]]  like [[inline N]], DATA wrapped at 76 columns with a line break after each
               line, the last included (what `base64` prints, so what an agent pastes)
  [[inlinehex SUBTYPE HEX]]  "Look: ![x](data:image/SUBTYPE;base64,DATA) done.", DATA being the
               bytes HEX spells (any bytes, image or not), streamed 7 characters a chunk
  [[cron NAME]]  no tool result after that user message yet: "I will schedule it." plus a call
               to `cronjob` (Hermes 0.22, which offers no `cronjob`: `tool_call` of
               `cronjob_manage`) with action create, schedule "every 1m", name NAME, prompt
               "[[jobrun NAME]] Tell me the garden needs water."; once a tool result follows
               it: "Scheduled NAME."
  [[jobrun NAME]]  (anywhere in the message: Hermes wraps a job's prompt) "JOB-RAN-OK NAME run
               N. The garden needs water.", N counting this mock's job runs of NAME from 1
  [[busy]]     the first time a given text is seen: HTTP 429 with Retry-After: 1; then the echo
  (scripts follow the newest "\n\n"-separated part of that message: Hermes merges an
  unanswered user message into the next one)
  otherwise    "Echo: <last>. I have seen <N> earlier user messages; the first was: <first|none>."
               (N counts the role=user messages before the last one: proves history reaches the
               model). Auxiliary calls (titles, summaries, ...) get the echo too.

Both "stream": true (SSE chat.completion.chunk objects, then `data: [DONE]`) and plain
chat.completion replies are supported; the final chunk carries finish_reason and usage.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TODOS = {
    "todos": [
        {"id": "1", "content": "Boil water", "status": "in_progress"},
        {"id": "2", "content": "Steep tea", "status": "pending"},
    ]
}
# A 1x1 transparent PNG (68 bytes, every chunk's CRC right: an inline image must decode):
# what [[inline N]] pads to N bytes.
PNG_1X1 = bytes.fromhex(
    "89504e470d0a1a0a0000000d49484452000000010000000108060000001f15c489"
    "0000000b4944415478da636000020000050001e9fadcd80000000049454e44ae426082"
)
LOG_LOCK = threading.Lock()
BUSY_SEEN = set()
JOB_RUNS = {}


def text_of(content):
    """Text of a message content: a string, or a list of parts ({"type":"text","text":...})."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") if isinstance(p, dict) else str(p) for p in content
        )
    return ""


def inline_png(n):
    """[[inline N]]'s image: PNG_1X1 padded with zero bytes (or cut) to exactly n bytes."""
    return (PNG_1X1 + b"\0" * max(0, n - len(PNG_1X1)))[:n]


def chunked(text, size):
    return [("content", text[i : i + size]) for i in range(0, len(text), size)]


def script(messages, offered=()):
    """The reply for a conversation: a list of events ("content"|"reasoning"|"tool", value),
    the finish_reason, and the per-event delay in seconds. `offered`: the tool names the request
    offers (Hermes 0.22 offers its cron tool `cronjob_manage` only through `tool_call`)."""
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        return [("content", "Echo: nothing.")], "stop", 0
    last = users[-1]
    text = text_of(messages[last].get("content")).strip()
    # Hermes merges an unanswered user message into the next one ("A\n\nB"): the script
    # follows the newest part, the echo shows the whole.
    newest = text.split("\n\n")[-1]
    if "[[jobrun " in text:
        name = text.split("[[jobrun ", 1)[1].split("]]", 1)[0].strip()
        with LOG_LOCK:
            JOB_RUNS[name] = JOB_RUNS.get(name, 0) + 1
            n = JOB_RUNS[name]
        return [("content", f"JOB-RAN-OK {name} run {n}. The garden needs water.")], "stop", 0
    if "[[cron " in newest:
        name = newest.split("[[cron ", 1)[1].split("]]", 1)[0].strip()
        if any(m.get("role") == "tool" for m in messages[last + 1 :]):
            return [("content", f"Scheduled {name}.")], "stop", 0
        job = {
            "action": "create",
            "schedule": "every 1m",
            "name": name,
            "prompt": f"[[jobrun {name}]] Tell me the garden needs water.",
        }
        if "cronjob" in offered or "tool_call" not in offered:
            call = ("cronjob", job)
        else:
            call = ("tool_call", {"name": "cronjob_manage", "arguments": job})
        return [("content", "I will schedule it."), ("tool", call)], "tool_calls", 0
    if "[[slowtool]]" in newest:
        if any(m.get("role") == "tool" for m in messages[last + 1 :]):
            return [("content", "The plan is"), ("content", " ready.")], "stop", 0
        words = [("content", w) for w in ("Let ", "me ", "plan ", "this ", "very ", "carefully.")]
        return words + [("tool", ("todo", TODOS))], "tool_calls", 1.0
    if "[[tool]]" in newest:
        if any(m.get("role") == "tool" for m in messages[last + 1 :]):
            return [("content", "The plan is"), ("content", " ready.")], "stop", 0
        return [("content", "Let me "), ("content", "plan this."), ("tool", ("todo", TODOS))], "tool_calls", 0
    if "[[danger " in newest:
        path = newest.split("[[danger ", 1)[1].split("]]", 1)[0].strip()
        results = [m for m in messages[last + 1 :] if m.get("role") == "tool"]
        if results:
            said = text_of(results[-1].get("content"))[:300]
            return [("content", "Tool said: "), ("content", said)], "stop", 0
        call = ("terminal", {"command": f"rm -rf {path}"})
        return [("content", f"I will clear {path}."), ("tool", call)], "tool_calls", 0
    if "[[media " in newest:
        paths = newest.split("[[media ", 1)[1].split("]]", 1)[0].split()
        text = "Here it is.\n" + "".join(f"MEDIA:{p}\n" for p in paths) + "Enjoy."
        return chunked(text, 5), "stop", (0.25 if "[[slow]]" in newest else 0)
    if "[[inline76 " in newest:
        import base64
        n = int(newest.split("[[inline76 ", 1)[1].split("]]", 1)[0])
        data = base64.encodebytes(inline_png(n)).decode()
        return chunked(f"Look: ![chart](data:image/png;base64,{data}) done.", 7), "stop", 0
    if "[[inlinehex " in newest:
        import base64
        subtype, hexdata = newest.split("[[inlinehex ", 1)[1].split("]]", 1)[0].split()
        data = base64.b64encode(bytes.fromhex(hexdata)).decode()
        return chunked(f"Look: ![x](data:image/{subtype};base64,{data}) done.", 7), "stop", 0
    if "[[inline " in newest:
        import base64
        n = int(newest.split("[[inline ", 1)[1].split("]]", 1)[0])
        data = base64.b64encode(inline_png(n)).decode()
        return chunked(f"Look: ![chart](data:image/png;base64,{data}) done.", 7), "stop", 0
    if "[[reason]]" in newest:
        events = [("reasoning", "Thinking about"), ("reasoning", " the question.")]
        return events + [("content", "Reasoned "), ("content", "answer.")], "stop", 0
    if "[[escape]]" in newest:
        piece = ("\u0001\u001f\"\\\u0007" * 3200)[:16000]
        events = [("reasoning", piece) for _ in range(19)]
        return events + [("content", piece) for _ in range(25)], "stop", 0
    if "[[stream " in newest:
        spec = newest.split("[[stream ", 1)[1].split("]]", 1)[0].split()
        count, rate = int(spec[0]), float(spec[1])
        if len(spec) > 2:
            size = int(spec[2])
            tokens = [("x" * (size - 1) + " ") for _ in range(count)]
        else:
            tokens = [f"word{i}" if i == 1 else f" word{i}" for i in range(1, count + 1)]
        return [("content", t) for t in tokens], "stop", (1.0 / rate if rate else 0)
    if "[[slow]]" in newest:
        return [("content", f"word{i}" if i == 1 else f" word{i}") for i in range(1, 81)], "stop", 0.25
    earlier = [text_of(messages[i].get("content")).strip() for i in users[:-1]]
    first = earlier[0] if earlier else "none"
    reply = f"Echo: {text}. I have seen {len(earlier)} earlier user messages; the first was: {first}."
    third = max(1, len(reply) // 3)
    return [("content", reply[i : i + third]) for i in range(0, len(reply), third)], "stop", 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "mock-llm/1"

    def log_message(self, fmt, *args):  # one short stderr line per request, for diagnostics
        sys.stderr.write(f"mock_llm: {time.time():.3f} {fmt % args}\n")

    def send_json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path.split("?")[0].rstrip("/") == "/v1/models":
            models = [{"id": m, "object": "model", "owned_by": "mock"} for m in ("mock-model", "mock-large")]
            self.send_json(200, {"object": "list", "data": models})
        else:
            self.send_json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.split("?")[0].rstrip("/") != "/v1/chat/completions":
            self.send_json(404, {"error": {"message": "not found", "type": "invalid_request_error"}})
            return
        try:
            req = json.loads(body)
        except ValueError:
            self.send_json(400, {"error": {"message": "bad JSON", "type": "invalid_request_error"}})
            return
        if self.server.log_path:
            with LOG_LOCK, open(self.server.log_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(req) + "\n")
        messages = req.get("messages") or []
        last_user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        last_text = text_of(last_user.get("content"))
        if "[[fail500]]" in last_text:
            err = {"message": "mock failure", "type": "server_error", "param": None, "code": "mock_fail"}
            self.send_json(500, {"error": err})
            return
        if "[[busy]]" in last_text:
            with LOG_LOCK:
                first_time = last_text not in BUSY_SEEN
                BUSY_SEEN.add(last_text)
            if first_time:
                data = json.dumps({"error": {"message": "slow down", "type": "rate_limit_error"}}).encode()
                self.send_response(429)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
        offered = [t.get("function", {}).get("name") for t in req.get("tools") or []]
        events, finish, delay = script(messages, offered)
        model = req.get("model") or "mock-model"
        try:
            if req.get("stream"):
                self.stream(model, events, finish, delay)
            else:
                self.complete(model, events, finish)
        except (BrokenPipeError, ConnectionResetError):
            sys.stderr.write(f"mock_llm: client went away at {time.time():.3f}\n")
            self.close_connection = True

    def complete(self, model, events, finish):
        msg = {"role": "assistant", "content": "".join(v for k, v in events if k == "content")}
        reasoning = "".join(v for k, v in events if k == "reasoning")
        if reasoning:
            msg["reasoning_content"] = reasoning
        calls = [tool_call(v) for k, v in events if k == "tool"]
        if calls:
            msg["tool_calls"] = calls
        out = envelope(model, "chat.completion")
        out["choices"] = [{"index": 0, "message": msg, "finish_reason": finish}]
        out["usage"] = usage(events)
        self.send_json(200, out)

    def stream(self, model, events, finish, delay):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        base = envelope(model, "chat.completion.chunk")  # one id for the whole stream

        def send(delta, finish_reason=None, **extra):
            chunk = dict(base)
            chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
            chunk.update(extra)
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()

        send({"role": "assistant", "content": ""})
        started = time.monotonic()
        for i, (kind, value) in enumerate(events):
            if delay:  # paced by the clock, so a fast rate is not slowed by sleep overhead
                time.sleep(max(0.0, started + (i + 1) * delay - time.monotonic()))
            if kind == "content":
                send({"content": value})
            elif kind == "reasoning":
                send({"reasoning_content": value})
            else:  # a tool call, streamed the OpenAI way: header, then the arguments in pieces
                call = tool_call(value)
                args = call["function"]["arguments"]
                head = {"index": 0, "id": call["id"], "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": ""}}
                send({"tool_calls": [head]})
                for i in range(0, len(args), 40):
                    send({"tool_calls": [{"index": 0, "function": {"arguments": args[i : i + 40]}}]})
        send({}, finish, usage=usage(events))
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def tool_call(value):
    name, args = value
    return {"id": f"call_mock_{name}_1", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args)}}


def envelope(model, obj):
    return {"id": f"chatcmpl-mock{time.time_ns()}", "object": obj, "created": int(time.time()), "model": model}


def usage(events):
    completion = sum(len(str(v).split()) for _, v in events)
    return {"prompt_tokens": 100, "completion_tokens": completion, "total_tokens": 100 + completion}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--log", default=None)
    args = ap.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.log_path = args.log
    print(f"listening {server.server_address[1]}", flush=True)

    def watch_stdin():
        while sys.stdin.buffer.read(4096):
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
