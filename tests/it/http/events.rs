//! The event stream of a real `offstage serve` (docs/contract.md,
//! "Events"): every event has an id (on its `id:` line and in its JSON), a
//! client that reconnects with `Last-Event-ID` gets exactly what it missed,
//! `?since=0` replays everything held, and every event a scenario produces
//! matches its type's description in the served OpenAPI document.

use std::{
    collections::BTreeSet,
    io::{Read, Write},
    net::TcpStream,
};

use offstage_tests::{
    server::{EventStream, Server},
    wait::eventually,
};
use serde_json::{json, Value};

fn create_session(server: &Server, title: &str) -> String {
    let session = server.expect(
        "POST",
        "/api/session",
        Some(&json!({ "title": title })),
        201,
    );
    session["id"].as_str().unwrap().to_string()
}

/// Events until one of `kind` for session title `title` is seen.
fn until_created(events: &mut EventStream, title: &str) -> Vec<Value> {
    events.until("session.created", |p| p["title"] == title)
}

fn id_of(event: &Value) -> u64 {
    event["id"]
        .as_u64()
        .unwrap_or_else(|| panic!("no id in {event}"))
}

#[test]
fn a_client_that_reconnects_with_last_event_id_gets_exactly_what_it_missed() {
    let server = Server::start(&[]);
    let mut first = server.events();
    let hello = first.next_event().unwrap();
    assert_eq!(hello["type"], "server.connected");
    assert!(
        hello.get("id").is_none(),
        "the stream's own events have no id"
    );
    create_session(&server, "before");
    let seen = until_created(&mut first, "before");
    let last = id_of(seen.last().unwrap());
    drop(first);

    // Missed while disconnected.
    for n in 0..5 {
        create_session(&server, &format!("missed {n}"));
    }
    let last_text = last.to_string();
    let mut again = server.events_at("/api/event", &[("Last-Event-ID", &last_text)]);
    assert_eq!(again.status, 200);
    assert_eq!(again.next_event().unwrap()["type"], "server.connected");
    let replayed = until_created(&mut again, "missed 4");
    let titles: Vec<&str> = replayed
        .iter()
        .filter(|e| e["type"] == "session.created")
        .map(|e| e["properties"]["title"].as_str().unwrap())
        .collect();
    assert_eq!(
        titles,
        ["missed 0", "missed 1", "missed 2", "missed 3", "missed 4"]
    );
    // In order, consecutive, starting right after the last one seen.
    let ids: Vec<u64> = replayed.iter().map(id_of).collect();
    assert_eq!(ids[0], last + 1, "{replayed:#?}");
    assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
    // And then it goes on live.
    create_session(&server, "live");
    let live = until_created(&mut again, "live");
    assert_eq!(id_of(&live[0]), ids.last().unwrap() + 1);

    // `?since=0`: everything held, from the first event of this run.
    let mut all = server.events_at("/api/event?since=0", &[]);
    all.next_event().unwrap();
    let everything = until_created(&mut all, "live");
    let created: Vec<&str> = everything
        .iter()
        .filter(|e| e["type"] == "session.created")
        .map(|e| e["properties"]["title"].as_str().unwrap())
        .collect();
    assert_eq!(created.first(), Some(&"before"));
    assert_eq!(created.len(), 7);
}

