#!/usr/bin/env python3
"""Writes the committed seed corpora in fuzz/seeds/<target>/ (see docs/fuzzing.md).

- decode_frame: one valid frame per app->server type of protocol/wire-v1.schema.json (every
  payload field filled in; the script fails if the schema gains a field it cannot fill), then
  edge cases: escapes, wrong versions and types, bad ids, nesting at and past the limit, junk.
- config_toml: systemd/config.toml as shipped, the same with every setting and example block
  uncommented, and a few small valid and invalid files.
- webhook_body: one byte choosing the Content-Type (see the target), then a body.

upload_chunks takes `arbitrary`-encoded steps, which no script can write by hand: its seeds
are a minimised corpus the fuzzer itself found (`cargo fuzz cmin`), kept as they are here.

Run from anywhere: python3 fuzz/gen_seeds.py. It rewrites the three directories it owns.
"""

import hashlib
import json
import pathlib
import re
import shutil

ROOT = pathlib.Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"

# Values for payload fields by name: valid ids ([A-Za-z0-9_.:-], 1-64 bytes) where the gateway
# expects one, realistic text elsewhere.
FIELD_VALUES = {
    "token": "tok_0123456789abcdef0123456789abcdef",
    "device_id": "dev_0123456789",
    "device_name": "Ana's phone",
    "caps": {"min_protocol": 1, "media": True, "push": "ntfy"},
    "fcm_token": "fcm:APA91bH-example",
    "ntfy_topic": "iris-0123456789",
    "text": "Hello, what's the weather like?",
    "reply_to": "msg_0001",
    "media_refs": ["ref_1"],
    "auto_thread": False,
    "media_ref": "ref_1",
    "kind": None,  # per frame type, below
    "mime": "image/png",
    "size": 1024,
    "filename": "photo.png",
    "sha256": hashlib.sha256(b"").hexdigest(),
    "media_id": "med_0001",
    "name": "Garden",
    "parent_chat_id": None,
    "on": True,
    "icon": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==",
    "color": "#7aa2f7",
    "query": "weather",
    "scope": "all",
    "chat_id": "default",
    "thread_id": "thr_0001",
    "limit": 20,
    "cursor": 0,
    "before_message_id": "msg_0001",
    "message_ids": ["msg_0001", "msg_0002"],
    "picker_id": "pk_0001",
    "value": "gpt-4o",
    "ts": 1767225600000,
}
KIND_BY_TYPE = {"media.upload.start": "image", "channel.create": "channel"}


def payload_for(frame_type, props):
    payload = {}
    for field in props:
        if field == "kind":
            value = KIND_BY_TYPE[frame_type]
        elif field in FIELD_VALUES:
            value = FIELD_VALUES[field]
        else:
            raise SystemExit(f"gen_seeds.py: no example value for `{frame_type}.{field}`; add one")
        payload[field] = value
    return payload


def frames_from_schema():
    schema = json.loads((ROOT / "protocol" / "wire-v1.schema.json").read_text())
    out = {}
    for i, (frame_type, desc) in enumerate(schema["frame_types"]["app_to_server"].items(), 1):
        props = desc.get("payload", {})
        frame = {"v": 1, "type": frame_type, "id": i}
        if frame_type.startswith(("channel.", "message.", "history")) and frame_type != "channel.create":
            frame["chat_id"] = "default"
        frame["payload"] = payload_for(frame_type, props)
        out[f"{frame_type}.json"] = json.dumps(frame, ensure_ascii=False)
    return out


