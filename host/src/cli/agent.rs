//! `offstage agent check NAME`, which reads the config's `[agent.NAME]` itself and makes
//! one small request straight to the model's server — no host needed —
//! reporting one line each: reachable, key accepted, model known, tool
//! calls supported.

use std::{path::Path, process::ExitCode};

use serde_json::json;

use crate::{
    config::FileConfig,
    model::{self, ChatMessage, ChatRequest, ChatRole, ModelError, ToolDef},
};

/// `offstage agent check NAME --config FILE`.
pub(super) fn check(name: &str, config: &Path) -> ExitCode {
    let file = match FileConfig::load(config) {
        Ok(file) => file,
        Err(error) => {
            eprintln!("offstage: {error}");
            return ExitCode::from(2);
        }
    };
    let Some(table) = file.agent.get(name) else {
        eprintln!("offstage: {} has no [agent.{name}] table", config.display());
        return ExitCode::from(2);
    };
    let mut settings = match table.resolve(name, config.parent(), |var| std::env::var(var).ok()) {
        Ok(settings) => settings.model,
        Err(error) => {
            eprintln!("offstage: {error}");
            return ExitCode::from(2);
        }
    };
    // One request, answered as it comes: a retry would only hide what
    // the check is for.
    settings.max_retries = 0;
    let provider = match model::provider(&settings) {
        Ok(provider) => provider,
        Err(error) => {
            eprintln!("offstage: [agent.{name}]: {error}");
            return ExitCode::from(2);
        }
    };
    let request = ChatRequest {
        messages: vec![ChatMessage::new(
            ChatRole::User,
            "This is a connection check. Call the `ping` tool with {\"text\": \"pong\"} and say nothing else.",
        )],
        tools: vec![ToolDef {
            name: "ping".into(),
            description: "Answers pong. Call it when asked to.".into(),
            parameters: json!({
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"],
            }),
        }],
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("offstage: cannot start a runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let answer = runtime.block_on(provider.stream(&request, &|_| {}));
    println!("agent {name}: {} at {}", settings.model, settings.base_url);
    let lines = report(&answer);
    for (what, verdict) in &lines {
        println!("{what:<24} {verdict}");
    }
    if lines.iter().all(|(_, verdict)| verdict.starts_with("yes")) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The four lines of the check.
fn report(answer: &Result<model::Completion, ModelError>) -> Vec<(&'static str, String)> {
    const NOT_CHECKED: &str = "not checked";
    let lines = |reachable: String, key: String, model: String, tools: String| {
        vec![
            ("reachable", reachable),
            ("key accepted", key),
            ("model known", model),
            ("tool calls supported", tools),
        ]
    };
    let yes = || "yes".to_string();
    let no = |why: String| format!("no: {why}");
    match answer {
        Ok(done) => {
            let tools = match done.tool_calls.iter().find(|c| c.name == "ping") {
                Some(call) => format!("yes (called ping with {})", call.arguments),
                None => no(format!(
                    "the model answered without calling the tool: {:?}",
                    done.text.chars().take(80).collect::<String>()
                )),
            };
            lines(yes(), yes(), yes(), tools)
        }
        Err(error @ ModelError::Unreachable { .. }) => lines(
            no(error.to_string()),
            NOT_CHECKED.into(),
            NOT_CHECKED.into(),
            NOT_CHECKED.into(),
        ),
        Err(error @ ModelError::Unauthorized { .. }) => lines(
            yes(),
            no(error.to_string()),
            NOT_CHECKED.into(),
            NOT_CHECKED.into(),
        ),
        Err(ModelError::Status { status, detail, .. })
            if *status == 404 || detail.to_ascii_lowercase().contains("model") =>
        {
            lines(
                yes(),
                yes(),
                no(format!("{status}: {detail}")),
                NOT_CHECKED.into(),
            )
        }
        Err(ModelError::Status { status, detail, .. }) if *status == 400 => lines(
            yes(),
            yes(),
            yes(),
            no(format!("the request with a tool was refused: {detail}")),
        ),
        Err(error) => lines(
            yes(),
            "unknown".into(),
            "unknown".into(),
            no(error.to_string()),
        ),
    }
}
