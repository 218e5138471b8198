//! iris-gateway: connects the Iris chat app on a household's phones to their Hermes agent.
//!
//! One process, one thread, one event loop (tokio `current_thread`). The modules follow a
//! frame's path: the `front` (one port: TLS, HTTP, routing) hands a WebSocket to a device's
//! `session` (hello, limits), which hands requests to the `hub` (routing, lanes, fan-out); the hub
//! writes through the `store` (sled and SQLite), asks the `agent`, and sends through each
//! device's `outlet` (the bounded per-device queue the session drains). The wire
//! format lives in `protocol`, pure and I/O-free. Imports only go down the layers that
//! docs/architecture.md draws and tests/layering.rs holds.

pub mod admin;
pub mod agent;
pub mod approval;
pub mod atomic_file;
pub mod backups;
pub mod board;
pub mod cli;
pub mod command;
pub mod config;
pub mod control;
pub mod discovery;
pub mod disk;
pub mod front;
pub mod guessing;
pub mod hints;
pub mod http_client;
pub mod hub;
pub mod ids;
pub mod lan;
pub mod logring;
pub mod media;
pub mod memory;
pub mod outlet;
pub mod pairing;
pub mod protocol;
pub mod push;
pub mod server;
pub mod service;
pub mod session;
pub mod settings;
pub mod shutdown;
pub mod store;
pub mod system_health;
pub mod tls;
pub mod units;
pub mod update;
pub mod web;
