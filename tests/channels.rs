//! The channel directory against the real binary: every change reaches every device (the
//! requester with its request id), refusals leave the directory as it was, the default mark
//! moves atomically, automation channels refuse messages, and everything survives a restart.

mod common;

use std::time::Duration;

use common::{channel_list, connect, frame_type, pair, Client, Gateway, Paired};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// Local helpers
// ---------------------------------------------------------------------------------------------

/// A real 1x1 PNG image.
const TINY_PNG_B64: &str =
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==";

struct Two {
    /// Kept for the restart test; dropping it removes the data directory.
    dir: tempfile::TempDir,
    gw: Gateway,
    pa: Paired,
    pb: Paired,
    a: Client,
    b: Client,
}

async fn two_devices() -> Two {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let pa = pair(dir.path(), "device-a");
    let pb = pair(dir.path(), "device-b");
    let (a, _) = connect(&gw, &pa).await;
    let (b, _) = connect(&gw, &pb).await;
    Two {
        dir,
        gw,
        pa,
        pb,
        a,
        b,
    }
}

/// A frame or payload for a panic message, cut short (icons are large).
fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 300 {
        return s;
    }
    let mut end = 300;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

fn without_id(f: &Value) -> Value {
    let mut f = f.clone();
    f.as_object_mut().expect("frame object").remove("id");
    f
}

/// Sends a directory request from A, expects A's reply of `reply_type` with A's id, and the same
/// frame without id on B. Returns the reply's payload.
async fn change_seen_by_both(
    t: &mut Two,
    kind: &str,
    chat: Option<&str>,
    payload: Value,
    reply_type: &str,
) -> Value {
    let start = t.a.seen.len();
    let id = t.a.request(kind, chat, None, payload.clone()).await;
    let reply = t.a.recv_reply(id).await;
    assert_eq!(
        frame_type(&reply),
        reply_type,
        "`{kind}` {} on {chat:?}: unexpected reply {}",
        short(&payload),
        short(&reply)
    );
    // The requester gets the change once, as its reply: no extra copy without the id (a
    // round trip makes sure anything published with the change has arrived).
    channel_list(&mut t.a).await;
    let copies = t.a.seen[start..]
        .iter()
        .filter(|f| f.get("id").is_none() && **f == without_id(&reply))
        .count();
    assert_eq!(copies, 0, "A got its change twice: {}", short(&reply));
    let on_b = t.b.recv_type(reply_type).await;
    assert!(
        on_b.get("id").is_none(),
        "B's copy must not carry A's id: {on_b}"
    );
    assert_eq!(on_b, without_id(&reply), "B must see the same frame as A");
    reply["payload"].clone()
}

/// A change to one entry, seen by both devices, answered with the entry's new state.
async fn change(t: &mut Two, kind: &str, chat: &str, payload: Value) -> Value {
    change_seen_by_both(t, kind, Some(chat), payload, "channel.renamed").await
}

/// `channel.set_automation` of one entry, seen by both devices.
async fn set_automation(t: &mut Two, chat: &str, on: bool) -> Value {
    change(t, "channel.set_automation", chat, json!({ "on": on })).await
}

/// `channel.delete` of one entry, seen by both devices.
async fn delete(t: &mut Two, chat: &str) -> Value {
    change_seen_by_both(
        t,
        "channel.delete",
        Some(chat),
        json!({}),
        "channel.deleted",
    )
    .await
}

/// [`refused`] for each (kind, chat, payload, code), in order; the error replies.
async fn refused_all<const N: usize>(
    c: &mut Client,
    cases: [(&str, Option<&str>, Value, &str); N],
) -> Vec<Value> {
    let mut errors = Vec::with_capacity(N);
    for (kind, chat, payload, code) in cases {
        errors.push(refused(c, kind, chat, payload, code).await);
    }
    errors
}

fn entry<'a>(list: &'a [Value], chat_id: &str) -> Option<&'a Value> {
    list.iter().find(|c| c["chat_id"] == chat_id)
}

/// Sends a request expected to be refused with `code`; checks the id is echoed and the
/// directory (channel.list) did not change.
async fn refused(
    c: &mut Client,
    kind: &str,
    chat: Option<&str>,
    payload: Value,
    code: &str,
) -> Value {
    let before = channel_list(c).await;
    let id = c.request(kind, chat, None, payload.clone()).await;
    let reply = c.recv_reply(id).await;
    assert_eq!(
        frame_type(&reply),
        "error",
        "`{kind}` {} on {chat:?} must be refused with {code}, got {}",
        short(&payload),
        short(&reply)
    );
    assert_eq!(
        reply["payload"]["code"],
        code,
        "`{kind}` {} on {chat:?}: {}",
        short(&payload),
        short(&reply)
    );
    let after = channel_list(c).await;
    assert_eq!(
        after,
        before,
        "`{kind}` {} on {chat:?} changed the directory",
        short(&payload)
    );
    reply
}

async fn create(t: &mut Two, payload: Value) -> Value {
    change_seen_by_both(t, "channel.create", None, payload, "channel.created").await
}

