//! The example plugins (`example_plugins`) isolated: event subscriptions
//! and the plugin's data dir (audit-log), a tool wrapper that moves its own
//! call to the background (auto-background), and an agent that calls tools
//! (check-agent).

use offstage::Isolation;

crate::example_plugins::audit_log::audit_log_suite!(Isolation::Process);

mod auto_background {
    use offstage::Isolation;

    crate::example_plugins::auto_background::auto_background_suite!(Isolation::Process);
}

mod check_agent {
    use offstage::Isolation;

    crate::example_plugins::check_agent::check_agent_suite!(Isolation::Process);
}
