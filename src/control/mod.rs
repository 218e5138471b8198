//! The local control channel: how the commands reach a running gateway.
//!
//! sled locks its database for one process, so while the gateway runs (the normal case under
//! systemd) no other process can open the store. The gateway therefore listens on a Unix socket
//! in its data dir (mode 0600: only the gateway's user and root reach it) and the commands send
//! it one JSON line and read one back. When nothing listens there, the commands open the store
//! themselves.
//!
//! The request and answer types are in `wire`, the gateway's end in `listen`, the commands'
//! end in `client`. A backup made while the gateway runs goes over this socket too (`backup`):
//! the backups wing (`crate::backups`) makes it, this door only streams it.

pub mod backup;
pub mod client;
pub mod listen;
pub mod wire;

pub use client::{answering, request, Reached};
pub use listen::{bind, serve, PageCode, PageCodeIssuer};
pub use wire::{socket_path, ControlRequest, ControlResponse};