fn id_of(entry: &Value) -> String {
    entry["chat_id"].as_str().expect("chat_id").to_owned()
}

fn defaults(list: &[Value]) -> Vec<String> {
    list.iter()
        .filter(|c| c["is_default"] == true)
        .map(id_of)
        .collect()
}

/// Frames on `c` up to and including the next `typing{on:false}`.
async fn until_typing_off(c: &mut Client) -> Vec<Value> {
    let mut out = Vec::new();
    loop {
        let f = c.recv().await;
        let done = frame_type(&f) == "typing" && f["payload"]["on"] == false;
        out.push(f);
        if done {
            return out;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tests: changes reach every device
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn fresh_directory_has_only_general() {
    let mut t = two_devices().await;
    let (_, ack) = Client::hello(&t.gw.url, &t.pa.token, &t.pa.device_id).await;
    let channels = ack["payload"]["channels"].as_array().expect("channels");
    assert_eq!(channels.len(), 1, "{ack}");
    let g = &channels[0];
    assert_eq!(g["chat_id"], "default");
    assert_eq!(g["name"], "General");
    assert_eq!(g["kind"], "default");
    assert_eq!(g["is_default"], true);
    assert_eq!(g["parent_chat_id"], Value::Null);
    assert_eq!(g["archived"], false);
    for flag in ["favorite", "automation"] {
        assert_ne!(g[flag], true, "{flag}: {g}");
    }
    for cosmetic in ["icon", "color"] {
        assert_eq!(g[cosmetic], Value::Null, "{cosmetic}: {g}");
    }
    assert_eq!(channel_list(&mut t.b).await, *channels);
}

#[tokio::test]
async fn create_and_rename_reach_both_devices() {
    let mut t = two_devices().await;
    let created = create(&mut t, json!({ "name": "Projects", "kind": "channel" })).await;
    let chan = id_of(&created);
    assert!(chan.starts_with("chan_"), "{created}");
    assert_eq!(created["name"], "Projects");
    assert_eq!(created["kind"], "channel");
    assert_eq!(created["parent_chat_id"], Value::Null);
    assert_eq!(created["is_default"], false);
    assert_eq!(created["archived"], false);

    let renamed = change(
        &mut t,
        "channel.rename",
        &chan,
        json!({ "name": "Side projects" }),
    )
    .await;
    let mut want = created.clone();
    want["name"] = json!("Side projects");
    assert_eq!(renamed, want, "rename changes only the name");

    // 100 characters is the limit and is accepted.
    let long = "x".repeat(100);
    let renamed = change(&mut t, "channel.rename", &chan, json!({ "name": long })).await;
    assert_eq!(renamed["name"], long.as_str());

    // The directory on both devices.
    let la = channel_list(&mut t.a).await;
    let lb = channel_list(&mut t.b).await;
    assert_eq!(la, lb);
    assert_eq!(la.len(), 2);
    assert_eq!(la[0]["chat_id"], "default", "default first: {la:?}");
    assert_eq!(entry(&la, &chan), Some(&renamed));
}

#[tokio::test]
async fn favorite_on_off_reaches_both_devices() {
    let mut t = two_devices().await;
    let created = create(&mut t, json!({ "name": "Faves", "kind": "channel" })).await;
    let chan = id_of(&created);
    let on = change(&mut t, "channel.favorite", &chan, json!({ "on": true })).await;
    assert_eq!(on["favorite"], true, "{on}");
    assert_eq!(on["name"], "Faves");
    assert_eq!(entry(&channel_list(&mut t.b).await, &chan), Some(&on));
    let off = change(&mut t, "channel.favorite", &chan, json!({ "on": false })).await;
    assert_eq!(off["favorite"], false, "{off}");
    assert_eq!(entry(&channel_list(&mut t.b).await, &chan), Some(&off));
    // The default channel can be a favorite too.
    let g = change(&mut t, "channel.favorite", "default", json!({ "on": true })).await;
    assert_eq!(
        (g["favorite"].clone(), g["is_default"].clone()),
        (json!(true), json!(true))
    );
}

#[tokio::test]
async fn icon_set_and_clear_reaches_both_devices() {
    let mut t = two_devices().await;
    let created = create(&mut t, json!({ "name": "Pretty", "kind": "channel" })).await;
    let chan = id_of(&created);
    let set = change(
        &mut t,
        "channel.icon",
        &chan,
        json!({ "icon": TINY_PNG_B64, "color": "#12abEF" }),
    )
    .await;
    assert_eq!(set["icon"], TINY_PNG_B64, "{set}");
    assert!(
        set["color"]
            .as_str()
            .is_some_and(|c| c.eq_ignore_ascii_case("#12abEF")),
        "{set}"
    );
    assert_eq!(set["name"], "Pretty");
    assert_eq!(entry(&channel_list(&mut t.b).await, &chan), Some(&set));

    // icon null clears the icon; the color sent again stays.
    let cleared = change(
        &mut t,
        "channel.icon",
        &chan,
        json!({ "icon": null, "color": "#12abEF" }),
    )
    .await;
    assert_eq!(cleared["icon"], Value::Null, "{cleared}");
    assert_eq!(cleared["color"], set["color"], "{cleared}");
    assert_eq!(entry(&channel_list(&mut t.b).await, &chan), Some(&cleared));

    // Both null: back to the auto-generated avatar.
    let bare = change(
        &mut t,
        "channel.icon",
        &chan,
        json!({ "icon": null, "color": null }),
    )
    .await;
    assert_eq!(bare["icon"], Value::Null, "{bare}");
    assert_eq!(bare["color"], Value::Null, "{bare}");
    assert_eq!(entry(&channel_list(&mut t.a).await, &chan), Some(&bare));
}

#[tokio::test]
async fn automation_on_off_reaches_both_devices() {
    let mut t = two_devices().await;
    let created = create(&mut t, json!({ "name": "Cron", "kind": "channel" })).await;
    let chan = id_of(&created);
    let on = set_automation(&mut t, &chan, true).await;
    assert_eq!(on["automation"], true, "{on}");
    assert_eq!(entry(&channel_list(&mut t.b).await, &chan), Some(&on));
    let off = set_automation(&mut t, &chan, false).await;
    assert_eq!(off["automation"], false, "{off}");
    assert_eq!(entry(&channel_list(&mut t.b).await, &chan), Some(&off));
}

#[tokio::test]
async fn thread_create_and_delete_reach_both_devices() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Parent", "kind": "channel" })).await);
    let thread = create(
        &mut t,
        json!({ "name": "A thread", "kind": "thread", "parent_chat_id": chan }),
    )
    .await;
    let thr = id_of(&thread);
    assert!(thr.starts_with("thr_"), "{thread}");
    assert_eq!(thread["kind"], "thread");
    assert_eq!(thread["parent_chat_id"], chan.as_str());
    assert_eq!(thread["is_default"], false);
    assert_eq!(thread["name"], "A thread");

    // A thread under the default channel.
    let under_default = create(
        &mut t,
        json!({ "name": "General thread", "kind": "thread", "parent_chat_id": "default" }),
    )
    .await;
    assert_eq!(under_default["parent_chat_id"], "default");
    assert_eq!(channel_list(&mut t.b).await.len(), 4);

    let deleted = delete(&mut t, &thr).await;
    assert_eq!(deleted, json!({ "chat_id": thr }));
    // The deleted thread is no longer addressable.
    let id =
        t.a.request("history", Some(&chan), Some(&thr), json!({}))
            .await;
    let r = t.a.recv_reply(id).await;
    assert_eq!(
        r["payload"]["code"], "not_found",
        "history of a deleted thread: {r}"
    );
    for c in [&mut t.a, &mut t.b] {
        let list = channel_list(c).await;
        assert!(
            entry(&list, &thr).is_none(),
            "deleted thread still listed: {list:?}"
        );
        assert!(
            entry(&list, &chan).is_some(),
            "the parent must stay: {list:?}"
        );
        assert_eq!(list.len(), 3, "{list:?}");
    }
}

#[tokio::test]
async fn deleting_a_channel_deletes_its_threads_on_every_device() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Doomed", "kind": "channel" })).await);
    let keep = id_of(&create(&mut t, json!({ "name": "Kept", "kind": "channel" })).await);
    let t1 = id_of(
        &create(
            &mut t,
            json!({ "name": "one", "kind": "thread", "parent_chat_id": chan }),
        )
        .await,
    );
    let t2 = id_of(
        &create(
            &mut t,
            json!({ "name": "two", "kind": "thread", "parent_chat_id": chan }),
        )
        .await,
    );
    let other = id_of(
        &create(
            &mut t,
            json!({ "name": "other", "kind": "thread", "parent_chat_id": keep }),
        )
        .await,
    );

    let id =
        t.a.request("channel.delete", Some(&chan), None, json!({}))
            .await;
    let reply = t.a.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "channel.deleted", "{reply}");
    assert_eq!(
        reply["payload"],
        json!({ "chat_id": chan }),
        "the reply names the channel"
    );

    let want: std::collections::BTreeSet<String> =
        [chan.clone(), t1.clone(), t2.clone()].into_iter().collect();
    for (who, c) in [("A", &mut t.a), ("B", &mut t.b)] {
        // Everything up to the channel.list reply: the deletions are broadcast before it.
        let list = channel_list(c).await;
        let got: Vec<String> = c
            .seen
            .iter()
            .filter(|f| frame_type(f) == "channel.deleted")
            .map(|f| f["payload"]["chat_id"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(
            got.len(),
            3,
            "{who}: one channel.deleted per entry: {got:?}"
        );
        assert_eq!(
            got.iter()
                .cloned()
                .collect::<std::collections::BTreeSet<_>>(),
            want,
            "{who}"
        );
        for gone in [&chan, &t1, &t2] {
            assert!(
                entry(&list, gone).is_none(),
                "{who}: {gone} still listed: {list:?}"
            );
        }
        assert!(
            entry(&list, &keep).is_some() && entry(&list, &other).is_some(),
            "{who}"
        );
        assert_eq!(list.len(), 3, "{who}: {list:?}");
    }
    let on_b: Vec<&Value> =
        t.b.seen
            .iter()
            .filter(|f| frame_type(f) == "channel.deleted")
            .collect();
    assert!(on_b.iter().all(|f| f.get("id").is_none()), "{on_b:?}");
    let with_id: Vec<&Value> =
        t.a.seen
            .iter()
            .filter(|f| frame_type(f) == "channel.deleted" && f.get("id").is_some())
            .collect();
    assert_eq!(
        with_id.len(),
        1,
        "exactly one deletion answers A's request: {with_id:?}"
    );
    for gone in [&chan, &t1] {
        let id = t.a.request("history", Some(gone), None, json!({})).await;
        let r = t.a.recv_reply(id).await;
        assert_eq!(
            r["payload"]["code"], "not_found",
            "history of deleted {gone}: {r}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Tests: refusals leave the directory unchanged
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn rename_refusals() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Named", "kind": "channel" })).await);
    let c = &mut t.a;
    refused_all(
        c,
        [
            (
                "channel.rename",
                Some(chan.as_str()),
                json!({ "name": "" }),
                "unsupported",
            ),
            (
                "channel.rename",
                Some(chan.as_str()),
                json!({ "name": "y".repeat(101) }),
                "unsupported",
            ),
            (
                "channel.rename",
                Some("chan_doesnotexist"),
                json!({ "name": "Fine" }),
                "not_found",
            ),
            // Creating with a bad name is refused the same way.
            (
                "channel.create",
                None,
                json!({ "name": "", "kind": "channel" }),
                "unsupported",
            ),
            (
                "channel.create",
                None,
                json!({ "name": "z".repeat(101), "kind": "channel" }),
                "unsupported",
            ),
        ],
    )
    .await;
    // B saw nothing but the one creation.
    let list = channel_list(&mut t.b).await;
    assert_eq!(
        entry(&list, &chan).map(|e| e["name"].clone()),
        Some(json!("Named"))
    );
    let changes: Vec<&Value> =
        t.b.seen
            .iter()
            .filter(|f| frame_type(f).starts_with("channel.") && frame_type(f) != "channel.list")
            .collect();
    assert_eq!(changes.len(), 1, "{changes:?}");
}

/// Names that show nothing in a list (zero-width spaces and joiners, BOM, word joiner, bidi
/// marks and isolates, alone or with spaces) are refused like an empty name, for channels and
/// threads, on create and on rename.
#[tokio::test]
async fn invisible_names_are_refused_like_empty_ones() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Visible", "kind": "channel" })).await);
    let thr = id_of(
        &create(
            &mut t,
            json!({ "name": "Visible thread", "kind": "thread", "parent_chat_id": chan }),
        )
        .await,
    );
    let c = &mut t.a;
    for name in [
        "\u{200B}",
        " \u{200D}\u{FEFF} ",
        "\u{2060}\u{200E}\u{200F}",
        "\u{202E}\u{2066}\u{2069}\u{00A0}",
    ] {
        let errors = refused_all(
            c,
            [
                (
                    "channel.rename",
                    Some(chan.as_str()),
                    json!({ "name": name }),
                    "unsupported",
                ),
                (
                    "channel.rename",
                    Some(thr.as_str()),
                    json!({ "name": name }),
                    "unsupported",
                ),
                (
                    "channel.create",
                    None,
                    json!({ "name": name, "kind": "channel" }),
                    "unsupported",
                ),
                (
                    "channel.create",
                    None,
                    json!({ "name": name, "kind": "thread", "parent_chat_id": chan }),
                    "unsupported",
                ),
            ],
        )
        .await;
        for e in errors {
            let message = e["payload"]["message"].as_str().unwrap_or("");
            assert!(message.contains("empty"), "{name:?}: {e}");
        }
    }
    // A visible name with a zero-width joiner in it (an emoji sequence) is fine.
    let id = c
        .request(
            "channel.rename",
            Some(&chan),
            None,
            json!({ "name": "Family 👩\u{200D}👧" }),
        )
        .await;
    assert_eq!(frame_type(&c.recv_reply(id).await), "channel.renamed");
}

/// The docs say an automation channel has no threads: marking a channel that has some is
/// refused (and nothing changes), until its threads are gone.
#[tokio::test]
async fn automation_is_refused_for_a_channel_with_threads() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Busy", "kind": "channel" })).await);
    let thr = id_of(
        &create(
            &mut t,
            json!({ "name": "Side talk", "kind": "thread", "parent_chat_id": chan }),
        )
        .await,
    );
    let err = refused(
        &mut t.a,
        "channel.set_automation",
        Some(&chan),
        json!({ "on": true }),
        "unsupported",
    )
    .await;
    let message = err["payload"]["message"].as_str().unwrap_or("");
    assert!(message.contains("thread"), "{err}");
    assert_eq!(
        entry(&channel_list(&mut t.b).await, &chan).unwrap()["automation"],
        false
    );

    delete(&mut t, &thr).await;
    let on = set_automation(&mut t, &chan, true).await;
    assert_eq!(on["automation"], true, "{on}");
}

#[tokio::test]
async fn every_change_to_an_unknown_chat_is_not_found() {
    let mut t = two_devices().await;
    create(&mut t, json!({ "name": "Existing", "kind": "channel" })).await;
    let c = &mut t.a;
    for (kind, payload) in [
        ("channel.rename", json!({ "name": "Ghost" })),
        ("channel.favorite", json!({ "on": true })),
        (
            "channel.icon",
            json!({ "icon": TINY_PNG_B64, "color": "#12abEF" }),
        ),
        ("channel.set_automation", json!({ "on": true })),
        ("channel.set_default", json!({})),
        ("channel.delete", json!({})),
    ] {
        refused(c, kind, Some("chan_doesnotexist"), payload, "not_found").await;
    }
}

#[tokio::test]
async fn thread_is_addressed_by_thread_id() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Parent", "kind": "channel" })).await);
    let thr = id_of(
        &create(
            &mut t,
            json!({ "name": "Child", "kind": "thread", "parent_chat_id": chan }),
        )
        .await,
    );
    // chat_id = parent, thread_id = thread: the change applies to the thread.
    let id =
        t.a.request(
            "channel.rename",
            Some(&chan),
            Some(&thr),
            json!({ "name": "Renamed child" }),
        )
        .await;
    let reply = t.a.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "channel.renamed", "{reply}");
    assert_eq!(reply["payload"]["chat_id"], thr.as_str(), "{reply}");
    assert_eq!(reply["payload"]["name"], "Renamed child");
    assert_eq!(reply["payload"]["kind"], "thread");
    assert_eq!(reply["payload"]["parent_chat_id"], chan.as_str());
    let on_b = t.b.recv_type("channel.renamed").await;
    assert_eq!(on_b, without_id(&reply));
    let list = channel_list(&mut t.b).await;
    assert_eq!(entry(&list, &chan).unwrap()["name"], "Parent");
    assert_eq!(entry(&list, &thr).unwrap()["name"], "Renamed child");
}

