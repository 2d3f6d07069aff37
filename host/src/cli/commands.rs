//! The client commands: one API call (or two), then text for a person or,
//! with `--json`, the API's JSON for a script. Errors go to stderr with
//! exit status 1; `tool` exits with the job's own exit code.

use std::{io::Write, path::Path, process::ExitCode};

use offstage_plugin_api::types::{Job, Message, Session, ToolResult, ToolStatus};
use serde_json::{json, Value};
use ureq::http::Method;

use super::{
    api_word,
    client::{Client, ClientError},
    BackgroundArgs, ClientArgs, SessionCommand, ToolArgs,
};

fn client(args: &ClientArgs) -> Result<Client, ClientError> {
    Client::new(&args.server, args.token())
}

/// Runs `body`, printing its error to stderr.
fn report(body: impl FnOnce() -> Result<ExitCode, ClientError>) -> ExitCode {
    match body() {
        Ok(code) => code,
        Err(error) => {
            eprintln!("offstage: {error}");
            ExitCode::FAILURE
        }
    }
}

fn print_json(value: &impl serde::Serialize) {
    let text = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".into());
    println!("{text}");
}

/// A path segment with everything but unreserved characters escaped.
fn segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~".contains(&byte) {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn session_row(session: &Session) -> String {
    format!(
        "{}  {:<4}  {:<8}  {}",
        session.id,
        api_word(session.status),
        session.agent,
        session.title
    )
}

fn job_row(job: &Job) -> String {
    format!(
        "{}  {:<9}  {:<2}  {:<8}  {:>4}  {}",
        job.id,
        api_word(job.status),
        if job.backgrounded { "bg" } else { "fg" },
        job.kind,
        job.exit_code
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into()),
        job.title
    )
}

