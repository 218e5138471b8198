//! What a broken WebSocket stream gets back: the RFC 6455 close code that names the fault, so
//! an app (or whoever debugs it) can tell its own bug from the gateway ending the session.
//!
//! tungstenite reports a protocol violation as a read error and leaves it to the caller to
//! close; without this the session would end with 1000 "bye", as if nothing were wrong.

use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::outlet::CloseReason;

/// The close code a reason is told with (RFC 6455 §7.4): the outlet says why, the socket says
/// it in WebSocket terms.
pub fn close_code(reason: CloseReason) -> CloseCode {
    match reason {
        CloseReason::Bye => CloseCode::Normal,
        CloseReason::Revoked | CloseReason::RateLimited => CloseCode::Policy,
        CloseReason::Restarting => CloseCode::Restart,
        CloseReason::SlowConsumer => CloseCode::Again,
        CloseReason::FrameTooLarge => CloseCode::Size,
        CloseReason::SendFailed => CloseCode::Error,
        CloseReason::InvalidUtf8 => CloseCode::Invalid,
        CloseReason::ProtocolViolation => CloseCode::Protocol,
    }
}

/// How to close after a read error that is the peer's fault: the close reason, and
/// the message of the `error` frame sent before it. `None` for errors that leave nobody to
/// tell (a reset, an I/O failure) or that are handled elsewhere (an oversized frame).
pub fn violation(e: &WsError) -> Option<(CloseReason, String)> {
    match e {
        // RFC 6455 §8.1: a text frame that is not UTF-8 fails the connection with 1007.
        WsError::Utf8(detail) => Some((
            CloseReason::InvalidUtf8,
            format!("a text frame (or close reason) is not valid UTF-8 ({detail}); closing"),
        )),
        WsError::Protocol(p) if is_framing(p) => Some((
            CloseReason::ProtocolViolation,
            format!("WebSocket protocol violation: {p}; closing"),
        )),
        _ => None,
    }
}

/// Faults in the frames a client sent, as opposed to the handshake or a vanished peer.
fn is_framing(p: &ProtocolError) -> bool {
    matches!(
        p,
        ProtocolError::NonZeroReservedBits
            | ProtocolError::UnmaskedFrameFromClient
            | ProtocolError::FragmentedControlFrame
            | ProtocolError::ControlFrameTooBig
            | ProtocolError::UnknownControlFrameType(_)
            | ProtocolError::UnknownDataFrameType(_)
            | ProtocolError::UnexpectedContinueFrame
            | ProtocolError::ExpectedFragment(_)
            | ProtocolError::InvalidOpcode(_)
            | ProtocolError::InvalidCloseSequence
            | ProtocolError::ReceivedAfterClosing
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::Data;

    #[test]
    fn each_fault_gets_its_close_code() {
        let code = |e: WsError| violation(&e).map(|(r, _)| u16::from(close_code(r)));
        assert_eq!(code(WsError::Utf8("bad".into())), Some(1007));
        for p in [
            ProtocolError::NonZeroReservedBits,
            ProtocolError::UnmaskedFrameFromClient,
            ProtocolError::UnknownDataFrameType(3),
            ProtocolError::UnknownControlFrameType(11),
            ProtocolError::UnexpectedContinueFrame,
            ProtocolError::ExpectedFragment(Data::Text),
        ] {
            assert_eq!(code(WsError::Protocol(p)), Some(1002));
        }
        assert_eq!(
            code(WsError::Protocol(
                ProtocolError::ResetWithoutClosingHandshake
            )),
            None
        );
        assert_eq!(code(WsError::ConnectionClosed), None);
    }
}