#[tokio::test]
async fn icon_refusals() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Iconic", "kind": "channel" })).await);
    let c = &mut t.a;
    refused_all(
        c,
        [
            (
                "channel.icon",
                Some(chan.as_str()),
                json!({ "icon": "this is not base64!!", "color": "#12abEF" }),
                "unsupported",
            ),
            // "hello world, not an image" in base64.
            (
                "channel.icon",
                Some(chan.as_str()),
                json!({ "icon": "aGVsbG8gd29ybGQsIG5vdCBhbiBpbWFnZQ==", "color": "#12abEF" }),
                "unsupported",
            ),
            (
                "channel.icon",
                Some(chan.as_str()),
                json!({ "icon": TINY_PNG_B64, "color": "red" }),
                "unsupported",
            ),
            (
                "channel.icon",
                Some("chan_doesnotexist"),
                json!({ "icon": TINY_PNG_B64 }),
                "not_found",
            ),
        ],
    )
    .await;
    let list = channel_list(c).await;
    let e = entry(&list, &chan).expect("still listed");
    assert_eq!(
        (e["icon"].clone(), e["color"].clone()),
        (Value::Null, Value::Null)
    );
}

/// Default `limits.max_icon_bytes` (512 KiB).
const MAX_ICON_BYTES: usize = 512 << 10;

