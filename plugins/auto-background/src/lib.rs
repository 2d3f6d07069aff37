//! # auto-background
//!
//! Moves a `shell` call to the background when it is still running after
//! `after_ms` milliseconds. The session gets the output so far at once and
//! goes on with its turn; when the command ends, the host adds a notice with
//! the rest of the output and wakes the session.
//!
//! Only the plugin's *own* call is moved
//! (`BackgroundRequest::job(session, job)`): other calls blocking the same
//! session are left alone.
//!
//! ```toml
//! [plugin.auto-background]
//! after_ms = 2000                           # default
//! ignore = ["vim *", "*--interactive*"]     # commands to leave alone
//! ```

use offstage_plugin_api::prelude::*;
use serde::Deserialize;

/// The plugin's options: the keys of its `[plugin.auto-background]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Options {
    /// How long a shell call may block its session before it is moved.
    pub after_ms: u64,
    /// Wildcard patterns (`*` any text, `?` one character) of commands that
    /// always stay in the foreground. A pattern matches the whole command,
    /// leading and trailing spaces ignored.
    pub ignore: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            after_ms: 2000,
            ignore: Vec::new(),
        }
    }
}

impl Options {
    /// Whether `command` matches one of the `ignore` patterns.
    pub fn ignores(&self, command: &str) -> bool {
        let command = command.trim();
        self.ignore
            .iter()
            .any(|pattern| wildcard_match(pattern.trim(), command))
    }
}

/// Matches `text` against `pattern` (`*` any run of characters, `?`
/// exactly one): the plugin API's matcher, the same rules as the host's
/// permission config.
pub use offstage_plugin_api::pattern::wildcard_match;

/// The plugin. It holds nothing but its options: all the work happens in
/// the `shell` wrapper registered at `init`.
pub struct AutoBackground {
    options: Options,
}

impl AutoBackground {
    /// The options the plugin runs with.
    pub fn options(&self) -> &Options {
        &self.options
    }
}

impl Plugin for AutoBackground {
    fn manifest() -> Manifest {
        Manifest::new("auto-background", env!("CARGO_PKG_VERSION"))
            .description("moves shell calls that outlive a timer to the background")
            .capabilities([capability::TOOL_WRAP, capability::SESSION_BACKGROUND])
    }

    fn init(ctx: Context) -> Result<Self> {
        let options: Options = ctx.options()?;
        let after = Duration::from_millis(options.after_ms);
        let host = ctx.clone();
        let wrapper_options = options.clone();
        ctx.tools().wrap("shell", move |call: ToolCall, next: Next| {
            let ctx = host.clone();
            let command = call.input["command"].as_str().unwrap_or_default().to_string();
            // Calls that start in the background, or that the user wants
            // left alone, go straight through.
            let leave_alone = call.input["background"].as_bool() == Some(true) || wrapper_options.ignores(&command);
            async move {
                if leave_alone {
                    return next.run(call).await;
                }
                let (session_id, job_id) = (call.session_id.clone(), call.job_id.clone());
                let run = match ctx.race(after, next.run(call)).await {
                    Raced::Finished(result) => return result,
                    Raced::Running(run) => {
                        // Move exactly this call; its caller gets the
                        // output so far, the session's other calls stay.
                        let request = BackgroundRequest::job(session_id, job_id.clone());
                        match ctx.session().background(request).await {
                            Ok(moved) if !moved.is_empty() => {
                                tracing::info!(job = %job_id, command = %command, "moved to the background after {after:?}");
                            }
                            Ok(_) => {
                                tracing::debug!(job = %job_id, "nothing to move: the call was no longer blocking");
                            }
                            // Failing to move is no reason to fail the
                            // command: it simply stays in the foreground.
                            Err(error) => tracing::warn!(job = %job_id, %error, "could not move to the background"),
                        }
                        run
                    }
                };
                // The job goes on; what we return now is what its notice
                // reports.
                run.await
            }
        })?;
        tracing::info!(after_ms = options.after_ms, ignore = ?options.ignore, "auto-background ready");
        Ok(AutoBackground { options })
    }
}

export_plugin!(AutoBackground, name = "auto-background");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_defaults_and_ignore() {
        let options: Options = serde_json::from_value(json!({})).unwrap();
        assert_eq!(options, Options::default());
        assert_eq!(options.after_ms, 2000);
        let options: Options = serde_json::from_value(json!({"ignore": ["npm run dev*"]})).unwrap();
        assert!(options.ignores("  npm run dev -- --port 3000 "));
        assert!(!options.ignores("npm test"));
        assert!(serde_json::from_value::<Options>(json!({"after": 5})).is_err());
    }
}
