//! The writer: drains the device's outlet onto the socket in order (frames, streamed updates,
//! `sync` replays, media pulls), then tells the device why the session closes.

use std::rc::Rc;

use futures_util::SinkExt;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

use crate::hub::Hub;
use crate::outlet::{Outbound, Outlet};

use super::media_pull::pull;
use super::replay::replay;
use super::send::send_text;
use super::violation::close_code;
use super::{WsSink, DRAIN_TIMEOUT};

/// Drains the outlet onto the socket in order until it closes, then sends the close frame.
pub async fn write_loop(hub: Rc<Hub>, outlet: Rc<Outlet>, mut sink: WsSink) {
    let max_out = hub.limits().max_out_frame_bytes;
    loop {
        if outlet.must_abort() {
            break;
        }
        let item = outlet.pop();
        match item {
            Some(Outbound::Frame { text, .. }) => {
                if send_text(&outlet, &mut sink, text, max_out).await.is_err() {
                    break;
                }
            }
            Some(Outbound::Update { key, streamed }) => {
                let Some(text) = outlet.render_update(key, &streamed) else {
                    continue;
                };
                if send_text(&outlet, &mut sink, text, max_out).await.is_err() {
                    break;
                }
            }
            Some(Outbound::Replay { cursor, id }) => {
                if replay(&hub, &outlet, &mut sink, cursor, id, max_out)
                    .await
                    .is_err()
                {
                    break;
                }
            }
            Some(Outbound::Pull { path, id }) => {
                if pull(&outlet, &mut sink, &path, id).await.is_err() {
                    break;
                }
            }
            None => {
                if outlet.is_closing() {
                    break;
                }
                outlet.woken().await;
            }
        }
    }
    // An aborted send leaves its frame in tungstenite's buffer; the close frame queues behind
    // it, so a device that resumes reading within the timeout still learns why (1013) instead
    // of seeing a bare reset. A socket that failed outright has no closing reason set.
    if let Some(reason) = outlet.closing() {
        let _ = tokio::time::timeout(
            DRAIN_TIMEOUT,
            sink.send(Message::Close(Some(CloseFrame {
                code: close_code(reason),
                reason: reason.text().into(),
            }))),
        )
        .await;
    }
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, sink.close()).await;
}