/// A base64 "image" of exactly `len` decoded bytes: the PNG signature, then zeros.
fn png_of_len(len: usize) -> String {
    use base64::Engine;
    let mut raw = b"\x89PNG\r\n\x1a\n".to_vec();
    raw.resize(len, 0);
    base64::engine::general_purpose::STANDARD.encode(raw)
}

#[tokio::test]
async fn icon_size_limit_is_max_icon_bytes_decoded() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Big icon", "kind": "channel" })).await);
    // A JPEG is accepted too (SOI + APP0 marker start).
    let jpeg = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD
            .encode([0xff, 0xd8, 0xff, 0xe0, 0, 16, b'J', b'F', b'I', b'F', 0])
    };
    let set = change(&mut t, "channel.icon", &chan, json!({ "icon": jpeg })).await;
    assert_eq!(set["icon"], jpeg.as_str());

    // Exactly the limit is accepted.
    let at_limit = png_of_len(MAX_ICON_BYTES);
    let set = change(&mut t, "channel.icon", &chan, json!({ "icon": at_limit })).await;
    assert_eq!(set["icon"].as_str().map(str::len), Some(at_limit.len()));

    // Over the limit is refused (the limit is on the decoded image), and the stored icon stays.
    let mut outcomes = Vec::new();
    for over in [MAX_ICON_BYTES + 1, MAX_ICON_BYTES + 2, MAX_ICON_BYTES + 3] {
        let id =
            t.a.request(
                "channel.icon",
                Some(&chan),
                None,
                json!({ "icon": png_of_len(over) }),
            )
            .await;
        let r = t.a.recv_reply(id).await;
        let outcome = match frame_type(&r) {
            "error" => format!("error:{}", r["payload"]["code"].as_str().unwrap_or("?")),
            other => other.to_owned(),
        };
        outcomes.push((over, outcome));
    }
    let refused_all: Vec<(usize, String)> = outcomes
        .iter()
        .map(|(n, _)| (*n, "error:unsupported".to_owned()))
        .collect();
    assert_eq!(
        outcomes, refused_all,
        "icons of more than max_icon_bytes ({MAX_ICON_BYTES}) decoded bytes must be refused"
    );
    let list = channel_list(&mut t.a).await;
    assert_eq!(
        entry(&list, &chan)
            .and_then(|e| e["icon"].as_str())
            .map(str::len),
        Some(at_limit.len()),
        "the stored icon must be the one at the limit"
    );
}

