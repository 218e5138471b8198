//! The admin pages' HTML: small server-rendered documents, one stylesheet and one script,
//! both served from the box (`/admin/static/…`), so the page works with no internet and its
//! CSP can forbid every inline script and style. Every page is a `maud` template over the web
//! kit (`crate::web`): every value shown is escaped unless it is markup the kit made.

use maud::{html, Markup, PreEscaped};

use super::context::Ctx;
use super::route::{Power, Route};
use crate::hub::StatusReport;
use crate::pairing::Invitation;
use crate::protocol::HealthState;
use crate::store::{human_bytes, Device};
use crate::web::{self, csrf_field as csrf, options, tokens, Assets, Channel, Tone};

/// Side of a QR code on the page, in CSS pixels.
const QR_PX: u32 = 320;

/// The sections a signed-in owner moves between.
pub const SECTIONS: [(Route, &str); 7] = [
    (Route::Home, "Status"),
    (Route::Devices, "Devices"),
    (Route::Agent, "Agent"),
    (Route::Push, "Push"),
    (Route::Backup, "Backup"),
    (Route::Update, "Update"),
    (Route::Log, "Log"),
];

/// The shell every page's body is set in, as far as the request decides it: what the page
/// says about the connection it came over.
pub struct Shell<'a> {
    /// How the request came (over TLS or plain HTTP).
    pub channel: Channel,
    /// The https address to use instead, when this came over plain HTTP and TLS is on.
    pub https: Option<&'a str>,
    /// The certificate's SHA-256, for the owner to compare with the browser's.
    pub fingerprint: Option<&'a str>,
}

