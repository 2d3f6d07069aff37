//! A plugin built against the "newer" fixture of offstage-plugin-api
//! (1.4.0), which has a `fork` method today's host lacks. Its tool
//! `compat-newer` calls `fork` through both faces — each must come back as
//! `ErrorKind::Unsupported`, not a crash — and other methods (including
//! 1.1's `wait_idle`) that must work.

use offstage_plugin_api::prelude::*;

struct Newer;

fn kind<T>(result: &Result<T>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("{:?}", e.kind()),
    }
}

impl Plugin for Newer {
    fn manifest() -> Manifest {
        Manifest::new("compat-newer", env!("CARGO_PKG_VERSION")).capabilities([
            capability::SESSION_READ,
            capability::SESSION_WRITE,
            capability::TOOL_ADD,
        ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let host = ctx.clone();
        ctx.tools().add(
            ToolSpec {
                name: "compat-newer".into(),
                description: "calls a method the host lacks, and some it has".into(),
            },
            move |call: ToolCall| {
                let ctx = host.clone();
                async move {
                    let domain = ctx.session();
                    let created = domain
                        .create(NewSession {
                            title: Some("made by compat-newer".into()),
                            ..Default::default()
                        })
                        .await?;
                    let fork = domain.fork(&created.id).await;
                    let fork_blocking = domain.fork_blocking(&created.id);
                    let idle = domain.wait_idle(&created.id).await?;
                    let got = domain.get_blocking(&created.id)?;
                    let output = json!({
                        "fork": kind(&fork),
                        "fork_message": fork.err().map(|e| e.message().to_string()),
                        "fork_blocking": kind(&fork_blocking),
                        "idle_status": idle.status,
                        "got_title": got.title,
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
        Ok(Newer)
    }
}

export_plugin!(Newer);
