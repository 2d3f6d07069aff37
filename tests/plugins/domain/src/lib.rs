//! A plugin that walks the session domain through each face of its methods,
//! so the tests can check the results on the host side.
//!
//! It adds one tool, `tour`, whose input `{"face": ...}` picks how the walk
//! calls the host:
//!
//! - `"async"`: every method's `async` face, awaited in the tool's future;
//!   the concurrent call it backgrounds runs in a `ctx.spawn`ed task.
//! - `"thread"`: every method's `_blocking` face, from a `std::thread` the
//!   plugin starts itself; the tool's future waits for that thread.
//! - `"inline"`: the `_blocking` faces called straight from the tool's
//!   future, i.e. on a host runtime worker that is polling a plugin future.
//!
//! The walk: create → get → rename → notice → wait_idle → messages →
//! call_tool (`shell echo`) → background on an idle session (moves nothing)
//! → a `sleep 30` call moved to the background with `background` → jobs →
//! job (the moved one) → job_output (the echo's, whole and a middle page) →
//! cancel_job (the moved one) → interrupt → prompt (in a second session run
//! by this plugin's agent) → prompt_with_agent (a third session, its turn
//! run by this plugin's agent) → list → remove → get (not found). The
//! tool's output is a JSON report.
//!
//! It also registers the agent `domain-echo`, whose async turn uses the
//! blocking face (`get_blocking`) and the async face (`messages`) together.

use std::{sync::mpsc, thread};

use offstage_plugin_api::prelude::*;

struct Domain;

fn shell(command: &str) -> ToolRequest {
    ToolRequest::new("shell", json!({ "command": command }))
}

/// The running, still-blocking `sleep` job of `jobs`, if it has started.
fn blocking_sleep(jobs: &[Job]) -> Option<&Job> {
    jobs.iter()
        .find(|j| j.kind == "shell" && j.status == JobStatus::Running && !j.backgrounded)
}

fn kind_name(result: &Result<Session>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("{:?}", e.kind()),
    }
}

async fn tour_async(ctx: Context) -> Result<Value> {
    let domain = ctx.session();
    let created = domain
        .create(NewSession {
            title: Some("tour-async".into()),
            ..Default::default()
        })
        .await?;
    let id = created.id.clone();
    let got = domain.get(&id).await?;
    let renamed = domain.rename(&id, "tour-async renamed").await?;
    let notice = domain
        .notice(
            &id,
            "note from the domain plugin",
            json!({ "face": "async" }),
        )
        .await?;
    domain.wait_idle(&id).await?;
    let messages = domain.messages(&id).await?;
    let echo = domain.call_tool(&id, shell("echo tour-async")).await?;
    let idle_moves = domain.background(BackgroundRequest::all(&id)).await?;

    let sleeper = {
        let domain = domain.clone();
        let id = id.clone();
        ctx.spawn(async move { domain.call_tool(&id, shell("sleep 30")).await })
    };
    let mut running = None;
    for _ in 0..3000 {
        if let Some(job) = blocking_sleep(&domain.jobs(Some(&id)).await?) {
            running = Some(job.id.clone());
            break;
        }
        ctx.sleep(Duration::from_millis(10)).await;
    }
    let running = running.ok_or_else(|| Error::plugin("the sleep job never started"))?;
    let moved = domain
        .background(BackgroundRequest::of_type(&id, "shell"))
        .await?;
    let sleep_result = sleeper.await??;
    let jobs = domain.jobs(Some(&id)).await?;
    let got_job = domain.job(&running).await?;
    let output_page = domain.job_output(&echo.job_id, 0, None).await?;
    let output_part = domain.job_output(&echo.job_id, 2, Some(3)).await?;
    let output_tail = domain.job_output_tail(&echo.job_id, 3).await?;
    let echo_job = domain.job(&echo.job_id).await?;
    let cancelled = domain.cancel_job(&running).await?;
    let interrupted = domain.interrupt(&id).await?;

    let echo_session = domain
        .create(NewSession {
            title: Some("echo-async".into()),
            agent: Some("domain-echo".into()),
            ..Default::default()
        })
        .await?;
    let turn = domain.prompt(&echo_session.id, "ping-async").await?;
    let plain = domain
        .create(NewSession {
            title: Some("plain-async".into()),
            ..Default::default()
        })
        .await?;
    let agent_turn = domain
        .prompt_with_agent(&plain.id, "pong-async", "domain-echo")
        .await?;
    let plain_after = domain.get(&plain.id).await?;

    let listed = domain.list().await?.iter().any(|s| s.id == id);
    domain.remove(&id).await?;
    let after_remove = domain.get(&id).await;

    Ok(report(Report {
        face: "async",
        created,
        got,
        renamed,
        notice,
        messages,
        echo,
        idle_moves,
        running,
        moved,
        sleep_result,
        jobs,
        got_job,
        output_page,
        output_part,
        output_tail,
        echo_job,
        cancelled,
        interrupted,
        turn,
        agent_turn,
        plain_after,
        listed,
        after_remove: kind_name(&after_remove),
    }))
}

