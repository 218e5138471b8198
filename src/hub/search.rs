//! `Queries`: the history query path as the hub serves it (`history` pages, `search`,
//! `message.delete`). It owns each device's share of the history query thread (`budget.rs`) and
//! reaches the hub only through its port (`port.rs`): lane resolution, the committer, the turns
//! of deleted messages, media clean-up and the health.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::budget::QueryBudgets;
use super::errors::Refusal;
use super::health::history_damage_fix;
use super::port::{Port, Reply};
use crate::agent::Agent;
use crate::config::Limits;
use crate::outlet::Outlet;
use crate::protocol::fit::{self, OutBudget};
use crate::protocol::{is_valid_id, ErrorCode, Frame, HistoryRequest, SearchRequest, SearchScope};
use crate::store::search::{query_terms, Scope};
use crate::store::{Change, Store, StoreError};

/// What history queries ask of the hub beyond the core: what a message deletion drops (queued
/// turns) and noting a damaged history.
pub(super) trait QueriesPort: Port {
    /// Drops the queued turns of deleted messages.
    fn drop_turns_of(&self, message_ids: &[String]);

    /// A query found the history database damaged: `degraded` with that cause.
    fn note_history_damaged(&self, why: String);
}

/// The history query path and each device's share of its thread.
pub(super) struct Queries {
    store: Store,
    limits: Limits,
    /// Told which messages were deleted, so it forgets them too.
    agent: Rc<dyn Agent>,
    /// Each device's share of the history query thread (`budget.rs`).
    query_budgets: RefCell<QueryBudgets>,
}

