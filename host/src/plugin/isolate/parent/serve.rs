//! Serving the child: what a plugin process asks of the host over its
//! channel (a session-domain call, a hook to register, a wrapper's `next`)
//! and the notes it sends (log lines, dropped handles).
//!
//! The channel holds its handler weakly ([`Forward`]), so a link ends with
//! its last holder rather than living as long as its reader.

use std::sync::{Arc, Weak};

use super::{remote::Remote, Link};
use crate::{
    error::Result,
    error::ServiceError,
    plugin::{
        abi::remote::Downstream,
        isolate::wire::{Handler, Note, Request},
    },
    util::{BoxFuture, LockExt},
};

impl Handler for Link {
    fn call(self: Arc<Self>, request: Request) -> BoxFuture<Result<String>> {
        Box::pin(async move {
            match request {
                Request::Session { method, args } => {
                    self.host_ctx()?.call_session(&method, args).await
                }
                Request::Register { kind, name, hook } => {
                    let ctx = self.host_ctx()?;
                    self.hooks.lock_unpoisoned().insert(hook, kind);
                    let link: Arc<dyn Downstream> = Arc::new(Remote(Arc::clone(&self)));
                    ctx.register_remote(kind, name, link, hook)
                        .map(|()| String::new())
                }
                Request::Next { next, input } => {
                    let held = self.nexts.lock_unpoisoned().remove(&next);
                    match held {
                        Some(held) => held.call(input).await,
                        None => Err(ServiceError::InvalidInput(
                            "a wrapper called its `next` twice or after it returned".into(),
                        )),
                    }
                }
                other => Err(ServiceError::Unsupported(format!(
                    "a plugin process cannot ask the host for {other:?}"
                ))),
            }
        })
    }

    fn note(&self, note: Note) {
        match note {
            Note::Log {
                level,
                target,
                message,
            } => {
                // Under `plugin::NAME`, as an in-process plugin's lines;
                // as long as a line of its output at most.
                let message = crate::util::cut(&message, super::output::MAX_LINE);
                let target = crate::util::cut(&target, 256);
                crate::plugin::abi::emit_log(self.name(), level, &target, &message);
            }
            Note::DropNext { next } => {
                self.nexts.lock_unpoisoned().remove(&next);
            }
            Note::DropHook { .. } => {}
        }
    }
}

/// The handler of a link's channel; weak, so a link dies with its last
/// holder rather than with its reader.
pub(super) struct Forward(pub(super) Weak<Link>);

impl Handler for Forward {
    fn call(self: Arc<Self>, request: Request) -> BoxFuture<Result<String>> {
        match self.0.upgrade() {
            Some(link) => link.call(request),
            None => Box::pin(async { Err(ServiceError::Plugin("the plugin is gone".into())) }),
        }
    }

    fn note(&self, note: Note) {
        if let Some(link) = self.0.upgrade() {
            Handler::note(&*link, note);
        }
    }
}
