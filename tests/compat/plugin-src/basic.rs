//! A plugin for the compatibility tests, compiled against one fixture
//! release of offstage-plugin-api (1.0, 1.1-with-a-changed-field, 2.0).
//! It is named after its package (`offstage-compat-older` → `compat-older`)
//! and adds a tool of that name which calls the session domain through
//! both faces, so a test can see it working in today's host.

use offstage_plugin_api::prelude::*;

fn name() -> &'static str {
    env!("CARGO_PKG_NAME").trim_start_matches("offstage-")
}

struct Compat;

impl Plugin for Compat {
    fn manifest() -> Manifest {
        Manifest::new(name(), env!("CARGO_PKG_VERSION")).capabilities([
            capability::SESSION_READ,
            capability::SESSION_WRITE,
            capability::TOOL_ADD,
        ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let host = ctx.clone();
        ctx.tools().add(
            ToolSpec::new(name(), "calls the session domain"),
            move |call: ToolCall| {
                let ctx = host.clone();
                async move {
                    let domain = ctx.session();
                    let created = domain
                        .create(NewSession {
                            title: Some(format!("made by {}", name())),
                            ..Default::default()
                        })
                        .await?;
                    let renamed =
                        domain.rename_blocking(&created.id, &format!("renamed by {}", name()))?;
                    let listed = domain.list().await?.iter().any(|s| s.id == created.id);
                    let output = json!({
                        "created": created.id,
                        "renamed": renamed.title,
                        "listed": listed,
                    });
                    Ok(ToolResult {
                        call_id: call.job_id.clone(),
                        job_id: call.job_id,
                        status: ToolStatus::Completed,
                        output: output.to_string(),
                        exit_code: Some(0),
                        output_path: None,
                    })
                }
            },
        )?;
        Ok(Compat)
    }
}

export_plugin!(Compat);
