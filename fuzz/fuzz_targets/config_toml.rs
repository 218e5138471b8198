//! The config parser: TOML text → `Config` (what `Config::from_file` does after reading the
//! file) → `Config::validate`, on any text.
//!
//! Checked: no panic and no hang (libFuzzer's `-timeout`); memory within a linear bound of the
//! text; `Debug` (what a log line would show) never reveals a `Secret` (the agent key, webhook
//! tokens); and a config that validates keeps the promises the gateway then relies on: the
//! limits it checks, and every `[[cron]]` schedule parses and yields its next run promptly (the
//! cron task computes it on the event loop, so a schedule that takes long would stall it).

#![no_main]

use std::time::{Duration, Instant};

use iris_gateway::config::{Config, Secret};
use iris_gateway_fuzz::{check_alloc, measure, Counting};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: Counting = Counting;

/// A config file is the administrator's, not an attacker's, so the bound only has to catch
/// memory that grows faster than the text or without limit. toml's parser costs far more per
/// byte than JSON's on broken input: it keeps an error (with its message) per bad token, ~150
/// bytes for each `.` of `a.....b = 1` (measured while writing this target).
const PER_BYTE: usize = 512;
const FIXED: usize = 256 << 10;

/// The longest a valid schedule's next run may take to compute (the cron task does it on the
/// event loop): generous, so only a schedule that searches far ahead trips it.
const NEXT_RUN_BUDGET: Duration = Duration::from_millis(250);

fn secrets(config: &Config) -> Vec<String> {
    let mut all = vec![config.agent.key.expose().to_owned()];
    all.extend(config.webhook.iter().map(|h| h.token.expose().to_owned()));
    all.retain(|s| !s.is_empty());
    all
}

fn without_secrets(config: &Config) -> Config {
    let mut c = config.clone();
    c.agent.key = Secret::default();
    for hook in &mut c.webhook {
        hook.token = Secret::default();
    }
    c
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (parsed, peak) = measure(|| toml::from_str::<Config>(text));
    check_alloc(
        "toml::from_str::<Config>",
        text.len(),
        peak,
        PER_BYTE,
        FIXED,
    );
    let Ok(config) = parsed else {
        return;
    };

    let shown = format!("{config:?}");
    let baseline = format!("{:?}", without_secrets(&config));
    for secret in secrets(&config) {
        // A secret that is also some other setting's text (or `"<redacted>"`) shows legitimately.
        assert!(
            !shown.contains(&secret) || baseline.contains(&secret),
            "Debug shows a secret: {secret:?}"
        );
    }

    if config.validate().is_err() {
        return;
    }
    let l = &config.limits;
    assert!(l.max_frame_bytes >= 4096 && l.max_text_bytes >= 1);
    assert!(l.history_max >= 1 && l.history_default <= l.history_max);
    assert!(l.max_running_turns >= 1 && l.frames_per_second >= 1 && l.frame_burst >= 1);
    assert!(config.store.outbox_retain_frames >= 100);
    assert!(matches!(
        config.agent.backend.as_str(),
        "demo" | "hermes" | "openai"
    ));
    let _ = config.agent.base_url();
    let now = chrono_now();
    for job in &config.cron {
        let schedule: cron::Schedule = job
            .schedule
            .parse()
            .expect("validate accepted a schedule that does not parse");
        assert!(!job.channel.trim().is_empty() && !job.prompt.trim().is_empty());
        let started = Instant::now();
        let _ = schedule.after(&now).next();
        assert!(
            started.elapsed() < NEXT_RUN_BUDGET,
            "the next run of `{}` took {:?} to compute",
            job.schedule,
            started.elapsed()
        );
    }
    for hook in &config.webhook {
        assert!(!hook.name.is_empty() && hook.name.len() <= 64);
        assert!(hook.token_file.is_some() || hook.token.expose().chars().count() >= 16);
    }
});

/// A fixed instant, so a run is reproducible whatever the date.
fn chrono_now() -> chrono::DateTime<chrono::Local> {
    use chrono::TimeZone;
    chrono::Local
        .with_ymd_and_hms(2026, 3, 29, 1, 30, 0)
        .earliest()
        .expect("a valid local time")
}