#[tokio::test]
async fn default_channel_refusals() {
    let mut t = two_devices().await;
    let c = &mut t.a;
    refused_all(
        c,
        [
            (
                "channel.set_automation",
                Some("default"),
                json!({ "on": true }),
                "not_found",
            ),
            ("channel.delete", Some("default"), json!({}), "unsupported"),
        ],
    )
    .await;
    let list = channel_list(c).await;
    assert_eq!(defaults(&list), vec!["default".to_owned()]);
    assert_eq!(list[0]["automation"], false);
}

#[tokio::test]
async fn thread_parent_refusals() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Root", "kind": "channel" })).await);
    let thr = id_of(
        &create(
            &mut t,
            json!({ "name": "Leaf", "kind": "thread", "parent_chat_id": chan }),
        )
        .await,
    );
    let c = &mut t.a;
    refused_all(
        c,
        [
            ("channel.create", None, json!({ "name": "Orphan", "kind": "thread", "parent_chat_id": "chan_doesnotexist" }), "not_found"),
            ("channel.create", None, json!({ "name": "Nested", "kind": "thread", "parent_chat_id": thr }), "unsupported"),
        ],
    )
    .await;
}

// ---------------------------------------------------------------------------------------------
// Tests: the default mark and automation
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn set_default_moves_the_single_default() {
    let mut t = two_devices().await;
    let x = id_of(&create(&mut t, json!({ "name": "New home", "kind": "channel" })).await);
    let id =
        t.a.request("channel.set_default", Some(&x), None, json!({}))
            .await;
    let reply = t.a.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "channel.renamed", "{reply}");
    assert_eq!(
        reply["payload"]["chat_id"],
        x.as_str(),
        "the reply is X's entry: {reply}"
    );
    assert_eq!(reply["payload"]["is_default"], true);
    assert_eq!(reply["payload"]["kind"], "default");
    let old_on_a = t
        .a
        .recv_until(|f| frame_type(f) == "channel.renamed" && f["payload"]["chat_id"] == "default")
        .await;
    assert!(old_on_a.get("id").is_none(), "{old_on_a}");

    let first_b = t.b.recv_type("channel.renamed").await;
    let second_b = t.b.recv_type("channel.renamed").await;
    let mut on_b = [first_b, second_b];
    on_b.sort_by_key(|f| f["payload"]["chat_id"] != x.as_str());
    assert_eq!(on_b[0], without_id(&reply), "B sees X's new entry");
    assert_eq!(on_b[1], old_on_a, "B sees the old default's new entry");
    let old = &on_b[1]["payload"];
    assert_eq!(old["chat_id"], "default");
    assert_eq!(old["kind"], "channel", "{old}");
    assert_eq!(old["is_default"], false, "{old}");
    assert_eq!(old["name"], "General");

    for c in [&mut t.a, &mut t.b] {
        let list = channel_list(c).await;
        assert_eq!(
            defaults(&list),
            vec![x.clone()],
            "exactly one default: {list:?}"
        );
        assert_eq!(
            list[0]["chat_id"],
            x.as_str(),
            "the default is listed first: {list:?}"
        );
        let g = entry(&list, "default").expect("old default still exists");
        assert_eq!(
            (g["kind"].clone(), g["is_default"].clone()),
            (json!("channel"), json!(false))
        );
        assert_eq!(
            list.iter().filter(|c| c["kind"] == "default").count(),
            1,
            "{list:?}"
        );
    }

    // Setting the default on the default changes nothing but still answers.
    let id =
        t.a.request("channel.set_default", Some(&x), None, json!({}))
            .await;
    let again = t.a.recv_reply(id).await;
    assert_eq!(frame_type(&again), "channel.renamed", "{again}");
    assert_eq!(defaults(&channel_list(&mut t.a).await), vec![x.clone()]);

    // And back again.
    let id =
        t.a.request("channel.set_default", Some("default"), None, json!({}))
            .await;
    let back = t.a.recv_reply(id).await;
    assert_eq!(back["payload"]["chat_id"], "default", "{back}");
    let list = channel_list(&mut t.a).await;
    assert_eq!(defaults(&list), vec!["default".to_owned()]);
    assert_eq!(entry(&list, &x).unwrap()["kind"], "channel");
}

