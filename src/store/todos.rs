//! Each lane's todo list as the agent last reported it (`Record::PutTodos`).

use super::base::Result;
use super::engine::handle::Store;
use super::keys::per_lane;
use crate::protocol::{Lane, TodoItem};

impl Store {
    pub fn all_todos(&self) -> Result<Vec<(Lane, Vec<TodoItem>)>> {
        per_lane(&self.t()?.todos, "todo list")
    }
}