#[test]
fn each_event_frame_has_an_id_line_matching_its_json() {
    let server = Server::start(&[]);
    let mut stream = TcpStream::connect(server.addr).unwrap();
    write!(
        stream,
        "GET /api/event HTTP/1.1\r\nHost: {}\r\nAuthorization: {}\r\nConnection: close\r\n\r\n",
        server.addr,
        server.bearer()
    )
    .unwrap();
    stream
        .set_read_timeout(Some(offstage_tests::server::READ_TIMEOUT))
        .unwrap();
    let mut text = String::new();
    let mut buffer = [0; 4096];
    let mut read_until = |text: &mut String, wanted: &str| {
        while !text.contains(wanted) {
            let n = stream.read(&mut buffer).unwrap();
            assert!(n > 0, "stream ended: {text}");
            text.push_str(&String::from_utf8_lossy(&buffer[..n]));
        }
    };
    // Subscribed from here on.
    read_until(&mut text, "server.connected");
    create_session(&server, "framed");
    read_until(&mut text, "\"framed\"");
    assert!(text.contains("content-type: text/event-stream"), "{text}");
    // Chunked framing aside, the event is `id: N` then `data: {...}`.
    let at = text.find("id: ").expect("an id line");
    let rest = &text[at..];
    let id_line = rest.lines().next().unwrap();
    let data_line = rest.lines().nth(1).unwrap();
    let id: u64 = id_line["id: ".len()..].trim().parse().unwrap();
    let data: Value = serde_json::from_str(data_line.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(data["id"], id);
}

#[test]
fn a_last_event_id_that_is_not_a_number_is_a_bad_request() {
    let server = Server::start(&[]);
    let events = server.events_at("/api/event", &[("Last-Event-ID", "yesterday")]);
    assert_eq!(events.status, 400);
    let events = server.events_at("/api/event?since=-1", &[]);
    assert_eq!(events.status, 400);
    // The host keeps serving.
    server.expect("GET", "/api/health", None, 200);
}

/// The schema of an event type's `properties` in `doc`: its property names
/// and the required ones (`$ref`s and `allOf`s resolved).
fn described_fields(doc: &Value, schema: &Value) -> (BTreeSet<String>, BTreeSet<String>) {
    let schema = match schema["$ref"].as_str() {
        Some(reference) => {
            let name = reference.rsplit('/').next().unwrap();
            &doc["components"]["schemas"][name]
        }
        None => schema,
    };
    let mut fields = BTreeSet::new();
    let mut required = BTreeSet::new();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        let (more, more_required) = described_fields(doc, part);
        fields.extend(more);
        required.extend(more_required);
    }
    if let Some(properties) = schema["properties"].as_object() {
        fields.extend(properties.keys().cloned());
    }
    for name in schema["required"].as_array().into_iter().flatten() {
        required.insert(name.as_str().unwrap().to_string());
    }
    (fields, required)
}

#[test]
fn every_event_of_a_scenario_matches_its_type_in_the_openapi_document() {
    let server = Server::start(&[]);
    let doc = server.expect("GET", "/api/openapi.json", None, 200);
    let union = doc["components"]["schemas"]["EventPayload"]["oneOf"]
        .as_array()
        .expect("events are a union");
    let member = |kind: &str| {
        union
            .iter()
            .find(|m| m["properties"]["type"]["enum"][0] == kind)
            .unwrap_or_else(|| panic!("{kind} is not described"))
            .clone()
    };

    let mut events = server.events();
    let session = create_session(&server, "scenario");
    server.expect(
        "PATCH",
        &format!("/api/session/{session}"),
        Some(&json!({ "title": "renamed" })),
        200,
    );
    let ran = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "echo hi" } })),
        200,
    );
    assert_eq!(ran["status"], "completed");
    let moved = server.expect(
        "POST",
        &format!("/api/session/{session}/tool"),
        Some(&json!({ "tool": "shell", "input": { "command": "echo later", "background": true } })),
        200,
    );
    assert_eq!(moved["status"], "backgrounded");
    eventually("the notice", || {
        let messages = server.expect("GET", &format!("/api/session/{session}/message"), None, 200);
        messages
            .as_array()?
            .iter()
            .any(|m| m["role"] == "notice")
            .then_some(())
    });
    server.expect("DELETE", &format!("/api/session/{session}"), None, 204);
    let seen = events.until("session.deleted", |p| p["id"] == session);

    let mut kinds = BTreeSet::new();
    for event in &seen {
        let kind = event["type"].as_str().unwrap();
        kinds.insert(kind.to_string());
        let described = member(kind);
        let (fields, required) = described_fields(&doc, &described["properties"]["properties"]);
        let actual: BTreeSet<String> = event["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("{kind}: properties not an object"))
            .keys()
            .cloned()
            .collect();
        assert!(
            actual.is_subset(&fields),
            "{kind}: {actual:?} has fields the document does not describe ({fields:?})"
        );
        assert!(
            required.is_subset(&actual),
            "{kind}: the document requires {required:?}, the event has {actual:?}"
        );
        if kind != "server.connected" {
            assert!(event["id"].is_u64(), "{event}");
        }
        if kind == "message.added" && event["properties"]["role"] == "notice" {
            let (fields, _) = described_fields(
                &doc,
                &json!({ "$ref": "#/components/schemas/NoticeMetadata" }),
            );
            let metadata: BTreeSet<String> = event["properties"]["metadata"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            assert!(metadata.is_subset(&fields), "{metadata:?} vs {fields:?}");
        }
    }
    for kind in [
        "server.connected",
        "session.created",
        "session.updated",
        "session.status",
        "job.started",
        "job.finished",
        "message.added",
        "session.wake",
        "session.deleted",
    ] {
        assert!(
            kinds.contains(kind),
            "the scenario saw no {kind}: {kinds:?}"
        );
    }
}