#[tokio::test]
async fn auto_thread_follows_the_new_default() {
    let mut t = two_devices().await;
    let x = id_of(&create(&mut t, json!({ "name": "New home", "kind": "channel" })).await);
    let id =
        t.a.request("channel.set_default", Some(&x), None, json!({}))
            .await;
    assert_eq!(frame_type(&t.a.recv_reply(id).await), "channel.renamed");

    // In the new default's flat lane, auto_thread mints a thread under it.
    t.a.send_auto_threaded(Some(&x), "Threaded in the new home")
        .await;
    let frames = until_typing_off(&mut t.a).await;
    let created = frames
        .iter()
        .find(|f| frame_type(f) == "channel.created")
        .unwrap_or_else(|| panic!("no auto thread in the new default: {frames:?}"));
    assert_eq!(
        created["payload"]["parent_chat_id"],
        x.as_str(),
        "{created}"
    );
    assert_eq!(created["payload"]["auto"], true, "{created}");
    let thr = id_of(&created["payload"]);
    let echo = frames.iter().find(|f| frame_type(f) == "message").unwrap();
    assert_eq!(echo["chat_id"], x.as_str(), "{echo}");
    assert_eq!(echo["thread_id"], thr.as_str(), "{echo}");

    // In the old default it no longer threads.
    let before = channel_list(&mut t.a).await;
    t.a.send_auto_threaded(Some("default"), "Not threaded any more")
        .await;
    let frames = until_typing_off(&mut t.a).await;
    assert!(
        frames.iter().all(|f| frame_type(f) != "channel.created"),
        "auto_thread in the old default minted a thread: {frames:?}"
    );
    let echo = frames.iter().find(|f| frame_type(f) == "message").unwrap();
    assert_eq!(echo["chat_id"], "default", "{echo}");
    assert!(echo.get("thread_id").is_none(), "{echo}");
    assert_eq!(channel_list(&mut t.a).await, before);

    // No chat_id now means the new default.
    t.a.send_text(None, None, "where am I").await;
    let frames = until_typing_off(&mut t.a).await;
    let echo = frames.iter().find(|f| frame_type(f) == "message").unwrap();
    assert_eq!(echo["chat_id"], x.as_str(), "{echo}");
}

