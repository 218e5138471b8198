//! The hello gate: nothing but an `error` reaches a socket before a good `hello`, and a device
//! that does not say one in time, or says it wrong, is closed with the reason why.

use std::net::SocketAddr;
use std::rc::Rc;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::error::Error as WsError;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;
use tracing::info;

use crate::hub::Hub;
use crate::outlet::{encode_text, Outlet};
use crate::protocol::{decode_request, ErrorCode, Frame, Request};

use super::violation::{close_code, violation};
use super::{Ws, DRAIN_TIMEOUT};

/// Nothing but an `error` reaches a socket before a good hello.
pub async fn gate(
    hub: &Rc<Hub>,
    ws: &mut Ws,
    peer: SocketAddr,
    user_agent: Option<&str>,
    deadline: tokio::time::Instant,
) -> Option<Rc<Outlet>> {
    let refuse = |id, code, msg: String| Frame::error(id, code, msg).encode();
    let first = match tokio::time::timeout_at(deadline, ws.next()).await {
        Ok(Some(Ok(Message::Text(t)))) => t,
        Ok(Some(Ok(Message::Binary(_)))) => {
            let e = refuse(None, ErrorCode::Auth, "send a hello frame first".into());
            close_with(ws, e, CloseCode::Policy, "hello required").await;
            return None;
        }
        Ok(Some(Err(WsError::Capacity(_)))) => {
            let e = refuse(None, ErrorCode::Unsupported, "frame too large".into());
            close_with(ws, e, CloseCode::Size, "frame too large").await;
            return None;
        }
        Ok(Some(Err(e))) => {
            if let Some((reason, message)) = violation(&e) {
                let code = close_code(reason);
                info!(%peer, "closing before hello with {}: {e}", u16::from(code));
                let e = refuse(None, ErrorCode::Unsupported, message);
                close_with(ws, e, code, reason.text()).await;
            }
            return None;
        }
        Ok(_) => return None,
        Err(_) => {
            let e = refuse(
                None,
                ErrorCode::Auth,
                "no hello within the time limit".into(),
            );
            close_with(ws, e, CloseCode::Policy, "hello timeout").await;
            return None;
        }
    };
    let frame = match decode_request(first.as_str()) {
        Ok(f) => f,
        Err(e) => {
            // Whatever the first frame got wrong, what the device lacks is a valid hello.
            let bytes = refuse(
                e.id,
                ErrorCode::Auth,
                format!("send a valid hello first: {}", e.message),
            );
            close_with(ws, bytes, CloseCode::Policy, "bad hello").await;
            return None;
        }
    };
    let Request::Hello(hello) = &frame.request else {
        let e = refuse(frame.id, ErrorCode::Auth, "send a hello frame first".into());
        close_with(ws, e, CloseCode::Policy, "hello required").await;
        return None;
    };
    match hub.devices().authenticate(hello, peer.ip(), user_agent) {
        Ok(device) => {
            let outlet = Rc::new(Outlet::new(hub.next_conn_id(), device.device_id.clone()));
            outlet.set_append_updates(hello.wants(crate::protocol::EXT_UPDATE_APPEND));
            outlet.set_busy_frames(hello.wants(crate::protocol::EXT_AGENT_BUSY));
            outlet.set_read_markers(hello.wants(crate::protocol::EXT_READ_RECEIPT));
            hub.devices().attach(&outlet, frame.id);
            Some(outlet)
        }
        Err(refused) => {
            info!(%peer, "hello refused: {}", refused.message);
            let e = refuse(frame.id, refused.code, refused.message);
            close_with(ws, e, CloseCode::Policy, "hello refused").await;
            None
        }
    }
}

/// Before a hello: the refusal, then the close frame, within the drain timeout.
async fn close_with(ws: &mut Ws, frame: Bytes, code: CloseCode, reason: &'static str) {
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, async {
        ws.send(Message::Text(encode_text(frame))).await?;
        ws.close(Some(CloseFrame {
            code,
            reason: reason.into(),
        }))
        .await
    })
    .await;
}