def decode_edge_cases():
    deep = lambda n: '{"v":1,"type":"ping","payload":{"x":' + "[" * n + "]" * n + "}}"
    return {
        "edge-escaped-header.json": r'{"v":1,"type":"p\u0069ng","id":2,"chat_id":"defa\u0075lt"}',
        "edge-escaped-token.json": r'{"v":1,"type":"hello","id":1,"payload":{"token":"t\"x\\y\u00e9\ud83d\ude00"}}',
        "edge-lone-surrogate.json": r'{"v":1,"type":"message.send","id":3,"payload":{"text":"\ud800"}}',
        "edge-version-2.json": '{"v":2,"type":"ping","id":9}',
        "edge-version-string.json": '{"v":"1","type":"ping","id":9}',
        "edge-version-float.json": '{"v":1.0,"type":"ping","id":9}',
        "edge-no-version.json": '{"type":"ping","id":9}',
        "edge-no-type.json": '{"v":1,"id":9}',
        "edge-type-number.json": '{"v":1,"type":7,"id":9}',
        "edge-id-string.json": '{"v":1,"type":"ping","id":"nine"}',
        "edge-id-huge.json": '{"v":1,"type":"ping","id":9223372036854775808}',
        "edge-id-negative.json": '{"v":1,"type":"ping","id":-9223372036854775808}',
        "edge-id-null.json": '{"v":1,"type":"ping","id":null}',
        "edge-unknown-type.json": '{"v":1,"type":"teleport","id":1}',
        "edge-bad-chat-id.json": '{"v":1,"type":"channel.list","chat_id":"a b"}',
        "edge-long-chat-id.json": '{"v":1,"type":"channel.list","chat_id":"' + "a" * 65 + '"}',
        "edge-null-payload.json": '{"v":1,"type":"sync","id":4,"payload":null}',
        "edge-array-payload.json": '{"v":1,"type":"sync","id":4,"payload":[]}',
        "edge-missing-payload-hello.json": '{"v":1,"type":"hello","id":1}',
        "edge-extra-fields.json": '{"v":1,"type":"ping","id":1,"extra":{"a":[1,2,{"b":null}]},"payload":{"ts":1,"more":"x"}}',
        "edge-duplicate-keys.json": '{"v":1,"type":"ping","type":"channel.list","id":1,"id":2}',
        "edge-duplicate-payload.json": '{"v":1,"type":"ping","payload":{"ts":1},"payload":{"ts":2}}',
        "edge-trailing-garbage.json": '{"v":1,"type":"ping","id":1} x',
        "edge-whitespace.json": ' \n\t{ "v" : 1 , "type" : "ping" }\r\n ',
        "edge-bom.json": '\ufeff{"v":1,"type":"ping"}',
        "edge-nesting-32.json": deep(30),
        "edge-nesting-33.json": deep(31),
        "edge-nesting-brackets-in-string.json": '{"v":1,"type":"ping","payload":{"x":"' + "[" * 100 + '"}}',
        "edge-size-negative.json": '{"v":1,"type":"media.upload.start","id":5,"payload":{"media_ref":"r","kind":"image","size":-1}}',
        "edge-bad-scope.json": '{"v":1,"type":"search","id":6,"payload":{"query":"x","scope":"everywhere"}}',
        "edge-many-delete-ids.json": json.dumps({"v": 1, "type": "message.delete", "id": 7, "chat_id": "default",
                                                 "payload": {"message_ids": [f"msg_{i}" for i in range(101)]}}),
        "edge-long-text.json": json.dumps({"v": 1, "type": "message.send", "id": 8, "chat_id": "default",
                                           "payload": {"text": "word " * 2000}}),
        # The full parser's path (an escape in the header) with a large ignored array, and the
        # costliest typed payload per byte: both exercise the allocation bound from the start.
        "alloc-slow-path-array.json": r'{"v":1,"type":"p\u0069ng","x":[' + ",".join(["0"] * 3000) + "]}",
        "alloc-empty-ids.json": '{"v":1,"type":"message.delete","id":7,"payload":{"message_ids":['
        + ",".join(['""'] * 1500) + "]}}",
        "junk-empty.txt": "",
        "junk-not-json.txt": "not json",
        "junk-array.json": "[1,2]",
        "junk-null.json": "null",
        "junk-empty-object.json": "{}",
        "junk-unterminated.json": '{"v":1,"type":"pi',
    }


def uncomment_config(text):
    """Every `#key = value` setting and `# [[block]]` example of the shipped file, uncommented."""
    lines = []
    for line in text.splitlines():
        m = re.match(r"^#\s?(\[\[\w+\]\]|\w+ = .*)$", line)
        lines.append(m.group(1) if m else line)
    return "\n".join(lines) + "\n"


def config_seeds():
    shipped = (ROOT / "systemd" / "config.toml").read_text()
    full = uncomment_config(shipped)
    # The uncommented file has both a `key_file` and examples of every setting; keep it loadable
    # as TOML even where validation would refuse a combination.
    return {
        "shipped.toml": shipped,
        "uncommented.toml": full,
        "empty.toml": "",
        "listen-and-limits.toml": 'listen = "127.0.0.1:9000"\n[limits]\nmax_connections = 200\nframes_per_second = 1000\nframe_burst = 1000\n',
        "agent-hermes.toml": '[agent]\nbackend = "hermes"\nurl = "http://127.0.0.1:8642/"\nkey = "sk-secret-0123456789"\n',
        "cron-daily.toml": '[[cron]]\nchannel = "Morning"\nschedule = "0 30 7 * * *"\nprompt = "Good morning"\n',
        "cron-feb-30.toml": '[[cron]]\nchannel = "Never"\nschedule = "0 0 0 30 2 *"\nprompt = "never due"\n',
        "cron-bad.toml": '[[cron]]\nchannel = "X"\nschedule = "every day"\nprompt = "p"\n',
        "webhook.toml": '[[webhook]]\nname = "doorbell"\nchannel = "Home"\ntoken = "0123456789abcdef0123"\n',
        "webhook-short-token.toml": '[[webhook]]\nname = "door bell"\nchannel = "Home"\ntoken = "short"\n',
        "led-board.toml": '[led]\nboard = "pi4"\ndriver = "gpio"\ngpio_line = 17\n',
        "unknown-key.toml": '[limits]\nmax_conections = 1\n',
        "wrong-type.toml": '[limits]\nmax_frame_bytes = "big"\n',
        "bad-listen.toml": 'listen = "not an address"\n',
        "zero-limits.toml": '[limits]\nmax_frame_bytes = 0\nhistory_max = 0\nframes_per_second = 0\n',
    }


