//! The `offstage` command line (docs/contract.md, "Binary and commands").
//!
//! `serve` runs the host (`serve.rs`), and `dev` the same host with the
//! plugin watcher of [`crate::plugin::watch`]; `demo` runs [`crate::demo`];
//! `plugin check` loads one plugin file in isolation; the other commands
//! are thin clients of a running host's HTTP API (`client.rs` speaks HTTP, `commands.rs` prints), so they show
//! exactly what the API says and never touch the host's state themselves.

mod agent;
pub(crate) mod attach;
pub(crate) mod client;
mod commands;
#[cfg(feature = "mcp")]
mod mcp;
mod scaffold;
mod serve;
pub(crate) mod token;

use std::{path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

/// Session host for agent tools with native, hot-reloadable plugins.
#[derive(Debug, Parser)]
#[command(name = "offstage", version, about, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the host: HTTP API, plugins from the plugin dirs.
    Serve(ServeArgs),
    /// `serve`, plus hot reload: watches the plugin dirs (and plugin crate
    /// sources, rebuilding them with cargo) and reloads what changes.
    Dev {
        #[command(flatten)]
        serve: ServeArgs,
        /// A plugin crate to rebuild on change and install into the first
        /// plugin dir; repeat for more.
        #[arg(long = "watch-src", value_name = "DIR")]
        watch_src: Vec<PathBuf>,
        /// Load plugins in the host's process unless the config says
        /// otherwise. By default `dev` runs each plugin in a child process
        /// (`isolation = "process"`), so that a crash of the plugin being
        /// written is reported and restarted instead of ending the host.
        #[arg(long)]
        in_process: bool,
    },
    /// Run the background scenario end to end in a temporary data dir with
    /// the example plugins, printing a transcript.
    Demo,
    /// Runs one isolated plugin for a host that started this process
    /// (internal: the host passes the channel as fd 3).
    #[command(hide = true, name = "plugin-host")]
    PluginHost {
        /// The plugin file.
        file: PathBuf,
        /// The host's data dir.
        #[arg(long)]
        data_dir: PathBuf,
        /// Load files others can write.
        #[arg(long)]
        allow_insecure: bool,
        /// Restrict the process with Landlock before opening the file
        /// (`filesystem = "read-only"`).
        #[arg(long)]
        read_only: bool,
        /// With `--read-only`: the one dir it may write in.
        #[arg(long, requires = "read_only")]
        writable: Option<PathBuf>,
        /// With `--read-only`: sockets may be opened (`network = "allow"`).
        #[arg(long, requires = "read_only")]
        network: bool,
        /// The host's log level (0 off ... 5 trace), told to the plugin.
        #[arg(long)]
        log_level: Option<u8>,
    },
    /// Runs one command of a job in the job's sandbox (internal: the host
    /// starts this in place of a command when `[jobs] sandbox` is set).
    #[command(hide = true, name = "job-sandbox")]
    JobSandbox {
        /// A dir the command may write beneath; repeat for more.
        #[arg(long = "write", value_name = "DIR")]
        write: Vec<PathBuf>,
        /// Sockets may be opened.
        #[arg(long)]
        network: bool,
        /// Changes of file mode, owner, times and attributes are allowed.
        #[arg(long)]
        metadata: bool,
        /// The program and its arguments.
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Work with plugin files.
    Plugin {
        #[command(subcommand)]
        command: PluginCommand,
    },
    /// Sessions of a running host.
    Session {
        #[command(flatten)]
        client: ClientArgs,
        #[command(subcommand)]
        command: SessionCommand,
    },
    /// Run a tool in a session and wait until it ends or is backgrounded;
    /// `offstage tool list` lists the host's tools and their inputs.
    ///
    /// For `shell`, the words after `--` are joined with spaces into the
    /// command line, as ssh does: `offstage tool S shell -- 'ls | wc -l'`.
    /// Exits with the job's exit code. Stopping this command (Ctrl-C) does
    /// not stop the job: use `offstage background` to release it with the
    /// output so far, or cancel it over the API.
    Tool(ToolArgs),
    /// Model agents: list the host's agents, or check one's server.
    Agent {
        #[command(subcommand)]
        command: AgentCommand,
    },
    /// Move a session's blocking jobs to the background.
    Background(BackgroundArgs),
    /// List jobs, of one session or all.
    Jobs {
        #[command(flatten)]
        client: ClientArgs,
        /// Only this session's jobs.
        session: Option<String>,
    },
    /// Print the host's events as they happen, until interrupted.
    Events {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Full-screen terminal client of a running host: a session's messages,
    /// running calls with live output, plugins. Enter prompts the agent,
    /// `!CMD` runs a shell call, Ctrl+B moves what blocks the session to
    /// the background, Ctrl+C interrupts, Ctrl+T lists jobs, Ctrl+Q quits.
    Attach {
        #[command(flatten)]
        client: ClientArgs,
        /// The session to attach to; a new one is made when absent.
        session: Option<String>,
    },
    /// The MCP server on stdio, for an MCP client's config: bridges to the
    /// host at `--server` (starting one with the data dir when none
    /// answers), in a new session titled from the client or `--session`'s.
    #[cfg(feature = "mcp")]
    Mcp(mcp::McpArgs),
}

/// Flags of `offstage serve`.
#[derive(Debug, Clone, Args)]
pub(crate) struct ServeArgs {
    /// TOML config file; flags override its values.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:4545]. Port 0 picks a free port.
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,
    /// Where job output and plugin copies live [default: $XDG_DATA_HOME/offstage].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// A directory of plugin libraries to load; repeat for more.
    #[arg(long = "plugin-dir", value_name = "DIR")]
    pub plugin_dirs: Vec<PathBuf>,
    /// Bearer token every route but /api/health then needs. Prefer the
    /// environment variable: other users can see command lines.
    #[arg(
        long,
        env = "OFFSTAGE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// Serve without a token: any local user can then drive the host.
    /// Without this flag and without a token, the host makes one in
    /// DATA_DIR/token (mode 0600) and uses it; clients read that file.
    #[arg(long)]
    pub no_token: bool,
    /// Load plugin files that other users can write (development only).
    #[arg(long)]
    pub allow_insecure_plugins: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum PluginCommand {
    /// Load one plugin file in isolation and print its manifest, or why it
    /// cannot be loaded (exit status 1): a problem of the file (format,
    /// ABI, manifest) or of its start (grants, options, `init`).
    Check {
        file: PathBuf,
        /// Take the plugin's `[plugin.NAME]` table (grants, options,
        /// isolation keys), `[plugins]` and `allow_insecure_plugins` from
        /// this host config file.
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Accept a file that other users can write (`--allow-insecure`
        /// is the same flag).
        #[arg(long = "allow-insecure-plugins", alias = "allow-insecure")]
        allow_insecure: bool,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// Load it in this process (`none`) or in a child process of its
        /// own (`process`), as the host config's `isolation` would; wins
        /// over `--config`'s. Default: the config's, else `none`.
        #[arg(long, value_parser = ["none", "process"])]
        isolation: Option<String>,
        /// With `--isolation process`: `read-only` restricts its process
        /// with Landlock as the config's `filesystem` would; wins over
        /// `--config`'s. Default: the config's, else `unrestricted`.
        #[arg(long, value_parser = ["unrestricted", "read-only"])]
        filesystem: Option<String>,
    },
    /// Make a plugin crate from the template: a cdylib with a tool, a
    /// wrapper, a subscription, a README and a test that runs it in a real
    /// host (offstage-plugin-test). `cargo test` in it passes as it comes.
    New {
        /// The plugin's name, also the package's (`word-count`).
        name: String,
        /// Where to make it [default: ./NAME]; must be empty or missing.
        #[arg(long, value_name = "DIR")]
        path: Option<PathBuf>,
        /// Depend on a checkout of Offstage by path instead of on crates.io
        /// versions: its `plugin-api` dir (and `plugin-test` beside it).
        #[arg(long, value_name = "DIR")]
        path_to_api: Option<PathBuf>,
    },
    /// Ask a running host to load plugin NAME's file again as a new
    /// generation (`POST /api/plugin/NAME/reload`); a build that cannot be
    /// loaded leaves the running generation serving (exit status 1).
    Reload {
        #[command(flatten)]
        client: ClientArgs,
        /// The plugin's name, as `GET /api/plugin` lists it.
        name: String,
    },
}

/// How a client command reaches the host.
#[derive(Debug, Clone, Args)]
pub(crate) struct ClientArgs {
    /// The host's URL.
    #[arg(
        long,
        global = true,
        env = "OFFSTAGE_SERVER",
        default_value = "http://127.0.0.1:4545",
        value_name = "URL"
    )]
    pub server: String,
    /// Bearer token for the host [default: the one in DATA_DIR/token].
    #[arg(
        long,
        global = true,
        env = "OFFSTAGE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    /// The host's data dir, whose `token` file holds the token when none is
    /// given [default: $XDG_DATA_HOME/offstage].
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Print the API's JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
}

impl ClientArgs {
    /// The token to send: `--token` (or `OFFSTAGE_TOKEN`), else the one
    /// in the data dir's token file, else none (a host started with
    /// `--no-token`, or one that answers 401 saying where its token is).
    pub(crate) fn token(&self) -> Option<String> {
        if let Some(token) = &self.token {
            return Some(token.clone());
        }
        let dir = match &self.data_dir {
            Some(dir) => dir.clone(),
            None => crate::config::default_data_dir().ok()?,
        };
        token::read(&token::path(&dir)).ok()
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum AgentCommand {
    /// List the host's agents: name, kind, owner, provider, model.
    List {
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Make one small request to an `[agent.NAME]`'s server, straight from
    /// here, and say whether it is reachable, takes the key, knows the
    /// model and supports tool calls.
    Check {
        /// The agent's name, as in `[agent.NAME]`.
        name: String,
        /// The config file holding the table.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum SessionCommand {
    /// List sessions, oldest first.
    List,
    /// Create a session.
    Create {
        #[arg(long)]
        title: Option<String>,
        /// The agent that runs its turns [default: the host's `[sessions] default_agent`, else script].
        #[arg(long)]
        agent: Option<String>,
        /// Make it a child of this session.
        #[arg(long, value_name = "SESSION")]
        parent: Option<String>,
    },
    /// Show a session and its messages.
    Show { id: String },
    /// Delete a session; its jobs are cancelled.
    Rm { id: String },
}

/// `offstage tool SESSION TOOL [-- ARGS...]`, or `offstage tool list`.
#[derive(Debug, Args)]
pub(crate) struct ToolArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// The session, or `list` to list the host's tools.
    pub session: String,
    /// `shell`, `subagent`, or a plugin's tool.
    pub tool: Option<String>,
    /// The tool's input as a JSON object; for `shell`, the command after
    /// `--` is merged into it as `command`.
    #[arg(long, value_name = "JSON")]
    pub input: Option<String>,
    /// Id for the call and its job.
    #[arg(long, value_name = "ID")]
    pub call_id: Option<String>,
    /// The command line (shell) after `--`.
    #[arg(last = true, value_name = "CMD")]
    pub args: Vec<String>,
}

/// `offstage background SESSION [--type T] [--job ID]`.
#[derive(Debug, Args)]
pub(crate) struct BackgroundArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    pub session: String,
    /// Only jobs of this type (shell, subagent, ...).
    #[arg(long = "type", value_name = "T")]
    pub kind: Option<String>,
    /// Only this job.
    #[arg(long = "job", value_name = "ID")]
    pub job_id: Option<String>,
}

/// Runs the command line and returns the process's exit status.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args, None),
        Command::Dev {
            serve,
            watch_src,
            in_process,
        } => serve::run(
            serve,
            Some(serve::Dev {
                watch_src,
                in_process,
            }),
        ),
        Command::Demo => crate::demo::run(),
        Command::PluginHost {
            file,
            data_dir,
            allow_insecure,
            read_only,
            writable,
            network,
            log_level,
        } => crate::plugin::run_child(crate::plugin::ChildArgs {
            file,
            data_dir,
            allow_insecure,
            read_only,
            writable,
            network,
            log_level,
        }),
        Command::JobSandbox {
            write,
            network,
            metadata,
            command,
        } => crate::process::sandbox::launch::run(crate::process::sandbox::launch::LaunchArgs {
            write,
            network,
            metadata,
            command,
        }),
        Command::Plugin {
            command:
                PluginCommand::Check {
                    file,
                    config,
                    allow_insecure,
                    json,
                    isolation,
                    filesystem,
                },
        } => commands::plugin_check(
            &file,
            config.as_deref(),
            allow_insecure,
            json,
            (isolation.as_deref(), filesystem.as_deref()),
        ),
        Command::Plugin {
            command: PluginCommand::Reload { client, name },
        } => commands::plugin_reload(&client, &name),
        Command::Plugin {
            command:
                PluginCommand::New {
                    name,
                    path,
                    path_to_api,
                },
        } => plugin_new(scaffold::NewPlugin {
            name,
            path,
            path_to_api,
        }),
        Command::Session { client, command } => commands::session(&client, command),
        Command::Tool(args) => commands::tool(args),
        Command::Agent { command } => match command {
            AgentCommand::List { client } => commands::agent_list(&client),
            AgentCommand::Check { name, config } => agent::check(&name, &config),
        },
        Command::Background(args) => commands::background(args),
        Command::Jobs { client, session } => commands::jobs(&client, session.as_deref()),
        Command::Events { client } => commands::events(&client),
        Command::Attach { client, session } => attach::run(&client, session),
        #[cfg(feature = "mcp")]
        Command::Mcp(args) => mcp::run(args),
    }
}

/// `offstage plugin new`: makes the crate, says what to run next.
fn plugin_new(request: scaffold::NewPlugin) -> ExitCode {
    match scaffold::new_plugin(&request) {
        Ok(dir) => {
            println!(
                "made plugin {} in {}
next: cd {} && cargo test",
                request.name,
                dir.display(),
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("offstage plugin new: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A status word as the API spells it: the value's serde name, so that the
/// tables of the client commands and `attach` never drift from the JSON.
pub(crate) fn api_word(value: impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(word)) => word,
        _ => "?".into(),
    }
}