#[tokio::test]
async fn automation_channel_refuses_messages_until_turned_off() {
    let mut t = two_devices().await;
    let chan = id_of(&create(&mut t, json!({ "name": "Webhooks", "kind": "channel" })).await);
    set_automation(&mut t, &chan, true).await;

    let id = t.a.send_text(Some(&chan), None, "let me in").await;
    let reply = t.a.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "error", "{reply}");
    assert_eq!(reply["payload"]["code"], "unsupported", "{reply}");
    // Nothing was stored.
    let id = t.a.request("history", Some(&chan), None, json!({})).await;
    let page = t.a.recv_reply(id).await;
    assert_eq!(page["payload"]["messages"], json!([]), "{page}");

    set_automation(&mut t, &chan, false).await;
    let id = t.a.send_text(Some(&chan), None, "let me in").await;
    let reply = t.a.recv_reply(id).await;
    assert_eq!(frame_type(&reply), "read.receipt", "{reply}");
    let stop = t.a.recv_type("message.stop").await;
    assert_eq!(stop["chat_id"], chan.as_str());
    // B saw the echo in that channel.
    let echo = t.b.recv_type("message").await;
    assert_eq!(echo["chat_id"], chan.as_str());
    assert_eq!(echo["payload"]["text"], "let me in");
}

// ---------------------------------------------------------------------------------------------
// Tests: persistence and consistency
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn directory_survives_restart() {
    let mut t = two_devices().await;
    let x = id_of(&create(&mut t, json!({ "name": "Projects", "kind": "channel" })).await);
    let bots = id_of(&create(&mut t, json!({ "name": "Bots", "kind": "channel" })).await);
    let thr = id_of(
        &create(
            &mut t,
            json!({ "name": "Garden", "kind": "thread", "parent_chat_id": x }),
        )
        .await,
    );
    change(
        &mut t,
        "channel.rename",
        &x,
        json!({ "name": "Projects 2" }),
    )
    .await;
    change(&mut t, "channel.favorite", &x, json!({ "on": true })).await;
    change(
        &mut t,
        "channel.icon",
        &x,
        json!({ "icon": TINY_PNG_B64, "color": "#12abEF" }),
    )
    .await;
    set_automation(&mut t, &bots, true).await;
    change(&mut t, "channel.set_default", &x, json!({})).await;
    let before = channel_list(&mut t.a).await;
    assert_eq!(before.len(), 4, "{before:?}");

    let Two {
        dir,
        mut gw,
        pa,
        pb,
        a,
        b,
    } = t;
    a.close().await;
    b.close().await;
    gw.stop_ok();
    drop(gw);

    let gw = Gateway::start(dir.path(), &[]);
    let (mut a, ack_a) = connect(&gw, &pa).await;
    let (_b, ack_b) = connect(&gw, &pb).await;
    let after = ack_a["payload"]["channels"].as_array().unwrap().clone();
    assert_eq!(after, before, "hello.ack.channels after restart");
    assert_eq!(ack_b["payload"]["channels"], ack_a["payload"]["channels"]);

    let px = entry(&after, &x).unwrap();
    assert_eq!(px["name"], "Projects 2");
    assert_eq!(px["favorite"], true);
    assert_eq!(px["icon"], TINY_PNG_B64);
    assert!(px["color"]
        .as_str()
        .is_some_and(|c| c.eq_ignore_ascii_case("#12abEF")));
    assert_eq!(
        (px["is_default"].clone(), px["kind"].clone()),
        (json!(true), json!("default"))
    );
    assert_eq!(after[0]["chat_id"], x.as_str(), "default first");
    assert_eq!(entry(&after, &bots).unwrap()["automation"], true);
    assert_eq!(entry(&after, &thr).unwrap()["parent_chat_id"], x.as_str());
    let g = entry(&after, "default").unwrap();
    assert_eq!(
        (g["is_default"].clone(), g["kind"].clone()),
        (json!(false), json!("channel"))
    );
    assert_eq!(defaults(&after), vec![x.clone()]);
    assert_eq!(
        channel_list(&mut a).await,
        before,
        "channel.list after restart"
    );

    // Automation still refuses messages after the restart.
    let id = a.send_text(Some(&bots), None, "hi").await;
    let r = a.recv_reply(id).await;
    assert_eq!(r["payload"]["code"], "unsupported", "{r}");
}

