//! The Devices page in a real headless Chromium against the real binary: each device shows the
//! address of its last hello, the push service its app named and whether pushes reach it, and
//! the phone this browser paired is marked "This device" (and no other is), and the app and
//! platform its WebSocket upgrade's `User-Agent` named.

mod common;

use common::cdp::Browser;
use common::{hello_paired_with, pair, temp_data_dir, Client, Gateway};
use serde_json::json;

const PASSPHRASE: &str = "violet tractor harbour 42";

/// The text of one cell (by class) of a device's row, or `null` when there is none.
fn cell(device_id: &str, class: &str) -> String {
    format!(
        "(() => {{ const c = document.querySelector('tr[data-device=\"{device_id}\"] .{class}'); \
         return c ? c.textContent : null; }})()"
    )
}

#[tokio::test]
async fn devices_show_their_last_address_push_and_which_is_this_device() {
    let Some(mut b) = Browser::start("devices_show_their_last_address_push").await else {
        return;
    };
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    // Claimed from this browser: the pairing page it shows is for this phone.
    common::cdp::claim(&mut b, gw.addr, PASSPHRASE).await;
    let own = b
        .eval("[...document.querySelectorAll('dd code')].pop().textContent")
        .await;
    let own = own.as_str().unwrap().to_owned();
    assert!(own.starts_with("dev_"), "{own}");

    // Another phone, paired at the box, says hello with ntfy for its pushes.
    let kitchen = pair(dir.path(), "kitchen");
    let (_client, _ack) = hello_paired_with(
        &gw,
        &kitchen,
        json!({ "caps": { "push": "ntfy" }, "ntfy_topic": "iris-kitchen-7f3a" }),
    )
    .await;

    b.goto(&format!("http://{}/admin/devices", gw.addr)).await;
    b.wait_for("document.querySelector('#device-table')", "the devices")
        .await;
    let k = &kitchen.device_id;
    let address = b.eval(&cell(k, "address")).await;
    assert_eq!(address, json!("127.0.0.1"), "kitchen's last address");
    let push = b.eval(&cell(k, "push")).await;
    assert_eq!(push, json!("on, through ntfy"), "kitchen's push");
    // Its upgrade named no User-Agent: nothing is made up.
    let app = b.eval(&cell(k, "app")).await;
    assert_eq!(app, json!("not told"), "kitchen's app");
    assert_eq!(b.eval(&cell(k, "this-device")).await, json!(null));

    // This browser's own phone: marked, never said hello yet, no push address.
    assert_eq!(
        b.eval(&cell(&own, "this-device")).await,
        json!("This device")
    );
    assert_eq!(b.eval(&cell(&own, "address")).await, json!("none yet"));
    assert_eq!(
        b.eval(&cell(&own, "push")).await,
        json!("off: the app gave no push address")
    );
    assert_eq!(
        b.eval("document.querySelectorAll('.this-device').length")
            .await,
        json!(1)
    );
}

#[tokio::test]
async fn devices_show_the_app_and_platform_their_upgrade_named() {
    let Some(mut b) = Browser::start("devices_show_the_app_and_platform").await else {
        return;
    };
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    common::cdp::claim(&mut b, gw.addr, PASSPHRASE).await;

    // The Iris app's own User-Agent, and one naming nothing known, long and with markup.
    let phone = pair(dir.path(), "phone");
    let mut c = Client::open_with(&gw.url, &[("User-Agent", "Iris/1.4 (Android 14)")]).await;
    c.hello_on(&phone.token, "iris-phone").await;
    let odd = pair(dir.path(), "odd");
    let markup = format!("<b>{}</b>", "x".repeat(300));
    let mut d = Client::open_with(&gw.url, &[("User-Agent", &markup)]).await;
    d.hello_on(&odd.token, "iris-odd").await;

    b.goto(&format!("http://{}/admin/devices", gw.addr)).await;
    b.wait_for("document.querySelector('#device-table')", "the devices")
        .await;
    assert_eq!(
        b.eval(&cell(&phone.device_id, "app")).await,
        json!("Iris 1.4 / Android 14")
    );
    // Shown as text (no element made of it), cut well short of the header's 300 bytes.
    let shown = b.eval(&cell(&odd.device_id, "app")).await;
    let shown = shown.as_str().unwrap();
    assert!(shown.starts_with("<b>xxx"), "{shown}");
    assert!(
        shown.ends_with('…') && shown.chars().count() <= 61,
        "{shown}"
    );
    assert_eq!(
        b.eval(&format!(
            "document.querySelectorAll('tr[data-device=\"{}\"] .app b').length",
            odd.device_id
        ))
        .await,
        json!(0)
    );
}
