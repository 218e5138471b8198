//! The storage engine: sled's handle and everything that opens, checks, recovers, commits and
//! rebuilds it. The subjects above read and write through `handle.rs` and commit through
//! `commit.rs`; nothing else of the crate sees sled. Replacing sled is a change to these
//! files (and the trees' uses in the subjects), listed in docs/architecture.md ("Replace the
//! storage engine").
//!
//! This file only declares the rooms, in the order a start after a power cut walks them
//! (`STORE_ROOMS` in tests/layering.rs): from `recovery.rs` down.

pub(super) mod check;
pub(super) mod commit;
pub(super) mod durability;
pub(super) mod handle;
pub(super) mod kill_points;
pub(super) mod migrate;
pub(super) mod open;
pub(super) mod rebuild;
pub(super) mod recovery;
pub(super) mod replay_bound;
pub(super) mod safety_copy;
pub(super) mod witness;
pub(super) mod witness_clock;