#[tokio::test]
async fn channel_list_matches_hello_ack_after_changes() {
    let mut t = two_devices().await;
    let x = id_of(&create(&mut t, json!({ "name": "One", "kind": "channel" })).await);
    let y = id_of(&create(&mut t, json!({ "name": "Two", "kind": "channel" })).await);
    create(
        &mut t,
        json!({ "name": "Sub", "kind": "thread", "parent_chat_id": y }),
    )
    .await;
    change(
        &mut t,
        "channel.icon",
        &y,
        json!({ "icon": TINY_PNG_B64, "color": "#000000" }),
    )
    .await;
    change(&mut t, "channel.favorite", &x, json!({ "on": true })).await;
    delete(&mut t, &x).await;
    change(&mut t, "channel.set_default", &y, json!({})).await;

    let (mut c, ack) = connect(&t.gw, &t.pb).await;
    let listed = channel_list(&mut c).await;
    assert_eq!(
        ack["payload"]["channels"],
        Value::Array(listed.clone()),
        "hello.ack.channels must equal channel.list"
    );
    assert_eq!(listed, channel_list(&mut t.a).await);
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert_eq!(
        listed[0]["chat_id"],
        y.as_str(),
        "default first: {listed:?}"
    );
}

#[tokio::test]
async fn deleting_a_thread_mid_turn_leaves_no_lane_behind() {
    let dir = common::temp_data_dir();
    let gw = Gateway::start(dir.path(), &["--demo-pace-ms", "20"]);
    let p = pair(dir.path(), "deleter");
    let (mut a, _) = connect(&gw, &p).await;
    let id = a
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Busy", "kind": "channel" }),
        )
        .await;
    let chan = id_of(&a.recv_reply(id).await["payload"]);
    let id = a
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Short-lived", "kind": "thread", "parent_chat_id": chan }),
        )
        .await;
    let thr = id_of(&a.recv_reply(id).await["payload"]);

    a.send_text(Some(&chan), Some(&thr), "count while I delete")
        .await;
    a.recv_type("message.start").await;
    let id = a
        .request("channel.delete", Some(&thr), None, json!({}))
        .await;
    let r = a.recv_reply(id).await;
    assert_eq!(frame_type(&r), "channel.deleted", "{r}");
    // The running turn ends (typing off) whatever it does with its reply.
    until_typing_off(&mut a).await;
    let after_delete: Vec<String> = {
        let at = a
            .seen
            .iter()
            .position(|f| f.get("id").and_then(Value::as_i64) == Some(id))
            .unwrap();
        a.seen[at + 1..]
            .iter()
            .map(|f| frame_type(f).to_owned())
            .collect()
    };

    let id = a
        .request("history", Some(&chan), Some(&thr), json!({}))
        .await;
    let r = a.recv_reply(id).await;
    assert_eq!(
        r["payload"]["code"], "not_found",
        "history of the deleted thread: {r}"
    );

    // A new device's greeting has no todo list for a lane that no longer exists, neither now
    // nor after a restart.
    let todo_frames = |frames: Vec<Value>| -> Vec<String> {
        frames
            .iter()
            .filter(|f| frame_type(f) == "todo.update")
            .map(Value::to_string)
            .collect()
    };
    let (mut c, _) = connect(&gw, &p).await;
    let stale_live = todo_frames(c.collect_quiet(Duration::from_millis(300)).await);
    c.close().await;
    a.close().await;
    let mut gw = gw;
    assert!(gw.sigterm().success(), "{}", gw.output_tail());
    drop(gw);
    let gw = Gateway::start(dir.path(), &[]);
    let (mut c, _) = connect(&gw, &p).await;
    let stale_restarted = todo_frames(c.collect_quiet(Duration::from_millis(300)).await);
    assert!(
        stale_live.is_empty() && stale_restarted.is_empty(),
        "todo snapshot for thread {thr}, deleted mid-turn:\n  live: {stale_live:?}\n  \
         after restart: {stale_restarted:?}\nframes A got after channel.deleted: {after_delete:?}"
    );
}
