//! The pages are templates that escape every value they show: a device name, a User-Agent, a
//! push target and a log search made of markup reach the page as text, in element text and in
//! attribute values alike, over the real binary's admin page.

mod common;

use common::web::Web;
use common::{hello_paired_with, pair, temp_data_dir, Client, Gateway};
use serde_json::json;

const PASSPHRASE: &str = "violet tractor harbour 42";

/// Closes an attribute, then opens an element with a handler: harmless only if escaped.
const HOSTILE: &str = "\"><img src=x onerror=alert(1)>";
/// [`HOSTILE`] as a template writes it, in text or in a quoted attribute.
const HOSTILE_ESCAPED: &str = "&quot;&gt;&lt;img src=x onerror=alert(1)&gt;";

#[track_caller]
fn assert_shown_as_text(body: &str, page: &str) {
    assert!(
        !body.contains("<img"),
        "{page} made an element of a value:\n{body}"
    );
    assert!(
        body.contains(HOSTILE_ESCAPED),
        "{page} does not show the value as text:\n{body}"
    );
}

#[tokio::test]
async fn markup_in_a_name_a_user_agent_a_push_target_or_a_search_is_shown_as_text() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let mut web = Web::new(&gw, "127.0.0.1");
    assert_eq!(web.claim(PASSPHRASE).await.status, 200);

    // A phone named with markup, pushing through ntfy (so it is a push test target), and one
    // whose WebSocket upgrade's User-Agent is markup.
    let named = pair(dir.path(), HOSTILE);
    let (_named, _ack) = hello_paired_with(
        &gw,
        &named,
        json!({ "caps": { "push": "ntfy" }, "ntfy_topic": "iris-escaping-1" }),
    )
    .await;
    let agent = pair(dir.path(), "agent");
    let mut c = Client::open_with(&gw.url, &[("User-Agent", HOSTILE)]).await;
    c.hello_on(&agent.token, "iris-agent").await;

    let devices = web.get("/admin/devices").await;
    assert_eq!(devices.status, 200);
    // The rename field's value (an attribute) and the User-Agent's cell (text).
    assert!(
        devices
            .body
            .contains(&format!("name=\"name\" value=\"{HOSTILE_ESCAPED}\"")),
        "{}",
        devices.body
    );
    assert_shown_as_text(&devices.body, "Devices");

    let push = web.get("/admin/push").await;
    assert_eq!(push.status, 200);
    assert_shown_as_text(&push.body, "Push");

    let log = web
        .get("/admin/log?q=%22%3E%3Cimg+src%3Dx+onerror%3Dalert%281%29%3E")
        .await;
    assert_eq!(log.status, 200);
    assert!(
        log.body
            .contains(&format!("name=\"q\" value=\"{HOSTILE_ESCAPED}\"")),
        "{}",
        log.body
    );
    assert_shown_as_text(&log.body, "Log");
}