impl Queries {
    pub(super) fn new(store: Store, limits: Limits, agent: Rc<dyn Agent>) -> Queries {
        Queries {
            store,
            limits,
            agent,
            query_budgets: RefCell::default(),
        }
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Refuses a query (search, history page) while the device has spent its share of the
    /// history query thread (`budget.rs`).
    pub(super) fn check(&self, device: &str) -> Result<(), Refusal> {
        let l = self.limits();
        self.query_budgets
            .borrow_mut()
            .check(device, Instant::now(), l.query_ms_per_second, l.query_burst_ms)
            .map_err(|wait| {
                Refusal::rate_limited(format!(
                    "this device's searches and history pages used more than {} ms of query time per second (limits.query_ms_per_second, burst limits.query_burst_ms); this request was not processed, retry in {} ms",
                    l.query_ms_per_second,
                    wait.as_millis().max(1)
                ))
            })
    }

    /// Charges what a query took on the query thread to the device's budget.
    pub(super) fn charge(&self, device: &str, took: Duration) {
        let l = self.limits();
        self.query_budgets.borrow_mut().charge(
            device,
            Instant::now(),
            took,
            l.query_ms_per_second,
            l.query_burst_ms,
        );
    }

    /// What a query that failed gets back. Damage it found in the history database (which
    /// does not heal: every later search, page and backup that reads there fails the same way)
    /// also makes the gateway `degraded` with that cause and what the owner can do.
    pub(super) fn failed(&self, port: &impl QueriesPort, e: StoreError) -> Refusal {
        if !e.is_history_damage() {
            return Refusal::internal(e);
        }
        let cause = format!("{e}; {}", history_damage_fix());
        port.note_history_damaged(cause.clone());
        Refusal::new(ErrorCode::Internal, cause)
    }

    /// `history`: one page of a lane's messages, older than `before_message_id`, within one frame.
    pub(super) async fn history(
        &self,
        port: &impl QueriesPort,
        outlet: &Outlet,
        chat_id: &Option<String>,
        thread_id: &Option<String>,
        id: Option<i64>,
        req: HistoryRequest,
    ) -> Result<(), Refusal> {
        let (lane, _) = port.resolve_lane(chat_id.as_deref(), thread_id.as_deref())?;
        let limits = self.limits();
        let limit = match req.limit {
            None => limits.history_default,
            Some(n) if n >= 1 => (n as usize).min(limits.history_max),
            Some(n) => {
                return Err(Refusal::unsupported(format!(
                    "history limit must be at least 1 (got {n})"
                )))
            }
        };
        self.check(&outlet.device_id)?;
        let (page, took) = self
            .store
            .query_history_page(lane.clone(), req.before_message_id.clone(), limit)
            .await
            .map_err(|e| self.failed(port, e))?;
        self.charge(&outlet.device_id, took);
        let page = page.map_err(|other| {
            let before = req.before_message_id.as_deref().unwrap_or("");
            Refusal::not_found(match other {
                Some(other) => {
                    format!("before_message_id `{before}` belongs to {other}, not {lane}")
                }
                None => format!("before_message_id `{before}`: no such message"),
            })
        })?;
        // Bounded by bytes as well as by count: a page that would not fit one frame ends
        // early, saying `has_more`, and the app pages on from its oldest message.
        let (messages, cut_short) =
            fit::history_within(page.messages, &OutBudget::new(limits.max_out_frame_bytes));
        let oldest = messages.first().map(|m| m.message_id.as_str());
        outlet.push_frame(
            &Frame::history(id, &messages, page.has_more || cut_short, oldest)
                .in_lane(&lane.chat_id, lane.thread()),
        );
        Ok(())
    }

    /// `search`: the messages matching a query, in one lane or in all of them. The query runs
    /// on the history query thread; the event loop only awaits it.
    pub(super) async fn search(
        &self,
        port: &impl QueriesPort,
        outlet: &Outlet,
        id: Option<i64>,
        envelope: (Option<String>, Option<String>),
        req: SearchRequest,
    ) -> Result<(), Refusal> {
        let limits = self.limits();
        let query = req.query.trim();
        if query.is_empty() {
            return Err(Refusal::unsupported("the search query is empty"));
        }
        if query.chars().count() > limits.max_query_chars {
            return Err(Refusal::unsupported(format!(
                "the search query is over {} characters (limits.max_query_chars)",
                limits.max_query_chars
            )));
        }
        let words = query_terms(query);
        if words.is_empty() {
            return Err(Refusal::unsupported(
                "the search query has no letters or digits to look for",
            ));
        }
        let limit = match req.limit {
            None => limits.search_default,
            Some(n) if n >= 1 => (n as usize).min(limits.search_max),
            Some(n) => {
                return Err(Refusal::unsupported(format!(
                    "search limit must be at least 1 (got {n})"
                )))
            }
        };
        let scope_kind = req.scope.unwrap_or(SearchScope::All);
        let scope = match scope_kind {
            SearchScope::All => Scope::All,
            SearchScope::Chat => {
                let chat = req
                    .chat_id
                    .or(envelope.0)
                    .ok_or_else(|| Refusal::not_found("scope `chat` needs a chat_id"))?;
                let thread = req.thread_id.or(envelope.1);
                for id in std::iter::once(&chat).chain(thread.as_ref()) {
                    if !is_valid_id(id) {
                        return Err(Refusal::not_found("no such chat"));
                    }
                }
                let (lane, _) = port.resolve_lane(Some(&chat), thread.as_deref())?;
                Scope::Chat {
                    chat_id: lane.chat_id,
                    thread_id: lane.thread_id,
                }
            }
        };
        self.check(&outlet.device_id)?;
        let (hits, took) = self
            .store
            .query_search(words, scope, limit)
            .await
            .map_err(|e| self.failed(port, e))?;
        self.charge(&outlet.device_id, took);
        let hits: Vec<Value> = hits
            .into_iter()
            .map(|mut h| {
                // A snippet centres on the matching word, and a "word" can be a whole message of
                // letters: bound it by its encoded size so 100 hits always fit one frame.
                crate::protocol::fit::cut_in_place(
                    &mut h.snippet,
                    crate::protocol::fit::SNIPPET_BYTES,
                );
                json!({
                    "message_id": h.message.message_id,
                    "chat_id": h.lane.chat_id,
                    "thread_id": h.lane.thread_id,
                    "role": h.message.role,
                    "snippet": h.snippet,
                    "ts": h.message.ts,
                })
            })
            .collect();
        outlet.push_frame(&Frame::search_results(
            id,
            query,
            scope_kind,
            Value::Array(hits),
        ));
        Ok(())
    }

    /// Deletes messages from history, the index and the outbox, then tells every device (and,
    /// through the outbox, every device that is away). Unknown ids are fine: deletion is idempotent.
    pub(super) async fn delete_messages(
        &self,
        port: &impl QueriesPort,
        outlet: &Outlet,
        id: Option<i64>,
        message_ids: Vec<String>,
    ) -> Result<(), Refusal> {
        let max = self.limits().max_delete_ids;
        if message_ids.is_empty() {
            return Err(Refusal::unsupported("message_ids is empty"));
        }
        if message_ids.len() > max {
            return Err(Refusal::unsupported(format!(
                "at most {max} message ids per request (limits.max_delete_ids)"
            )));
        }
        let mut ids: Vec<String> = Vec::new();
        for m in message_ids {
            if !is_valid_id(&m) {
                return Err(Refusal::unsupported(
                    "message ids are 1-64 characters of [A-Za-z0-9_.:-]",
                ));
            }
            if !ids.contains(&m) {
                ids.push(m);
            }
        }
        let mut changes: Vec<Change> = ids
            .iter()
            .map(|m| Change::DeleteMessage {
                message_id: m.clone(),
                tombstone: Frame::message_deleted(None, std::slice::from_ref(m)).encode(),
            })
            .collect();
        changes.push(Change::Outbox(
            Frame::message_deleted(None, &ids).outboxed(),
        ));
        // The files these messages reference, to collect once the messages are gone (read
        // before the turns are dropped, so nothing runs between that and the commit).
        let media = self
            .store
            .query_media_of(ids.clone())
            .await
            .unwrap_or_default();
        port.drop_turns_of(&ids);
        port.commit(
            changes,
            Some(Reply {
                conn: outlet.conn_id,
                at: 0,
                frame: Frame::message_deleted(id, &ids),
            }),
        )
        .await?;
        port.collect_media(&media).await;
        self.agent.forget(&ids);
        Ok(())
    }
}