pub(super) fn session(args: &ClientArgs, command: SessionCommand) -> ExitCode {
    report(|| {
        let client = client(args)?;
        match command {
            SessionCommand::List => {
                let sessions: Vec<Session> = client.get("/api/session")?;
                if args.json {
                    print_json(&sessions);
                } else if sessions.is_empty() {
                    println!("no sessions");
                } else {
                    for session in &sessions {
                        println!("{}", session_row(session));
                    }
                }
            }
            SessionCommand::Create {
                title,
                agent,
                parent,
            } => {
                let body = json!({ "title": title, "agent": agent, "parent_id": parent });
                let session: Session = client.call(Method::POST, "/api/session", Some(&body))?;
                if args.json {
                    print_json(&session);
                } else {
                    println!("{}", session_row(&session));
                }
            }
            SessionCommand::Show { id } => {
                let session: Session = client.get(&format!("/api/session/{}", segment(&id)))?;
                let messages: Vec<Message> =
                    client.get(&format!("/api/session/{}/message", segment(&id)))?;
                if args.json {
                    print_json(&json!({ "session": session, "messages": messages }));
                } else {
                    println!("{}", session_row(&session));
                    if let Some(parent) = &session.parent_id {
                        println!("parent: {parent}");
                    }
                    println!(
                        "created {}, updated {}",
                        session.created_at, session.updated_at
                    );
                    for message in &messages {
                        let role = api_word(message.role);
                        println!("\n[{role}] {}", message.created_at);
                        println!("{}", message.text.trim_end());
                    }
                }
            }
            SessionCommand::Rm { id } => {
                let _: Value = client.call(
                    Method::DELETE,
                    &format!("/api/session/{}", segment(&id)),
                    None::<&()>,
                )?;
                if args.json {
                    print_json(&json!({ "removed": id }));
                } else {
                    println!("removed {id}");
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// The tool's input: `--input` JSON, with a shell command after `--`
/// merged in as `command`.
fn tool_input(args: &ToolArgs) -> Result<Value, ClientError> {
    let mut input = match &args.input {
        Some(text) => serde_json::from_str(text)
            .map_err(|e| ClientError::Protocol(format!("--input is not valid JSON: {e}")))?,
        None => json!({}),
    };
    if !args.args.is_empty() {
        let Some(object) = input.as_object_mut() else {
            return Err(ClientError::Protocol(
                "--input must be a JSON object to add a command to".into(),
            ));
        };
        object.insert("command".into(), Value::String(args.args.join(" ")));
    }
    Ok(input)
}

/// `offstage tool list`: each tool with its owner, what it does and the
/// fields its input takes (required ones marked `*`).
/// `offstage agent list`: every agent (`GET /api/agent`).
pub(super) fn agent_list(args: &ClientArgs) -> ExitCode {
    report(|| {
        let agents: Vec<Value> = client(args)?.get("/api/agent")?;
        if args.json {
            print_json(&agents);
            return Ok(ExitCode::SUCCESS);
        }
        for agent in &agents {
            let text = |key: &str| agent[key].as_str().unwrap_or("-").to_string();
            println!(
                "{:<16} {:<8} {:<12} {:<8} {}",
                text("name"),
                text("kind"),
                text("owner"),
                text("provider"),
                text("model")
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

fn tool_list(args: &ClientArgs) -> ExitCode {
    report(|| {
        let tools: Vec<Value> = client(args)?.get("/api/tool")?;
        if args.json {
            print_json(&tools);
            return Ok(ExitCode::SUCCESS);
        }
        for tool in &tools {
            let text = |key: &str| tool[key].as_str().unwrap_or_default().to_string();
            println!(
                "{:<16} {:<16} {}",
                text("name"),
                text("owner"),
                text("description")
            );
            let schema = &tool["input_schema"];
            let required: Vec<&str> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if let Some(properties) = schema["properties"].as_object() {
                // Required fields first, in the schema's order.
                let mut named: Vec<(&String, &Value)> = properties.iter().collect();
                named.sort_by_key(|(name, _)| !required.contains(&name.as_str()));
                let fields: Vec<String> = named
                    .into_iter()
                    .map(|(name, property)| {
                        let kind = property["type"].as_str().unwrap_or("any");
                        let mark = if required.contains(&name.as_str()) {
                            "*"
                        } else {
                            ""
                        };
                        format!("{name}{mark}: {kind}")
                    })
                    .collect();
                println!("{:<16} input: {}", "", fields.join(", "));
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(super) fn tool(args: ToolArgs) -> ExitCode {
    let Some(tool) = args.tool.clone() else {
        if args.session == "list" {
            return tool_list(&args.client);
        }
        eprintln!(
            "offstage: name the tool to run: offstage tool SESSION TOOL (or `offstage tool list`)"
        );
        return ExitCode::from(2);
    };
    report(|| {
        let client = client(&args.client)?;
        let input = tool_input(&args)?;
        let body = json!({ "tool": tool, "input": input, "call_id": args.call_id });
        let path = format!("/api/session/{}/tool", segment(&args.session));
        let result: ToolResult = client.call(Method::POST, &path, Some(&body))?;
        if args.client.json {
            print_json(&result);
        } else {
            let mut stdout = std::io::stdout().lock();
            let _ = stdout.write_all(result.output.as_bytes());
            if !result.output.is_empty() && !result.output.ends_with('\n') {
                let _ = writeln!(stdout);
            }
            let _ = stdout.flush();
            let path = result.output_path.as_deref().unwrap_or("-");
            match result.status {
                ToolStatus::Backgrounded => eprintln!(
                    "[job {} moved to the background; a notice follows when it ends; full output: {path}]",
                    result.job_id
                ),
                ToolStatus::Cancelled => eprintln!("[job {} cancelled]", result.job_id),
                ToolStatus::Error => eprintln!(
                    "[job {} failed{}]",
                    result.job_id,
                    result.exit_code.map(|c| format!(" with exit code {c}")).unwrap_or_default()
                ),
                ToolStatus::Completed => {}
            }
        }
        Ok(match result.status {
            ToolStatus::Backgrounded => ExitCode::SUCCESS,
            ToolStatus::Completed | ToolStatus::Error => match result.exit_code {
                Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
                None if result.status == ToolStatus::Completed => ExitCode::SUCCESS,
                None => ExitCode::FAILURE,
            },
            ToolStatus::Cancelled => ExitCode::from(130),
        })
    })
}

pub(super) fn background(args: BackgroundArgs) -> ExitCode {
    report(|| {
        let client = client(&args.client)?;
        let body = json!({ "type": args.kind, "job_id": args.job_id });
        let path = format!("/api/session/{}/background", segment(&args.session));
        let answer: Value = client.call(Method::POST, &path, Some(&body))?;
        if args.client.json {
            print_json(&answer);
            return Ok(ExitCode::SUCCESS);
        }
        let jobs: Vec<Job> = serde_json::from_value(answer["backgrounded"].clone())
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if jobs.is_empty() {
            println!(
                "nothing to move: no blocking job matches in {}",
                args.session
            );
        } else {
            println!("moved to the background:");
            for job in &jobs {
                println!("{}", job_row(job));
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(super) fn jobs(args: &ClientArgs, session: Option<&str>) -> ExitCode {
    report(|| {
        let client = client(args)?;
        let path = match session {
            Some(id) => format!("/api/job?session_id={}", segment(id)),
            None => "/api/job".to_string(),
        };
        let jobs: Vec<Job> = client.get(&path)?;
        if args.json {
            print_json(&jobs);
        } else if jobs.is_empty() {
            println!("no jobs");
        } else {
            for job in &jobs {
                println!("{}", job_row(job));
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(super) fn events(args: &ClientArgs) -> ExitCode {
    report(|| {
        let client = client(args)?;
        for event in client.events(None)? {
            let event = event?;
            let line = if args.json {
                event.to_string()
            } else {
                format!(
                    "{:<20} {}",
                    event["type"].as_str().unwrap_or("?"),
                    event.get("properties").unwrap_or(&Value::Null)
                )
            };
            let mut stdout = std::io::stdout().lock();
            // A closed pipe (`offstage events | head`) ends the command.
            if writeln!(stdout, "{line}")
                .and_then(|()| stdout.flush())
                .is_err()
            {
                return Ok(ExitCode::SUCCESS);
            }
        }
        eprintln!("offstage: the host closed the event stream");
        Ok(ExitCode::SUCCESS)
    })
}

/// `offstage plugin reload NAME`: one `POST /api/plugin/NAME/reload`.
pub(super) fn plugin_reload(args: &ClientArgs, name: &str) -> ExitCode {
    report(|| {
        let client = client(args)?;
        let path = format!("/api/plugin/{}/reload", segment(name));
        let info: Value = client.call(Method::POST, &path, None::<&()>)?;
        if args.json {
            print_json(&info);
        } else {
            println!(
                "reloaded {}: generation {} (version {}, {})",
                info["name"].as_str().unwrap_or(name),
                info["generation"],
                info["version"].as_str().unwrap_or("?"),
                info["path"].as_str().unwrap_or("?"),
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub(super) fn plugin_check(
    file: &Path,
    config: Option<&Path>,
    allow_insecure: bool,
    json: bool,
    (isolation, filesystem): (Option<&str>, Option<&str>),
) -> ExitCode {
    // The answer is the report below; the loader's own log of the same
    // failure would only repeat it.
    crate::logging::init("error");
    let config_error = |error: &str| {
        if json {
            print_json(&json!({ "stage": "config", "error": error }));
        } else {
            eprintln!("{error}");
        }
        ExitCode::FAILURE
    };
    let mut options = crate::plugin::CheckOptions {
        allow_insecure_permissions: allow_insecure,
        ..Default::default()
    };
    if let Some(config) = config {
        match crate::config::FileConfig::load(config) {
            Ok(loaded) => {
                options.allow_insecure_permissions |=
                    loaded.allow_insecure_plugins.unwrap_or(false);
                options.settings = super::serve::plugin_settings(&loaded.plugin);
                options.isolation = loaded.isolation();
            }
            Err(error) => return config_error(&error.to_string()),
        }
    }
    // A flag is about this one file, so it wins over every table of the
    // config (clap admits only the values `parse` accepts).
    let isolation_keys = &mut options.isolation;
    if let Some(mode) = isolation.and_then(|mode| mode.parse().ok()) {
        isolation_keys.defaults.mode = Some(mode);
        isolation_keys
            .plugins
            .values_mut()
            .for_each(|own| own.mode = None);
    }
    if let Some(filesystem) = filesystem.and_then(|filesystem| filesystem.parse().ok()) {
        isolation_keys.defaults.filesystem = Some(filesystem);
        isolation_keys
            .plugins
            .values_mut()
            .for_each(|own| own.filesystem = None);
    }
    // The config's own tables passed this check when it loaded: a
    // failure here comes of the flags.
    if let Err(error) = isolation_keys.check() {
        return config_error(&if config.is_none() {
            "--filesystem read-only needs --isolation process: \
             the restriction applies to the plugin's own process"
                .to_string()
        } else {
            format!("with the --isolation and --filesystem given, {error}")
        });
    }
    let report = crate::plugin::check_file_with(file, options);
    let stage = match report.failed_stage() {
        None => None,
        Some(crate::plugin::LoadStage::File) => Some("file"),
        Some(crate::plugin::LoadStage::Permissions) => Some("permissions"),
        Some(crate::plugin::LoadStage::Start) => Some("start"),
    };
    if json {
        match (&report.error, &report.plugin) {
            (None, Some(info)) => print_json(info),
            (error, plugin) => print_json(&json!({
                "stage": stage,
                "error": error.as_ref().map(|e| e.to_string()),
                "plugin": plugin,
            })),
        }
    } else {
        // The manifest when it was read: a start problem still names the
        // plugin; a file problem shows only the error.
        if let Some(info) = report
            .plugin
            .as_ref()
            .filter(|_| !matches!(stage, Some("file" | "permissions")))
        {
            println!("name:         {}", info.name);
            println!("version:      {}", info.version);
            println!("api version:  {}", info.api_version);
            let capabilities = if info.capabilities.is_empty() {
                "(none)".to_string()
            } else {
                info.capabilities.join(", ")
            };
            println!("capabilities: {capabilities}");
            println!("description:  {}", info.description);
            match info.pid {
                Some(pid) => println!("isolation:    process (pid {pid})"),
                None => println!("isolation:    none"),
            }
            if info.filesystem == crate::plugin::Filesystem::ReadOnly {
                println!("filesystem:   read-only (writes only in its data dir)");
            }
            println!("file:         {}", file.display());
            println!("file and ABI: ok");
            println!(
                "start:        {}",
                if stage.is_none() { "ok" } else { "failed" }
            );
        }
        match (&report.error, stage) {
            (Some(error), Some("file")) => {
                eprintln!("file or ABI problem (needs another build): {error}")
            }
            (Some(error), Some("permissions")) => {
                eprintln!("file permissions problem (not the build): {error}")
            }
            (Some(error), _) => {
                eprintln!("start-up problem (config, options or init): {error}")
            }
            (None, _) => {}
        }
    }
    if report.error.is_some() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
