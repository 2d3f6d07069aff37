//! The forwarding ABI values: each hook a child registers is held by the
//! host's registries as a [`Remote`], whose calls go over the channel to
//! the child under the plugin's deadlines, and whose export, shutdown and
//! release act on the child process.

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use tokio::runtime::Handle;

use super::Link;
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        abi::{
            block_on_host,
            remote::{Downstream, HeldNext},
        },
        isolate::wire::{HookKind, Note, Request},
    },
    util::{BoxFuture, LockExt},
};

/// Takes the `next` of a finished or abandoned wrapper call back.
struct NextGuard<'a> {
    link: &'a Link,
    id: u64,
}

impl Drop for NextGuard<'_> {
    fn drop(&mut self) {
        self.link.nexts.lock_unpoisoned().remove(&self.id);
    }
}

/// A link as the forwarding ABI values hold it.
pub(super) struct Remote(pub(super) Arc<Link>);

impl Downstream for Remote {
    fn invoke(&self, hook: u64, input: String) -> BoxFuture<Result<String>> {
        let link = Arc::clone(&self.0);
        Box::pin(async move {
            let kind = link.hooks.lock_unpoisoned().get(&hook).copied();
            let (deadline, what) = match kind {
                Some(HookKind::Subscription) => (Some(link.settings().event_timeout), "an event"),
                Some(HookKind::Agent) => (link.settings().call_timeout, "an agent turn"),
                _ => (link.settings().call_timeout, "a tool call"),
            };
            let _in_flight = link.call_in_flight();
            let call = link.peer.call(Request::Invoke { hook, input });
            link.end_if_panicked(link.with_deadline(deadline, what, call).await)
        })
    }

    fn wrap(&self, hook: u64, input: String, next: HeldNext) -> BoxFuture<Result<String>> {
        let link = Arc::clone(&self.0);
        Box::pin(async move {
            let id = link.next_ids.fetch_add(1, Ordering::Relaxed);
            link.nexts.lock_unpoisoned().insert(id, next);
            let _guard = NextGuard { link: &link, id };
            let _in_flight = link.call_in_flight();
            let call = link.peer.call(Request::Wrap {
                hook,
                input,
                next: id,
            });
            let answered = Arc::new(AtomicBool::new(false));
            let flag = Arc::clone(&answered);
            let call = Box::pin(async move {
                let result = call.await;
                flag.store(true, Ordering::SeqCst);
                result
            });
            let deadline = link.settings().call_timeout;
            let result = link.with_deadline(deadline, "a tool wrapper", call).await;
            // Given up on (past its deadline) or dead: the wrapper is lost,
            // and a call it started goes on without it (`tool::chain`).
            let dead = link.exited.borrow().is_some();
            if result.is_err() && (dead || !answered.load(Ordering::SeqCst)) {
                crate::tool::chain::note_wrapper_lost();
            }
            link.end_if_panicked(result)
        })
    }

    fn drop_hook(&self, hook: u64) {
        self.0.hooks.lock_unpoisoned().remove(&hook);
        self.0.peer.note(Note::DropHook { hook });
    }

    fn export(&self) -> Result<Option<String>> {
        if !self.0.peer.is_closed() {
            let call = self.0.peer.call(Request::Export);
            let deadline = self.0.settings().control_timeout;
            let exported = block_on_host(&self.0.runtime, async move {
                tokio::time::timeout(deadline, call).await
            })?;
            if let Ok(Ok(json)) = exported {
                let state: Option<String> = serde_json::from_str(&json)
                    .map_err(|e| ServiceError::Plugin(format!("bad exported state: {e}")))?;
                *self.0.last_state.lock_unpoisoned() = state.clone();
                return Ok(state);
            }
        }
        // Dead or not answering: what it exported last.
        Ok(self.0.last_state.lock_unpoisoned().clone())
    }

    fn shutdown(&self) -> Result<()> {
        self.0.ending.store(true, Ordering::Release);
        if self.0.peer.is_closed() {
            return Ok(());
        }
        let call = self.0.peer.call(Request::Shutdown);
        let deadline = self.0.settings().control_timeout;
        let done = block_on_host(&self.0.runtime, async move {
            tokio::time::timeout(deadline, call).await
        })?;
        match done {
            Ok(result) => result.map(drop),
            Err(_) => Err(ServiceError::Plugin(
                "shutdown did not answer in time".into(),
            )),
        }
    }

    fn release(&self) {
        self.0.release();
    }

    fn runtime(&self) -> &Handle {
        &self.0.runtime
    }
}