fn tour_blocking(ctx: Context, face: &'static str) -> Result<Value> {
    let domain = ctx.session();
    let created = domain.create_blocking(NewSession {
        title: Some(format!("tour-{face}")),
        ..Default::default()
    })?;
    let id = created.id.clone();
    let got = domain.get_blocking(&id)?;
    let renamed = domain.rename_blocking(&id, &format!("tour-{face} renamed"))?;
    let notice =
        domain.notice_blocking(&id, "note from the domain plugin", json!({ "face": face }))?;
    domain.wait_idle_blocking(&id)?;
    let messages = domain.messages_blocking(&id)?;
    let echo = domain.call_tool_blocking(&id, shell(&format!("echo tour-{face}")))?;
    let idle_moves = domain.background_blocking(BackgroundRequest::all(&id))?;

    let sleeper = {
        let domain = domain.clone();
        let id = id.clone();
        thread::spawn(move || domain.call_tool_blocking(&id, shell("sleep 30")))
    };
    let mut running = None;
    for _ in 0..3000 {
        if let Some(job) = blocking_sleep(&domain.jobs_blocking(Some(&id))?) {
            running = Some(job.id.clone());
            break;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let running = running.ok_or_else(|| Error::plugin("the sleep job never started"))?;
    let moved = domain.background_blocking(BackgroundRequest::of_type(&id, "shell"))?;
    let sleep_result = sleeper
        .join()
        .map_err(|_| Error::plugin("the sleeper thread panicked"))??;
    let jobs = domain.jobs_blocking(Some(&id))?;
    let got_job = domain.job_blocking(&running)?;
    let output_page = domain.job_output_blocking(&echo.job_id, 0, None)?;
    let output_part = domain.job_output_blocking(&echo.job_id, 2, Some(3))?;
    let output_tail = domain.job_output_tail_blocking(&echo.job_id, 3)?;
    let echo_job = domain.job_blocking(&echo.job_id)?;
    let cancelled = domain.cancel_job_blocking(&running)?;
    let interrupted = domain.interrupt_blocking(&id)?;

    let echo_session = domain.create_blocking(NewSession {
        title: Some(format!("echo-{face}")),
        agent: Some("domain-echo".into()),
        ..Default::default()
    })?;
    let turn = domain.prompt_blocking(&echo_session.id, &format!("ping-{face}"))?;
    let plain = domain.create_blocking(NewSession {
        title: Some(format!("plain-{face}")),
        ..Default::default()
    })?;
    let agent_turn =
        domain.prompt_with_agent_blocking(&plain.id, &format!("pong-{face}"), "domain-echo")?;
    let plain_after = domain.get_blocking(&plain.id)?;

    let listed = domain.list_blocking()?.iter().any(|s| s.id == id);
    domain.remove_blocking(&id)?;
    let after_remove = domain.get_blocking(&id);

    Ok(report(Report {
        face,
        created,
        got,
        renamed,
        notice,
        messages,
        echo,
        idle_moves,
        running,
        moved,
        sleep_result,
        jobs,
        got_job,
        output_page,
        output_part,
        output_tail,
        echo_job,
        cancelled,
        interrupted,
        turn,
        agent_turn,
        plain_after,
        listed,
        after_remove: kind_name(&after_remove),
    }))
}

struct Report {
    face: &'static str,
    created: Session,
    got: Session,
    renamed: Session,
    notice: Message,
    messages: Vec<Message>,
    echo: ToolResult,
    idle_moves: Vec<Job>,
    running: String,
    moved: Vec<Job>,
    sleep_result: ToolResult,
    jobs: Vec<Job>,
    got_job: Job,
    output_page: OutputChunk,
    output_part: OutputChunk,
    output_tail: OutputChunk,
    echo_job: Job,
    cancelled: Job,
    interrupted: bool,
    turn: Vec<Message>,
    agent_turn: Vec<Message>,
    plain_after: Session,
    listed: bool,
    after_remove: String,
}

fn report(r: Report) -> Value {
    json!({
        "face": r.face,
        "session_id": r.created.id,
        "created_title": r.created.title,
        "got_id": r.got.id,
        "renamed_title": r.renamed.title,
        "notice_role": r.notice.role,
        "notice_metadata": r.notice.metadata,
        "message_roles": r.messages.iter().map(|m| m.role).collect::<Vec<_>>(),
        "echo_output": r.echo.output,
        "echo_status": r.echo.status,
        "idle_moves": r.idle_moves.len(),
        "running_job": r.running,
        "moved": r.moved.iter().map(|j| j.id.clone()).collect::<Vec<_>>(),
        "sleep_status": r.sleep_result.status,
        "sleep_job": r.sleep_result.job_id,
        "backgrounded_jobs": r.jobs.iter().filter(|j| j.backgrounded).map(|j| j.id.clone()).collect::<Vec<_>>(),
        "got_job": { "id": r.got_job.id, "backgrounded": r.got_job.backgrounded, "status": r.got_job.status },
        "output_page": r.output_page,
        "output_part": r.output_part,
        "output_tail": r.output_tail,
        "echo_output_bytes": r.echo_job.output_bytes,
        "cancelled": { "id": r.cancelled.id, "status": r.cancelled.status },
        "interrupted": r.interrupted,
        "agent_turn": r.agent_turn.iter().map(|m| json!({ "role": m.role, "text": m.text })).collect::<Vec<_>>(),
        "plain_agent": r.plain_after.agent,
        "turn": r.turn.iter().map(|m| json!({ "role": m.role, "text": m.text })).collect::<Vec<_>>(),
        "listed": r.listed,
        "after_remove": r.after_remove,
    })
}

/// Waits for a plugin thread without blocking the host's worker.
async fn join_thread(ctx: &Context, receiver: mpsc::Receiver<Result<Value>>) -> Result<Value> {
    loop {
        match receiver.try_recv() {
            Ok(result) => return result,
            Err(mpsc::TryRecvError::Empty) => ctx.sleep(Duration::from_millis(5)).await,
            Err(mpsc::TryRecvError::Disconnected) => {
                return Err(Error::plugin("the tour thread panicked"))
            }
        }
    }
}

impl Plugin for Domain {
    fn manifest() -> Manifest {
        Manifest::new("domain", env!("CARGO_PKG_VERSION"))
            .description("walks the session domain through every face")
            .capabilities([
                capability::SESSION_READ,
                capability::SESSION_WRITE,
                capability::TOOL_CALL,
                capability::SESSION_BACKGROUND,
                capability::TOOL_ADD,
                capability::AGENTS,
            ])
    }

    fn init(ctx: Context) -> Result<Self> {
        let host = ctx.clone();
        ctx.tools().add(
            ToolSpec::new(
                "tour",
                "walks the session domain; input {\"face\": \"async\"|\"thread\"|\"inline\"}",
            ),
            move |call: ToolCall| {
                let ctx = host.clone();
                async move {
                    let face = call.input["face"].as_str().unwrap_or("async").to_string();
                    let report = match face.as_str() {
                        "async" => tour_async(ctx).await?,
                        "thread" => {
                            let (sender, receiver) = mpsc::channel();
                            let worker = ctx.clone();
                            thread::spawn(move || {
                                let _ = sender.send(tour_blocking(worker, "thread"));
                            });
                            join_thread(&ctx, receiver).await?
                        }
                        "inline" => tour_blocking(ctx, "inline")?,
                        other => {
                            return Err(Error::invalid_input(format!("unknown face {other:?}")))
                        }
                    };
                    Ok(ToolResult::completed(&call, report.to_string()))
                }
            },
        )?;

        let host = ctx.clone();
        ctx.agents()
            .register("domain-echo", move |turn: AgentTurn| {
                let ctx = host.clone();
                async move {
                    // The blocking face inside an async hook, then the async face.
                    let session = ctx.session().get_blocking(&turn.session_id)?;
                    let history = ctx.session().messages(&turn.session_id).await?;
                    let last = turn
                        .messages
                        .iter()
                        .rev()
                        .find(|m| m.role == Role::User)
                        .map(|m| m.text.clone())
                        .unwrap_or_default();
                    Ok(format!(
                        "echo: {last} ({} messages in {})",
                        history.len(),
                        session.title
                    ))
                }
            })?;
        Ok(Domain)
    }
}

export_plugin!(Domain);
