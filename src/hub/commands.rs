//! Slash commands and pickers.

use std::rc::Rc;

use serde_json::Value;

use super::{Hub, Refusal};
use crate::connection::Outlet;

pub fn catalog(_hub: &Hub) -> Value {
    Value::Array(Vec::new())
}

pub async fn picker_select(
    _hub: &Rc<Hub>,
    _outlet: &Rc<Outlet>,
    _picker_id: &str,
    _value: &str,
) -> Result<(), Refusal> {
    Ok(())
}