/// A notice at the top of a page.
pub enum Notice<'a> {
    None,
    Good(&'a str),
    /// Done, with something to know (saved, but the agent does not answer).
    Warn(&'a str),
    Bad(&'a str),
}

impl<'a> Notice<'a> {
    /// What a form left for this page (`super::outcome`), or none.
    pub fn of(o: Option<&'a super::outcome::Outcome>) -> Notice<'a> {
        use super::outcome::Tone;
        match o {
            None => Notice::None,
            Some(o) => match o.tone {
                Tone::Good => Notice::Good(&o.text),
                Tone::Warn => Notice::Warn(&o.text),
                Tone::Bad => Notice::Bad(&o.text),
            },
        }
    }
}

/// A notice as HTML (escaped), system errors in it in the owner's words.
pub(super) fn notice(n: &Notice) -> Markup {
    let (tone, text) = match n {
        Notice::None => return html! {},
        Notice::Good(t) => (Tone::Good, t),
        Notice::Warn(t) => (Tone::Warn, t),
        Notice::Bad(t) => (Tone::Bad, t),
    };
    web::notice(tone, &super::words::owner_words(text))
}

/// Over TLS, the certificate to compare; over plain HTTP, the warning.
fn connection_note(shell: &Shell) -> Markup {
    if shell.channel.is_encrypted() {
        return html! {
            @if let Some(fp) = shell.fingerprint {
                p { small { "Encrypted. Compare the certificate your browser shows with this \
                    SHA-256: " code #fingerprint { (tokens(fp)) } } }
            }
        };
    }
    let better = html! {
        @if let Some(u) = shell.https {
            " Prefer " a href=(u) { code { (tokens(u)) } } "."
        }
    };
    web::plain_warning(
        Some("plain-warning"),
        "what it shows, and your passphrase",
        better,
    )
}

/// A whole page. `csrf` is set for a signed-in owner (navigation and sign-out are shown).
pub fn document(
    title: &str,
    current: &str,
    csrf_token: Option<&str>,
    shell: &Shell,
    body: Markup,
) -> Markup {
    let header = html! {
        header {
            strong { "Iris gateway" }
            @if let Some(token) = csrf_token {
                nav {
                    @for (href, name) in &SECTIONS {
                        a href=(href) aria-current=[(href.path() == current).then_some("page")] {
                            (name)
                        }
                    }
                    a href=(Route::Owner) { "Owner" }
                }
                form.inline method="post" action=(Route::SignOut) {
                    (csrf(token))
                    button #signout { "Sign out" }
                }
            }
        }
    };
    web::document(
        &format!("{title} · Iris gateway"),
        Assets::Linked {
            stylesheet: &Route::Css.to_string(),
            script: &Route::Js.to_string(),
        },
        html! {
            (header)
            main {
                h1 { (title) }
                (connection_note(shell))
                (body)
            }
        },
    )
}

/// A new-passphrase field with the strength meter the script fills in from the gateway's own
/// verdict (`POST /admin/strength`, the test set-up and the change apply), so they cannot
/// disagree. The meter is red below the score the gateway accepts, green from it.
fn strength_input(id: &str, label: &str, token: &str) -> Markup {
    use super::owner::{MIN_PASSPHRASE_CHARS, MIN_STRENGTH_SCORE};
    let meter = format!("{id}-meter");
    html! {
        label for=(id) { (label) }
        input type="password" id=(id) name=(id) autocomplete="new-password"
            minlength=(MIN_PASSPHRASE_CHARS) maxlength="1024" required
            data-strength=(meter) data-token=(token);
        meter id=(meter) min="0" max="4" low=(f32::from(MIN_STRENGTH_SCORE) - 0.5)
            high=(MIN_STRENGTH_SCORE) optimum="4" value="0" {}
        " "
        span id=(format!("{meter}-text")) {
            "At least " (MIN_PASSPHRASE_CHARS) " characters, and not easy to guess: a few \
            unrelated words work well."
        }
    }
}

/// Set-up: the box has no owner yet.
pub fn setup(pre: &str, n: &Notice) -> Markup {
    html! {
        (notice(n))
        p { "This gateway has no owner yet. Choose a passphrase: whoever knows it can change \
            every setting and pair phones. The first person to do this on your network owns the \
            box (you can take it back at the box with "
            code { (crate::hints::command("owner reset")) } ")." }
        form method="post" action=(Route::Setup) {
            input type="hidden" name="pre" value=(pre);
            (strength_input("passphrase", "Owner passphrase", pre))
            label for="confirm" { "The same again" }
            input type="password" id="confirm" name="confirm" autocomplete="new-password"
                maxlength="1024" required;
            p { button id="claim" class="big" { "Claim this gateway" } }
        }
    }
}

/// Sign-in; `next` is the page asked for, where a right passphrase leads.
pub fn signin(pre: &str, next: &str, n: &Notice) -> Markup {
    html! {
        (notice(n))
        form method="post" action=(Route::SignIn) {
            input type="hidden" name="pre" value=(pre);
            input type="hidden" name="next" value=(next);
            label for="passphrase" { "Owner passphrase" }
            input type="password" id="passphrase" name="passphrase"
                autocomplete="current-password" maxlength="1024" required autofocus;
            p { button id="signin" class="big" { "Sign in" } }
        }
        p { small { "Forgot it? At the box: " code { (crate::hints::command("owner set")) }
            " (or " code { (crate::hints::command("owner reset")) }
            " to set it up again here)." } }
    }
}

/// A pairing invitation: QR code for another phone, a link for this one, the values as text.
pub fn invitation(inv: &Invitation, device_id: &str, intro: &str) -> Markup {
    html! {
        p { (intro) }
        p { a id="open-in-app" class="big" href=(inv.uri()) { "Open in the Iris app" }
            " (on the phone showing this page)" }
        p { "Or scan this with the Iris app on another phone:" }
        // The QR code's own renderer made this SVG from the pairing URI: markup of ours, no
        // text of anyone's in it.
        div.qr #qr { (PreEscaped(inv.svg_qr(QR_PX))) }
        dl {
            dt { "URL" } dd { code #pair-url { (tokens(&inv.url)) } }
            @if let Some(fp) = &inv.fingerprint {
                dt { "Certificate SHA-256 (the app pins it)" } dd { code { (tokens(fp)) } }
            }
            dt { "Token (shown only now)" } dd { code #pair-token { (tokens(&inv.token)) } }
            dt { "Device" } dd { code { (tokens(device_id)) } }
        }
        p { "Nothing here is kept: once the phone is paired, leave this page. "
            a href=(Route::Devices) { "Devices" } " can rename or revoke it." }
    }
}

/// A time in the past, for people ("5 min ago").
fn ago(ms: i64) -> String {
    let secs = ((crate::ids::now_ms() - ms).max(0) / 1000) as u64;
    match secs {
        0..=59 => format!("{secs} s ago"),
        60..=3599 => format!("{} min ago", secs / 60),
        3600..=86_399 => format!("{} h ago", secs / 3600),
        _ => format!("{} days ago", secs / 86_400),
    }
}

/// The status section.
pub fn status(r: &StatusReport, n: &Notice) -> Markup {
    let (state, class) = match r.state {
        HealthState::Online => ("online", "good"),
        HealthState::Restarting => ("restarting", "warn"),
        HealthState::Degraded => ("degraded", "bad"),
    };
    let up = r.uptime_secs;
    html! {
        (notice(n))
        p class=(class) id="health" { "Gateway: " strong { (state) } }
        @if !r.causes.is_empty() {
            ul #causes { @for c in &r.causes { li { (c) } } }
        }
        @if let Some(why) = &r.restore_failure {
            p.bad #restore-failure { "Restore failed: " (why) }
        }
        dl {
            dt { "Version" } dd { (r.version) }
            dt { "Up" } dd { (up / 86_400) "d " ((up % 86_400) / 3600) "h "
                (format!("{:02}", (up % 3600) / 60)) "m" }
            dt { "Agent" } dd #agent {
                (r.agent) ": "
                @match &r.agent_error {
                    Some(e) => { strong { "not usable" } ": " (e) }
                    None => "reachable",
                }
            }
            dt { "Push" } dd #push {
                @match &r.push_error {
                    Some(e) => { (r.push) ": " strong { "failing" } ": " (e) }
                    None if r.push == "none" => "off",
                    None if r.push_confirmed => { (r.push) ": working" }
                    None => { (r.push) ": not tried yet ("
                        a href=(Route::Push) { "send a test push" } ")" }
                }
            }
            dt { "Storage" } dd { "store "
                (r.store_bytes.map_or_else(|| "unreadable".to_owned(), human_bytes))
                ", media " (human_bytes(r.media_bytes)) " of "
                (human_bytes(r.media_quota_bytes)) " quota, "
                (r.disk_free_bytes.map_or_else(|| "unknown".to_owned(), human_bytes))
                " free on the data disk" }
            dt { "Devices" } dd #devices { (r.devices_paired) " paired, "
                (r.devices_connected) " connected now" }
        }
    }
}

/// The cookie naming the device this browser paired (the one its Devices page calls "this
/// device").
pub const THIS_DEVICE_COOKIE: &str = "iris_this_device";

/// [`THIS_DEVICE_COOKIE`] for `device_id`, kept a year (a phone's browser outlives a session).
pub(super) fn this_device_cookie(device_id: &str, ctx: Ctx) -> String {
    let plain = device_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let value = if plain { device_id } else { "" };
    format!(
        "{}; Max-Age=31536000",
        ctx.cookie(THIS_DEVICE_COOKIE, value)
    )
}

/// How a device gets pushes, from what its app sent in `hello`.
fn push_state(d: &Device) -> String {
    let via = match (&d.fcm_token, &d.ntfy_topic) {
        (Some(_), _) => "on, through Firebase (FCM)",
        (None, Some(_)) => "on, through ntfy",
        (None, None) => "off: the app gave no push address",
    };
    match d.push_via.as_deref() {
        Some(app) if d.fcm_token.is_none() && d.ntfy_topic.is_none() => {
            format!("{via} (it names {app})")
        }
        _ => via.to_owned(),
    }
}

/// The most of a User-Agent shown as it is, when it names no app or platform known here.
const RAW_USER_AGENT_CHARS: usize = 60;

/// "app / platform" from a WebSocket upgrade's `User-Agent`: `Iris 1.4 / Android 14`,
/// `okhttp 4.12 / platform not told`, `Chrome 126 / Windows`; a User-Agent naming neither is
/// shown as it is, cut. Only what the header says: nothing is guessed from its shape.
pub fn app_and_platform(ua: &str) -> String {
    // The first product token is the app's, unless it is a browser's `Mozilla/5.0`, whose
    // real name comes later (Edge says Chrome and Safari too, Chrome says Safari).
    let version_of = |name: &str| {
        ua.split(|c: char| c.is_whitespace() || c == '(' || c == ')' || c == ';')
            .find_map(|t| t.strip_prefix(name)?.strip_prefix('/'))
            .map(|v| v.split('.').take(2).collect::<Vec<_>>().join("."))
    };
    // (the token naming the browser, its name, the token carrying its version)
    let browsers = [
        ("Firefox", "Firefox", "Firefox"),
        ("Edg", "Edge", "Edg"),
        ("Chrome", "Chrome", "Chrome"),
        ("Safari", "Safari", "Version"),
    ];
    let browser = browsers.iter().find_map(|(token, name, carrier)| {
        version_of(token)?;
        let major = version_of(carrier)
            .and_then(|v| v.split('.').next().map(str::to_owned))
            .unwrap_or_default();
        Some(format!("{name} {major}").trim_end().to_owned())
    });
    let first = ua.split_whitespace().next().and_then(|t| t.split_once('/'));
    let app = match first {
        Some(("Mozilla", _)) => browser,
        Some((name, version))
            if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.') =>
        {
            Some(format!("{name} {version}"))
        }
        _ => None,
    };
    let after = |marker: &str| {
        let rest = &ua[ua.find(marker)? + marker.len()..];
        let v: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == '_')
            .collect();
        Some(v.replace('_', ".").trim_end_matches('.').to_owned())
    };
    let with = |name: &str, v: Option<String>| match v.filter(|v| !v.is_empty()) {
        Some(v) => format!("{name} {v}"),
        None => name.to_owned(),
    };
    let platform = if ua.contains("Android") {
        Some(with("Android", after("Android")))
    } else if ua.contains("iPhone OS") || ua.contains("iOS") || ua.contains("iPad") {
        Some(with(
            "iOS",
            after("iPhone OS")
                .or_else(|| after("iOS"))
                .or_else(|| after("CPU OS")),
        ))
    } else if ua.contains("Windows") {
        Some("Windows".to_owned())
    } else if ua.contains("Mac OS X") || ua.contains("macOS") {
        Some("macOS".to_owned())
    } else if ua.contains("CrOS") {
        Some("ChromeOS".to_owned())
    } else if ua.contains("Linux") {
        Some("Linux".to_owned())
    } else {
        None
    };
    match (app, platform) {
        (None, None) => {
            let cut: String = ua.chars().take(RAW_USER_AGENT_CHARS).collect();
            let more = if cut.len() < ua.len() { "…" } else { "" };
            format!("{cut}{more}")
        }
        (app, platform) => format!(
            "{} / {}",
            app.as_deref().unwrap_or("app not told"),
            platform.as_deref().unwrap_or("platform not told")
        ),
    }
}

/// The devices section.
pub fn devices(
    list: &[Device],
    connected: &std::collections::HashSet<String>,
    this_device: Option<&str>,
    csrf_token: &str,
    n: &Notice,
) -> Markup {
    let row = |d: &Device| {
        let id = &d.device_id;
        html! {
            tr data-device=(id) {
                td {
                    form.inline method="post" action=(Route::DevicesRename) {
                        (csrf(csrf_token))
                        input type="hidden" name="device_id" value=(id);
                        input type="text" name="name" value=(d.name) maxlength="100"
                            aria-label="name";
                        " "
                        button.rename { "Rename" }
                    }
                    br;
                    small { code { (tokens(id)) } }
                    @if this_device == Some(id.as_str()) {
                        " " strong.this-device { "This device" }
                    }
                }
                td data-label="Paired" { (ago(d.created_ms)) }
                td data-label="Last seen" {
                    (d.last_seen_ms.map_or_else(|| "never".to_owned(), ago))
                }
                td.address data-label="Last address" {
                    @match &d.last_address {
                        Some(a) => (tokens(a)),
                        None => "none yet",
                    }
                }
                // The schema's hello names no app or platform: the upgrade's User-Agent does.
                td.app data-label="App / platform" {
                    @match &d.user_agent {
                        Some(ua) => (app_and_platform(ua)),
                        None => "not told",
                    }
                }
                td.push data-label="Push" { (push_state(d)) }
                td.connected data-label="Connected" {
                    (if connected.contains(id) { "yes" } else { "no" })
                }
                td {
                    form.inline method="post" action=(Route::DevicesRevoke)
                        data-confirm="Revoke this device? Its app is disconnected at once." {
                        (csrf(csrf_token))
                        input type="hidden" name="device_id" value=(id);
                        button.revoke { "Revoke" }
                    }
                }
            }
        }
    };
    html! {
        (notice(n))
        @if list.is_empty() {
            p #no-devices { "No device is paired yet." }
        } @else {
            table id="device-table" class="stack" {
                tr { th { "Name" } th { "Paired" } th { "Last seen" } th { "Last address" }
                    th { "App / platform" } th { "Push" } th { "Connected" } th {} }
                @for d in list { (row(d)) }
            }
        }
        h2 { "Pair a new phone" }
        form method="post" action=(Route::DevicesPair) {
            (csrf(csrf_token))
            label for="name" { "Name (to recognise it here)" }
            input type="text" id="name" name="name" maxlength="100";
            p { button #pair { "Pair a phone" } }
        }
    }
}

/// What the agent form shows: never the key itself.
pub struct AgentView<'a> {
    pub backend: &'a str,
    pub url: &'a str,
    pub model: &'a str,
    pub key_set: bool,
    /// Keys a flag pins (the saved value cannot take effect while the flag is given).
    pub pinned: Vec<&'static str>,
    pub describe: String,
    /// What of the agent's files reaches the phone (`media_out::FilePolicy::describe`).
    pub files: String,
    /// The form shows what was typed for a test, and a key was typed: it is not shown back.
    pub key_typed: bool,
}

/// What a form says when a command-line flag pins some of its keys.
fn pinned_note(pinned: &[&str]) -> Markup {
    html! {
        @if !pinned.is_empty() {
            p.warn { "Set by a command-line flag, which wins over this page: " (pinned.join(", ")) }
        }
    }
}

/// The agent section.
pub fn agent(v: &AgentView, csrf_token: &str, n: &Notice) -> Markup {
    let key_note = if v.key_typed {
        "The key you typed was used for the test but is never shown back: type it again to save it."
    } else if v.key_set {
        "A key is saved (it is never shown). Type a new one to replace it. A key goes only to the URL it was saved with: a new URL with this field empty gets no key."
    } else {
        "No key is saved."
    };
    let backends = [
        ("demo", "Demo (built in, no AI)"),
        ("hermes", "Hermes Agent"),
        ("openai", "OpenAI-compatible server"),
    ];
    html! {
        (notice(n))
        (pinned_note(&v.pinned))
        p { "Now: " span #agent-now { (v.describe) } }
        p #agent-files { (v.files) }
        form method="post" action=(Route::Agent) id="agent-form" {
            (csrf(csrf_token))
            label for="backend" { "Backend" }
            select #backend name="backend" { (options(v.backend, &backends)) }
            label for="url" { "URL (empty: the backend's usual local address)" }
            input type="url" id="url" name="url" value=(v.url) maxlength="2048";
            label for="key" { "Key" }
            input type="password" id="key" name="key" autocomplete="off" maxlength="4096";
            small #agent-key-note { (key_note) }
            label { input type="checkbox" name="clear_key" value="1"; " Remove the saved key" }
            label for="model" { "Model (empty: the agent's default)" }
            input type="text" id="model" name="model" value=(v.model) maxlength="256";
            p {
                button #agent-save formaction=(Route::Agent) {
                    "Save (applies to new messages)"
                }
                " "
                button #agent-test formaction=(Route::AgentTest) { "Test connection" }
            }
        }
    }
}

/// What the transcription form shows: never the key itself.
pub struct TranscriptionView<'a> {
    pub url: &'a str,
    pub model: &'a str,
    pub language: &'a str,
    pub timeout_secs: &'a str,
    pub key_set: bool,
    /// The service voice notes go to now, or `None` when it is off.
    pub now: Option<String>,
    /// The form shows what was typed for a test, and a key was typed: it is not shown back.
    pub key_typed: bool,
}

/// What a service form says under its key field (`what`: `key`, `speech key`, so two forms on
/// one page do not say the same sentence): a key typed for a test is not shown back, a saved
/// one is never shown and goes only to its URL, or there is none.
pub(super) fn key_note(key_typed: bool, key_set: bool, what: &str) -> Markup {
    html! {
        @if key_typed {
            "The " (what) " you typed was used for the test but is never shown back: type it again to save it."
        } @else if key_set {
            "A " (what) " is saved (it is never shown). Type a new one to replace it. It goes only to the URL it was saved with."
        } @else {
            "No " (what) " is saved (a service on your network usually needs none)."
        }
    }
}

/// The Agent page's Transcription section: where voice notes are turned into text.
pub fn transcription(v: &TranscriptionView, csrf_token: &str, n: &Notice) -> Markup {
    html! {
        h2 #transcription { "Transcription" }
        (notice(n))
        p { "Voice notes are turned into text before the agent is asked, by any \
            OpenAI-compatible speech-to-text service (OpenAI, Groq, or a faster-whisper or \
            whisper.cpp server on your network). Everyone in the conversation sees what was \
            heard." }
        p { "Now: " span #transcription-now {
            @match &v.now {
                Some(d) => { "voice notes are transcribed by " (d) }
                None => "off: voice notes reach the agent as an attachment line",
            }
        } }
        form method="post" action=(Route::Transcription) id="transcription-form" {
            (csrf(csrf_token))
            label for="t-url" { "URL, with its version (e.g. http://192.168.1.20:8000/v1 or https://api.openai.com/v1; empty: off)" }
            input type="url" id="t-url" name="url" value=(v.url) maxlength="2048";
            label for="t-key" { "Key" }
            input type="password" id="t-key" name="key" autocomplete="off" maxlength="4096";
            small { (key_note(v.key_typed, v.key_set, "key")) }
            label { input type="checkbox" name="clear_key" value="1"; " Remove the saved key" }
            label for="t-model" { "Model" }
            input type="text" id="t-model" name="model" value=(v.model) maxlength="256";
            label for="t-language" { "Language (e.g. en; empty: the service detects it)" }
            input type="text" id="t-language" name="language" value=(v.language) maxlength="16";
            label for="t-timeout" { "Longest wait, in seconds (past it the agent gets the voice note as an attachment and the chat moves on)" }
            input type="number" id="t-timeout" name="timeout_secs" value=(v.timeout_secs) min="1"
                max=(crate::config::transcription::MAX_TIMEOUT_SECS) step="1";
            p {
                button #transcription-save formaction=(Route::Transcription) {
                    "Save (applies to the next voice note)"
                }
                " "
                button #transcription-test formaction=(Route::TranscriptionTest) {
                    "Test (sends a one-second tone)"
                }
            }
        }
    }
}