def webhook_seeds():
    # Selector bytes: 0 none, 1 application/json, 2 Application/JSON; charset=utf-8,
    # 3 text/plain, 4 application/jsonx, 5 " application/json ;", 6+ the bytes up to "\n".
    b = lambda sel, body: bytes([sel]) + body
    return {
        "json-text-title.bin": b(1, b'{"text":"Someone is at the door","title":"Doorbell"}'),
        "json-text-only.bin": b(2, b'{"text":"hi","extra":[1,{"a":null}]}'),
        "json-escapes.bin": b(1, rb'{"text":"caf\u00e9 \ud83d\udd14\n","title":"\"q\""}'),
        "json-null-title.bin": b(5, b'{"text":"t","title":null}'),
        "json-missing-text.bin": b(1, b'{"title":"T"}'),
        "json-wrong-types.bin": b(1, b'{"text":1,"title":[]}'),
        "json-duplicate.bin": b(1, b'{"text":"a","text":"b"}'),
        "json-not-object.bin": b(1, b'["text"]'),
        "json-deep.bin": b(1, b'{"text":"x","n":' + b"[" * 200 + b"]" * 200 + b"}"),
        "text-plain.bin": b(3, "héllo, the washing machine is done".encode()),
        "text-no-type.bin": b(0, b'{"text":"raw"}'),
        "text-jsonx.bin": b(4, b'{"text":"raw"}'),
        "text-invalid-utf8.bin": b(0, b"\xff\xfe bad"),
        "custom-type.bin": b(6, b"APPLICATION/JSON;charset=x\n{\"text\":\"custom\"}"),
        "empty.bin": b(0, b""),
    }


def dict_entry(token):
    """A libFuzzer dictionary line: the token as a quoted string, non-printables escaped."""
    out = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else "\\x%02x" % ord(c) for c in token)
    return '"' + out + '"'


def dictionaries():
    """Tokens for libFuzzer's -dict: without a sanitizer (.ci/fuzz uses none) libFuzzer does
    not see string comparisons, so the names the parsers look for are given up front."""
    schema = json.loads((ROOT / "protocol" / "wire-v1.schema.json").read_text())
    frame = set()
    for frame_type, desc in schema["frame_types"]["app_to_server"].items():
        frame.add(f'"{frame_type}"')
        for field in desc.get("payload", {}):
            frame.add(f'"{field}":')
    for field in schema["envelope"]["properties"]:
        frame.add(f'"{field}":')
    frame.update(['"v":1', '"payload":{', r"\u0000", r"\ud83d\ude00", "null", "true", "false",
                  "-1", "9223372036854775807", "1e3", '"image"', '"channel"', '"thread"',
                  '"all"', '"chat"'])
    shipped = (ROOT / "systemd" / "config.toml").read_text()
    config = set(re.findall(r"^#?\s?(\[\[?\w+\]\]?)", shipped, re.M))
    config.update(k + " = " for k in re.findall(r"^#?\s?(\w+) = ", shipped, re.M))
    config.update(['"0 30 7 * * *"', '"*/5 * * * * *"', '"127.0.0.1:0"', "true", "false", "0",
                   "-1", "18446744073709551615", '"' * 3, "'" * 3, "inf", "nan",
                   "1979-05-27T07:32:00Z"])
    webhook = {'"text":', '"title":', "application/json", "text/plain", "; charset=utf-8",
               r"\u00e9", r"\ud83d\udd14", "null"}
    return {"decode_frame": frame, "config_toml": config, "webhook_body": webhook}


def write_dicts():
    d = ROOT / "fuzz" / "dicts"
    d.mkdir(exist_ok=True)
    for target, tokens in dictionaries().items():
        lines = [dict_entry(t) for t in sorted(tokens)]
        (d / f"{target}.dict").write_text("# Written by fuzz/gen_seeds.py.\n" + "\n".join(lines) + "\n")
        print(f"{target}: {len(lines)} dictionary tokens in fuzz/dicts/{target}.dict")


def write(target, seeds):
    d = SEEDS / target
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for name, content in seeds.items():
        data = content.encode() if isinstance(content, str) else content
        (d / name).write_bytes(data)
    print(f"{target}: {len(seeds)} seeds in {d.relative_to(ROOT)}")


def main():
    frames = frames_from_schema()
    frames.update(decode_edge_cases())
    write("decode_frame", frames)
    write("config_toml", config_seeds())
    write("webhook_body", webhook_seeds())
    write_dicts()


if __name__ == "__main__":
    main()
