//! Fan-out's state: the devices connected past the hello gate (their outlets) and how far durable
//! frames have been published to them. Its one owner; the rest of the hub asks it for outlets
//! and never keeps the map.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use crate::outlet::{ConnId, Outlet};

pub struct Fanout {
    inner: RefCell<Inner>,
}

struct Inner {
    outlets: HashMap<ConnId, Rc<Outlet>>,
    next_conn_id: ConnId,
    /// Highest cursor that is durable and has been fanned out; `sync` replays up to here.
    published_head: u64,
}

impl Fanout {
    /// Nobody connected; everything up to `head` (the store's) counts as published.
    pub(super) fn new(head: u64) -> Fanout {
        Fanout {
            inner: RefCell::new(Inner {
                outlets: HashMap::new(),
                next_conn_id: 1,
                published_head: head,
            }),
        }
    }

    pub(super) fn next_conn_id(&self) -> ConnId {
        let mut i = self.inner.borrow_mut();
        i.next_conn_id += 1;
        i.next_conn_id
    }

    /// The outlet takes frames from now on.
    pub(super) fn add(&self, outlet: Rc<Outlet>) {
        self.inner
            .borrow_mut()
            .outlets
            .insert(outlet.conn_id, outlet);
    }

    pub(super) fn remove(&self, conn_id: ConnId) -> Option<Rc<Outlet>> {
        self.inner.borrow_mut().outlets.remove(&conn_id)
    }

    pub(super) fn get(&self, conn_id: ConnId) -> Option<Rc<Outlet>> {
        self.inner.borrow().outlets.get(&conn_id).cloned()
    }

    /// Every connected outlet (a copy: pushing to one may close it, which must not find the map
    /// borrowed).
    pub(super) fn all(&self) -> Vec<Rc<Outlet>> {
        self.inner.borrow().outlets.values().cloned().collect()
    }

    /// The outlets of one device (it may have several sockets open).
    pub(super) fn of_device(&self, device_id: &str) -> Vec<Rc<Outlet>> {
        self.inner
            .borrow()
            .outlets
            .values()
            .filter(|o| o.device_id == device_id)
            .cloned()
            .collect()
    }

    pub(super) fn count(&self) -> usize {
        self.inner.borrow().outlets.len()
    }

    /// Device ids with a socket open.
    pub(super) fn device_ids(&self) -> HashSet<String> {
        self.inner
            .borrow()
            .outlets
            .values()
            .map(|o| o.device_id.clone())
            .collect()
    }

    pub(super) fn published_head(&self) -> u64 {
        self.inner.borrow().published_head
    }

    /// The frame at `cursor` is durable and on its way to every live outlet.
    pub(super) fn published(&self, cursor: u64) {
        self.inner.borrow_mut().published_head = cursor;
    }
}