/// What the push form shows.
pub struct PushView<'a> {
    pub running: &'a str,
    pub backend: &'a str,
    pub ntfy_server: &'a str,
    pub token_set: bool,
    pub content: &'a str,
    /// Who the FCM key in use is for (`client_email (project …)`), or why it is unreadable;
    /// `None` with no key. Never the key itself.
    pub fcm_key: Option<String>,
    /// Keys a flag pins (the saved value cannot take effect while the flag is given).
    pub pinned: Vec<&'static str>,
    /// The ntfy topic the test offers.
    pub test_topic: &'a str,
}

/// The push section.
pub fn push(v: &PushView, targets: &[Device], csrf_token: &str, n: &Notice) -> Markup {
    let token_note = if v.token_set {
        "A token is saved (never shown). Type a new one to replace it. A token goes only to the server it was saved with: a new server with this field empty gets none."
    } else {
        "No token is saved."
    };
    let backends = [("none", "Off"), ("ntfy", "ntfy"), ("fcm", "Firebase (FCM)")];
    let contents = [
        ("full", "The message (up to 140 characters)"),
        ("preview", "A 60-character preview"),
        ("title", "The channel name only"),
        ("none", "Nothing but \"New activity\""),
    ];
    let test = html! {
        h2 { "Test" }
        p { "Sends one push now with the settings saved below and says what the push server \
            answered." }
        form method="post" action=(Route::PushTest) {
            (csrf(csrf_token))
            @if targets.is_empty() {
                p { "No phone has registered for pushes yet (the app does when it connects \
                    with push on): the test goes to the topic below." }
            } @else {
                label for="device" { "Send it to" }
                select #device name="device_id" {
                    @for d in targets {
                        option value=(d.device_id) {
                            (if d.name.is_empty() { "unnamed" } else { d.name.as_str() })
                            " (" (d.device_id) ")"
                        }
                    }
                    option value="" { "the ntfy topic below" }
                }
            }
            label for="test-topic" { "ntfy topic (subscribe to it in the ntfy app to see the \
                test)" }
            input type="text" id="test-topic" name="topic" value=(v.test_topic) maxlength="64";
            p { button #push-test { "Send a test push now" } }
        }
    };
    html! {
        (notice(n))
        (pinned_note(&v.pinned))
        p { "Running now: " span #push-now { (v.running) } }
        h2 { "Settings" }
        form method="post" action=(Route::Push) enctype="multipart/form-data" {
            (csrf(csrf_token))
            label for="push-backend" { "Backend" }
            select #push-backend name="backend" { (options(v.backend, &backends)) }
            label for="ntfy-server" { "ntfy server" }
            input type="url" id="ntfy-server" name="ntfy_server" value=(v.ntfy_server)
                maxlength="2048";
            label for="ntfy-token" { "ntfy token" }
            input type="password" id="ntfy-token" name="ntfy_token" autocomplete="off"
                maxlength="4096";
            " " small { (token_note) }
            label for="fcm-key" { "Firebase service-account key (JSON)" }
            input type="file" id="fcm-key" name="fcm_key" accept="application/json,.json";
            " "
            small #fcm-key-note {
                @match &v.fcm_key {
                    Some(k) => { "In use: " (k) " (never shown). Choose a file to replace it." }
                    None => "None yet: Firebase needs one.",
                }
            }
            label for="content" { "What a push shows" }
            select #content name="content" { (options(v.content, &contents)) }
            p { button #push-save { "Save (applies when the gateway restarts)" } }
        }
        (test)
        form method="post" action=(Route::Power(Power::Restart)) {
            (csrf(csrf_token))
            p { button #restart { "Restart now" } " (phones reconnect by themselves)" }
        }
    }
}

/// The backup section. The restore form is sent by the page's script (the file as the body,
/// the CSRF token in a header): an HTML form could only send it as multipart.
pub fn backup(csrf_token: &str, n: &Notice) -> Markup {
    html! {
        (notice(n))
        p { a id="backup-download" class="big" href=(Route::BackupDownload) download { "Download a backup" }
            " (made now: messages, channels, devices and media, in the format of "
            code { "iris-gateway backup" } "; settings and the owner are not in it)." }
        h2 { "Restore" }
        p { "Replaces messages, channels, devices and media with the backup's (a scheduled \
            backup's " code { ".age" } " file also brings back its settings and owner \
            passphrase). The file is checked in full first; the current store is kept aside in \
            the data dir, and the gateway restarts into the backup." }
        form #restore-form data-csrf=(csrf_token) {
            label for="restore-file" { "Backup file (a download from here, or a scheduled \
                backup)" }
            input type="file" id="restore-file" required;
            label for="restore-upload-passphrase" { "Its backup passphrase (a scheduled backup \
                only)" }
            input type="password" id="restore-upload-passphrase" autocomplete="off" maxlength="1024";
            p { button #restore { "Restore this backup" } }
        }
        p #restore-result role="status" {}
    }
}

/// The owner section: change the passphrase.
pub fn owner(csrf_token: &str, n: &Notice) -> Markup {
    html! {
        (notice(n))
        h2 { "Change the passphrase" }
        p { "Every browser signed in is signed out." }
        form method="post" action=(Route::Passphrase) {
            (csrf(csrf_token))
            label for="current" { "Current passphrase" }
            input type="password" id="current" name="current" autocomplete="current-password"
                maxlength="1024" required;
            (strength_input("passphrase", "New passphrase", csrf_token))
            label for="confirm" { "The new one again" }
            input type="password" id="confirm" name="confirm" autocomplete="new-password"
                maxlength="1024" required;
            p { button #change { "Change it" } }
        }
    }
}

/// A page with a message only: in one `#result` block, which is what the restore form's
/// script shows of an answer (the rest of the page would repeat around it).
pub fn message(text: &str, n: &Notice) -> Markup {
    html! { div #result { (notice(n)) p { (text) } } }
}

/// A refusal: its one sentence, and a way back.
pub fn refusal(text: &str, back: (&str, &str)) -> Markup {
    html! {
        div #result { (web::notice(Tone::Bad, text)) }
        p { a #back href=(back.0) { (back.1) } }
    }
}

/// A pairing result asked for again (a reload): it is shown once only.
pub fn already_shown() -> Markup {
    html! {
        div #result { p.warn #notice { "This pairing code was shown once and is not shown \
            again, so reloading pairs nothing." } }
        p { "If the phone did not get it, revoke that device and pair again on "
            a #back href=(Route::Devices) { "Devices" } "." }
    }
}

#[cfg(test)]
mod tests {
    use super::app_and_platform;

    #[test]
    fn a_user_agent_reads_as_app_and_platform_or_is_shown_cut() {
        let cases = [
            ("Iris/1.4 (Android 14)", "Iris 1.4 / Android 14"),
            ("okhttp/4.12.0", "okhttp 4.12.0 / platform not told"),
            ("Dart/3.5 (dart:io)", "Dart 3.5 / platform not told"),
            (
                "Mozilla/5.0 (Windows NT 10.0; Win64; x64) AppleWebKit/537.36 (KHTML, like Gecko) \
                 Chrome/126.0.0.0 Safari/537.36",
                "Chrome 126 / Windows",
            ),
            (
                "Mozilla/5.0 (iPhone; CPU iPhone OS 17_4 like Mac OS X) AppleWebKit/605.1.15 \
                 (KHTML, like Gecko) Version/17.4 Mobile/15E148 Safari/604.1",
                "Safari 17 / iOS 17.4",
            ),
            (
                "Mozilla/5.0 (Android 14; Mobile; rv:126.0) Gecko/126.0 Firefox/126.0",
                "Firefox 126 / Android 14",
            ),
            ("Mozilla/5.0 (X11; Linux x86_64)", "app not told / Linux"),
            ("a phone", "a phone"),
        ];
        for (ua, shown) in cases {
            assert_eq!(app_and_platform(ua), shown, "{ua}");
        }
        let long = "x".repeat(150);
        assert_eq!(app_and_platform(&long), format!("{}…", "x".repeat(60)));
    }
}
