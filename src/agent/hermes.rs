//! hermes
pub struct HermesAgent;
