//! The admin pages' HTML: small server-rendered documents, one stylesheet and one script,
//! both served from the box (`/admin/static/…`), so the page works with no internet and its
//! CSP can forbid every inline script and style. Every value shown is escaped.

use super::route::{Power, Route};
use crate::hub::StatusReport;
use crate::pairing::page::{escape, tokens};
use crate::pairing::Invitation;
use crate::protocol::HealthState;
use crate::store::{human_bytes, Device};

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
    /// Came over TLS.
    pub secure: bool,
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
pub(super) fn notice(n: &Notice) -> String {
    let escape = |t: &str| escape(&super::words::owner_words(t));
    match n {
        Notice::None => String::new(),
        Notice::Good(t) => format!(
            "<p class=\"good\" role=\"status\" id=\"notice\">{}</p>",
            escape(t)
        ),
        Notice::Warn(t) => format!(
            "<p class=\"warn\" role=\"status\" id=\"notice\">{}</p>",
            escape(t)
        ),
        Notice::Bad(t) => format!(
            "<p class=\"bad\" role=\"alert\" id=\"notice\">{}</p>",
            escape(t)
        ),
    }
}

/// Over TLS, the certificate to compare; over plain HTTP, the warning.
fn connection_note(shell: &Shell) -> String {
    if shell.secure {
        match shell.fingerprint {
            Some(fp) => format!(
                "<p><small>Encrypted. Compare the certificate your browser shows with this \
                 SHA-256: <code id=\"fingerprint\">{}</code></small></p>",
                tokens(fp)
            ),
            None => String::new(),
        }
    } else {
        let better = match shell.https {
            Some(u) => format!(
                " Prefer <a href=\"{}\"><code>{}</code></a>.",
                escape(u),
                tokens(u)
            ),
            None => String::new(),
        };
        format!(
            "<p class=\"warn\" id=\"plain-warning\">This page came over plain HTTP: anyone on \
             your network could read what it shows, and your passphrase.{better}</p>"
        )
    }
}

/// A whole page. `csrf` is set for a signed-in owner (navigation and sign-out are shown).
pub fn document(
    title: &str,
    current: &str,
    csrf: Option<&str>,
    shell: &Shell,
    body: &str,
) -> String {
    let header = match csrf {
        Some(csrf) => {
            let links: String = SECTIONS
                .iter()
                .map(|(href, name)| {
                    let cur = if href.path() == current {
                        " aria-current=\"page\""
                    } else {
                        ""
                    };
                    format!("<a href=\"{href}\"{cur}>{name}</a>")
                })
                .collect();
            format!(
                "<header><strong>Iris gateway</strong><nav>{links}<a href=\"{r_owner}\">Owner</a></nav>\
                 <form class=\"inline\" method=\"post\" action=\"{r_signout}\">{}\
                 <button id=\"signout\">Sign out</button></form></header>",
                csrf_field(csrf), r_owner = Route::Owner, r_signout = Route::SignOut)
        }
        None => "<header><strong>Iris gateway</strong></header>".to_owned(),
    };
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
         <meta name=\"referrer\" content=\"no-referrer\">\
         <title>{title} · Iris gateway</title>\
         <link rel=\"stylesheet\" href=\"{r_css}\">\
         <script src=\"{r_js}\" defer></script></head>\
         <body>{header}<main><h1>{title}</h1>{note}{body}</main></body></html>",
        title = escape(title),
        note = connection_note(shell),
        r_css = Route::Css,
        r_js = Route::Js,
    )
}

/// The hidden field every state-changing form carries.
pub fn csrf_field(csrf: &str) -> String {
    format!(
        "<input type=\"hidden\" name=\"csrf\" value=\"{}\">",
        escape(csrf)
    )
}

/// A new-passphrase field with the strength meter the script fills in from the gateway's own
/// verdict (`POST /admin/strength`, the test set-up and the change apply), so they cannot
/// disagree. The meter is red below the score the gateway accepts, green from it.
fn strength_input(id: &str, label: &str, token: &str) -> String {
    use super::owner::{MIN_PASSPHRASE_CHARS, MIN_STRENGTH_SCORE};
    format!(
        "<label for=\"{id}\">{label}</label>\
         <input type=\"password\" id=\"{id}\" name=\"{id}\" autocomplete=\"new-password\" \
         minlength=\"{MIN_PASSPHRASE_CHARS}\" maxlength=\"1024\" required \
         data-strength=\"{id}-meter\" data-token=\"{}\">\
         <meter id=\"{id}-meter\" min=\"0\" max=\"4\" low=\"{low}\" high=\"{MIN_STRENGTH_SCORE}\" \
         optimum=\"4\" value=\"0\"></meter> \
         <span id=\"{id}-meter-text\">At least {MIN_PASSPHRASE_CHARS} characters, and not easy to \
         guess: a few unrelated words work well.</span>",
        escape(token),
        low = f32::from(MIN_STRENGTH_SCORE) - 0.5,
    )
}

/// Set-up: the box has no owner yet.
pub fn setup(pre: &str, n: &Notice) -> String {
    format!(
        "{}<p>This gateway has no owner yet. Choose a passphrase: whoever knows it can change \
         every setting and pair phones. The first person to do this on your network owns the box \
         (you can take it back at the box with <code>{}</code>).</p>\
         <form method=\"post\" action=\"{r_setup}\">\
         <input type=\"hidden\" name=\"pre\" value=\"{}\">{}\
         <label for=\"confirm\">The same again</label>\
         <input type=\"password\" id=\"confirm\" name=\"confirm\" autocomplete=\"new-password\" \
         maxlength=\"1024\" required>\
         <p><button id=\"claim\" class=\"big\">Claim this gateway</button></p></form>",
        notice(n),
        escape(&crate::hints::command("owner reset")),
        escape(pre),
        strength_input("passphrase", "Owner passphrase", pre),
        r_setup = Route::Setup,
    )
}

/// Sign-in; `next` is the page asked for, where a right passphrase leads.
pub fn signin(pre: &str, next: &str, n: &Notice) -> String {
    format!(
        "{}<form method=\"post\" action=\"{r_signin}\">\
         <input type=\"hidden\" name=\"pre\" value=\"{}\">\
         <input type=\"hidden\" name=\"next\" value=\"{}\">\
         <label for=\"passphrase\">Owner passphrase</label>\
         <input type=\"password\" id=\"passphrase\" name=\"passphrase\" \
         autocomplete=\"current-password\" maxlength=\"1024\" required autofocus>\
         <p><button id=\"signin\" class=\"big\">Sign in</button></p></form>\
         <p><small>Forgot it? At the box: <code>{}</code> (or \
         <code>{}</code> to set it up again here).</small></p>",
        notice(n),
        escape(pre),
        escape(next),
        escape(&crate::hints::command("owner set")),
        escape(&crate::hints::command("owner reset")),
        r_signin = Route::SignIn,
    )
}

/// A pairing invitation: QR code for another phone, a link for this one, the values as text.
pub fn invitation(inv: &Invitation, device_id: &str, intro: &str) -> String {
    let fp = match &inv.fingerprint {
        Some(fp) => format!(
            "<dt>Certificate SHA-256 (the app pins it)</dt><dd><code>{}</code></dd>",
            tokens(fp)
        ),
        None => String::new(),
    };
    format!(
        "<p>{}</p><p><a id=\"open-in-app\" class=\"big\" href=\"{uri}\">Open in the Iris app</a> \
         (on the phone showing this page)</p>\
         <p>Or scan this with the Iris app on another phone:</p>\
         <div class=\"qr\" id=\"qr\">{svg}</div>\
         <dl><dt>URL</dt><dd><code id=\"pair-url\">{url}</code></dd>{fp}\
         <dt>Token (shown only now)</dt><dd><code id=\"pair-token\">{token}</code></dd>\
         <dt>Device</dt><dd><code>{id}</code></dd></dl>\
         <p>Nothing here is kept: once the phone is paired, leave this page. \
         <a href=\"{r_devices}\">Devices</a> can rename or revoke it.</p>",
        escape(intro),
        uri = escape(&inv.uri()),
        svg = inv.svg_qr(QR_PX),
        url = tokens(&inv.url),
        token = tokens(&inv.token),
        id = tokens(device_id),
        r_devices = Route::Devices,
    )
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
pub fn status(r: &StatusReport, n: &Notice) -> String {
    let (state, class) = match r.state {
        HealthState::Online => ("online".to_owned(), "good"),
        HealthState::Restarting => ("restarting".to_owned(), "warn"),
        HealthState::Degraded => ("degraded".to_owned(), "bad"),
    };
    let causes: String = r
        .causes
        .iter()
        .map(|c| format!("<li>{}</li>", escape(c)))
        .collect();
    let causes = if causes.is_empty() {
        String::new()
    } else {
        format!("<ul id=\"causes\">{causes}</ul>")
    };
    let agent = match &r.agent_error {
        Some(e) => format!(
            "{}: <strong>not usable</strong>: {}",
            escape(&r.agent),
            escape(e)
        ),
        None => format!("{}: reachable", escape(&r.agent)),
    };
    let push = match &r.push_error {
        Some(e) => format!(
            "{}: <strong>failing</strong>: {}",
            escape(&r.push),
            escape(e)
        ),
        None if r.push == "none" => "off".to_owned(),
        None if r.push_confirmed => format!("{}: working", escape(&r.push)),
        None => format!(
            "{}: not tried yet (<a href=\"{r_push}\">send a test push</a>)",
            escape(&r.push),
            r_push = Route::Push
        ),
    };
    let up = r.uptime_secs;
    let restore = r.restore_failure.as_ref().map_or_else(String::new, |why| {
        format!(
            "<p class=\"bad\" id=\"restore-failure\">Restore failed: {}</p>",
            escape(why)
        )
    });
    format!(
        "{}<p class=\"{class}\" id=\"health\">Gateway: <strong>{state}</strong></p>{causes}{restore}\
         <dl><dt>Version</dt><dd>{}</dd>\
         <dt>Up</dt><dd>{}d {}h {:02}m</dd>\
         <dt>Agent</dt><dd id=\"agent\">{agent}</dd>\
         <dt>Push</dt><dd id=\"push\">{push}</dd>\
         <dt>Storage</dt><dd>store {}, media {} of {} quota, {} free on the data disk</dd>\
         <dt>Devices</dt><dd id=\"devices\">{} paired, {} connected now</dd></dl>",
        notice(n),
        escape(&r.version),
        up / 86_400,
        (up % 86_400) / 3600,
        (up % 3600) / 60,
        r.store_bytes
            .map_or_else(|| "unreadable".to_owned(), human_bytes),
        human_bytes(r.media_bytes),
        human_bytes(r.media_quota_bytes),
        r.disk_free_bytes
            .map_or_else(|| "unknown".to_owned(), human_bytes),
        r.devices_paired,
        r.devices_connected,
    )
}

/// The cookie naming the device this browser paired (the one its Devices page calls "this
/// device").
pub const THIS_DEVICE_COOKIE: &str = "iris_this_device";

/// [`THIS_DEVICE_COOKIE`] for `device_id`, kept a year (a phone's browser outlives a session).
pub fn this_device_cookie(device_id: &str, secure: bool) -> String {
    let plain = device_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'_');
    let value = if plain { device_id } else { "" };
    format!(
        "{}; Max-Age=31536000",
        super::session::set_cookie(THIS_DEVICE_COOKIE, value, secure)
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
    csrf: &str,
    n: &Notice,
) -> String {
    let field = csrf_field(csrf);
    let rows: String = list
        .iter()
        .map(|d| {
            let id = escape(&d.device_id);
            let seen = d.last_seen_ms.map_or_else(|| "never".to_owned(), ago);
            let now = if connected.contains(&d.device_id) {
                "yes"
            } else {
                "no"
            };
            let mine = if this_device == Some(d.device_id.as_str()) {
                " <strong class=\"this-device\">This device</strong>"
            } else {
                ""
            };
            // The schema's hello names no app or platform: the upgrade's User-Agent does.
            let app = d
                .user_agent
                .as_deref()
                .map_or_else(|| "not told".to_owned(), |ua| escape(&app_and_platform(ua)));
            let address = d
                .last_address
                .as_deref()
                .map_or_else(|| "none yet".to_owned(), tokens);
            format!(
                "<tr data-device=\"{id}\"><td><form class=\"inline\" method=\"post\" \
                 action=\"{r_devicesrename}\">{field}\
                 <input type=\"hidden\" name=\"device_id\" value=\"{id}\">\
                 <input type=\"text\" name=\"name\" value=\"{name}\" maxlength=\"100\" \
                 aria-label=\"name\"> <button class=\"rename\">Rename</button></form>\
                 <br><small><code>{shown_id}</code></small>{mine}</td>\
                 <td data-label=\"Paired\">{paired}</td><td data-label=\"Last seen\">{seen}</td>\
                 <td class=\"address\" data-label=\"Last address\">{address}</td>\
                 <td class=\"app\" data-label=\"App / platform\">{app}</td>\
                 <td class=\"push\" data-label=\"Push\">{push}</td>\
                 <td class=\"connected\" data-label=\"Connected\">{now}</td>\
                 <td><form class=\"inline\" method=\"post\" action=\"{r_devicesrevoke}\" \
                 data-confirm=\"Revoke this device? Its app is disconnected at once.\">{field}\
                 <input type=\"hidden\" name=\"device_id\" value=\"{id}\">\
                 <button class=\"revoke\">Revoke</button></form></td></tr>",
                name = escape(&d.name),
                shown_id = tokens(&d.device_id),
                push = escape(&push_state(d)),
                paired = ago(d.created_ms),
                r_devicesrename = Route::DevicesRename,
                r_devicesrevoke = Route::DevicesRevoke,
            )
        })
        .collect();
    let table = if list.is_empty() {
        "<p id=\"no-devices\">No device is paired yet.</p>".to_owned()
    } else {
        format!(
            "<table id=\"device-table\" class=\"stack\"><tr><th>Name</th><th>Paired</th><th>Last seen</th>\
             <th>Last address</th><th>App / platform</th><th>Push</th><th>Connected</th><th></th></tr>{rows}</table>"
        )
    };
    format!(
        "{}{table}<h2>Pair a new phone</h2>\
         <form method=\"post\" action=\"{r_devicespair}\">{field}\
         <label for=\"name\">Name (to recognise it here)</label>\
         <input type=\"text\" id=\"name\" name=\"name\" maxlength=\"100\">\
         <p><button id=\"pair\">Pair a phone</button></p></form>",
        notice(n),
        r_devicespair = Route::DevicesPair
    )
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

/// `<option>`s with the current value selected.
fn options(current: &str, choices: &[(&str, &str)]) -> String {
    choices
        .iter()
        .map(|(v, label)| {
            let sel = if *v == current { " selected" } else { "" };
            format!("<option value=\"{v}\"{sel}>{label}</option>")
        })
        .collect()
}

/// The agent section.
pub fn agent(v: &AgentView, csrf: &str, n: &Notice) -> String {
    let pinned = if v.pinned.is_empty() {
        String::new()
    } else {
        format!(
            "<p class=\"warn\">Set by a command-line flag, which wins over this page: {}</p>",
            escape(&v.pinned.join(", "))
        )
    };
    let key_note = if v.key_typed {
        "The key you typed was used for the test but is never shown back: type it again to save it."
    } else if v.key_set {
        "A key is saved (it is never shown). Type a new one to replace it. A key goes only to the URL it was saved with: a new URL with this field empty gets no key."
    } else {
        "No key is saved."
    };
    format!(
        "{}{pinned}<p>Now: <span id=\"agent-now\">{}</span></p>\
         <p id=\"agent-files\">{}</p>\
         <form method=\"post\" action=\"{r_agent}\" id=\"agent-form\">{}\
         <label for=\"backend\">Backend</label><select id=\"backend\" name=\"backend\">{}</select>\
         <label for=\"url\">URL (empty: the backend's usual local address)</label>\
         <input type=\"url\" id=\"url\" name=\"url\" value=\"{}\" maxlength=\"2048\">\
         <label for=\"key\">Key</label>\
         <input type=\"password\" id=\"key\" name=\"key\" autocomplete=\"off\" maxlength=\"4096\">\
         <small id=\"agent-key-note\">{key_note}</small>\
         <label><input type=\"checkbox\" name=\"clear_key\" value=\"1\"> Remove the saved key</label>\
         <label for=\"model\">Model (empty: the agent's default)</label>\
         <input type=\"text\" id=\"model\" name=\"model\" value=\"{}\" maxlength=\"256\">\
         <p><button id=\"agent-save\" formaction=\"{r_agent}\">Save (applies to new messages)</button> \
         <button id=\"agent-test\" formaction=\"{r_agenttest}\">Test connection</button></p>\
         </form>",
        notice(n),
        escape(&v.describe),
        escape(&v.files),
        csrf_field(csrf),
        options(
            v.backend,
            &[
                ("demo", "Demo (built in, no AI)"),
                ("hermes", "Hermes Agent"),
                ("openai", "OpenAI-compatible server"),
            ]
        ),
        escape(v.url),
        escape(v.model),
        r_agent = Route::Agent,
        r_agenttest = Route::AgentTest,
    )
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
pub(super) fn key_note(key_typed: bool, key_set: bool, what: &str) -> String {
    if key_typed {
        format!("The {what} you typed was used for the test but is never shown back: type it again to save it.")
    } else if key_set {
        format!("A {what} is saved (it is never shown). Type a new one to replace it. It goes only to the URL it was saved with.")
    } else {
        format!("No {what} is saved (a service on your network usually needs none).")
    }
}

/// The Agent page's Transcription section: where voice notes are turned into text.
pub fn transcription(v: &TranscriptionView, csrf: &str, n: &Notice) -> String {
    let key_note = key_note(v.key_typed, v.key_set, "key");
    let now = match &v.now {
        Some(d) => format!("voice notes are transcribed by {}", escape(d)),
        None => "off: voice notes reach the agent as an attachment line".to_owned(),
    };
    format!(
        "<h2 id=\"transcription\">Transcription</h2>{}\
         <p>Voice notes are turned into text before the agent is asked, by any OpenAI-compatible \
         speech-to-text service (OpenAI, Groq, or a faster-whisper or whisper.cpp server on your \
         network). Everyone in the conversation sees what was heard.</p>\
         <p>Now: <span id=\"transcription-now\">{now}</span></p>\
         <form method=\"post\" action=\"{r_transcription}\" id=\"transcription-form\">{}\
         <label for=\"t-url\">URL, with its version (e.g. http://192.168.1.20:8000/v1 or https://api.openai.com/v1; empty: off)</label>\
         <input type=\"url\" id=\"t-url\" name=\"url\" value=\"{}\" maxlength=\"2048\">\
         <label for=\"t-key\">Key</label>\
         <input type=\"password\" id=\"t-key\" name=\"key\" autocomplete=\"off\" maxlength=\"4096\">\
         <small>{key_note}</small>\
         <label><input type=\"checkbox\" name=\"clear_key\" value=\"1\"> Remove the saved key</label>\
         <label for=\"t-model\">Model</label>\
         <input type=\"text\" id=\"t-model\" name=\"model\" value=\"{}\" maxlength=\"256\">\
         <label for=\"t-language\">Language (e.g. en; empty: the service detects it)</label>\
         <input type=\"text\" id=\"t-language\" name=\"language\" value=\"{}\" maxlength=\"16\">\
         <label for=\"t-timeout\">Longest wait, in seconds (past it the agent gets the voice note as an attachment and the chat moves on)</label>\
         <input type=\"number\" id=\"t-timeout\" name=\"timeout_secs\" value=\"{}\" min=\"1\" max=\"{}\" step=\"1\">\
         <p><button id=\"transcription-save\" formaction=\"{r_transcription}\">Save (applies to the next voice note)</button> \
         <button id=\"transcription-test\" formaction=\"{r_transcriptiontest}\">Test (sends a one-second tone)</button></p>\
         </form>",
        notice(n),
        csrf_field(csrf),
        escape(v.url),
        escape(v.model),
        escape(v.language),
        escape(v.timeout_secs),
        crate::config::transcription::MAX_TIMEOUT_SECS,
        r_transcription = Route::Transcription,
        r_transcriptiontest = Route::TranscriptionTest,
    )
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
pub fn push(v: &PushView, targets: &[Device], csrf: &str, n: &Notice) -> String {
    let field = csrf_field(csrf);
    let devices: String = targets
        .iter()
        .map(|d| {
            format!(
                "<option value=\"{}\">{} ({})</option>",
                escape(&d.device_id),
                escape(if d.name.is_empty() {
                    "unnamed"
                } else {
                    &d.name
                }),
                escape(&d.device_id)
            )
        })
        .collect();
    let to = if targets.is_empty() {
        "<p>No phone has registered for pushes yet (the app does when it connects with push \
         on): the test goes to the topic below.</p>"
            .to_owned()
    } else {
        format!(
            "<label for=\"device\">Send it to</label>\
             <select id=\"device\" name=\"device_id\">{devices}\
             <option value=\"\">the ntfy topic below</option></select>"
        )
    };
    let test = format!(
        "<h2>Test</h2><p>Sends one push now with the settings saved below and says what the \
         push server answered.</p>\
         <form method=\"post\" action=\"{r_pushtest}\">{field}{to}\
         <label for=\"test-topic\">ntfy topic (subscribe to it in the ntfy app to see the \
         test)</label>\
         <input type=\"text\" id=\"test-topic\" name=\"topic\" value=\"{topic}\" \
         maxlength=\"64\">\
         <p><button id=\"push-test\">Send a test push now</button></p></form>",
        topic = escape(v.test_topic),
        r_pushtest = Route::PushTest,
    );
    let token_note = if v.token_set {
        "A token is saved (never shown). Type a new one to replace it. A token goes only to the server it was saved with: a new server with this field empty gets none."
    } else {
        "No token is saved."
    };
    let pinned = if v.pinned.is_empty() {
        String::new()
    } else {
        format!(
            "<p class=\"warn\">Set by a command-line flag, which wins over this page: {}</p>",
            escape(&v.pinned.join(", "))
        )
    };
    let key_note = match &v.fcm_key {
        Some(k) => format!(
            "In use: {} (never shown). Choose a file to replace it.",
            escape(k)
        ),
        None => "None yet: Firebase needs one.".to_owned(),
    };
    format!(
        "{}{pinned}<p>Running now: <span id=\"push-now\">{}</span></p>\
         <h2>Settings</h2>\
         <form method=\"post\" action=\"{r_push}\" enctype=\"multipart/form-data\">{field}\
         <label for=\"push-backend\">Backend</label>\
         <select id=\"push-backend\" name=\"backend\">{}</select>\
         <label for=\"ntfy-server\">ntfy server</label>\
         <input type=\"url\" id=\"ntfy-server\" name=\"ntfy_server\" value=\"{}\" maxlength=\"2048\">\
         <label for=\"ntfy-token\">ntfy token</label>\
         <input type=\"password\" id=\"ntfy-token\" name=\"ntfy_token\" autocomplete=\"off\" \
         maxlength=\"4096\"> <small>{token_note}</small>\
         <label for=\"fcm-key\">Firebase service-account key (JSON)</label>\
         <input type=\"file\" id=\"fcm-key\" name=\"fcm_key\" accept=\"application/json,.json\"> \
         <small id=\"fcm-key-note\">{key_note}</small>\
         <label for=\"content\">What a push shows</label>\
         <select id=\"content\" name=\"content\">{}</select>\
         <p><button id=\"push-save\">Save (applies when the gateway restarts)</button></p></form>\
         {test}<form method=\"post\" action=\"{r_restart}\">{field}\
         <p><button id=\"restart\">Restart now</button> (phones reconnect by themselves)</p></form>",
        notice(n),
        escape(v.running),
        options(
            v.backend,
            &[("none", "Off"), ("ntfy", "ntfy"), ("fcm", "Firebase (FCM)")]
        ),
        escape(v.ntfy_server),
        options(
            v.content,
            &[
                ("full", "The message (up to 140 characters)"),
                ("preview", "A 60-character preview"),
                ("title", "The channel name only"),
                ("none", "Nothing but \"New activity\""),
            ]
        ),
        r_push = Route::Push,
        r_restart = Route::Power(Power::Restart),
    )
}

/// The backup section. The restore form is sent by the page's script (the file as the body,
/// the CSRF token in a header): an HTML form could only send it as multipart.
pub fn backup(csrf: &str, n: &Notice) -> String {
    format!(
        "{}<p><a id=\"backup-download\" class=\"big\" href=\"{r_backupdownload}\" download>\
         Download a backup</a> (made now: messages, channels, devices and media, in the format \
         of <code>iris-gateway backup</code>; settings and the owner are not in it).</p>\
         <h2>Restore</h2><p>Replaces messages, channels, devices and media with the backup's \
         (a scheduled backup's <code>.age</code> file also brings back its settings and owner \
         passphrase). The file is checked in full first; the current store is kept aside in the \
         data dir, and the gateway restarts into the backup.</p>\
         <form id=\"restore-form\" data-csrf=\"{}\">\
         <label for=\"restore-file\">Backup file (a download from here, or a scheduled \
         backup)</label>\
         <input type=\"file\" id=\"restore-file\" required>\
         <label for=\"restore-upload-passphrase\">Its backup passphrase (a scheduled backup \
         only)</label>\
         <input type=\"password\" id=\"restore-upload-passphrase\" autocomplete=\"off\" \
         maxlength=\"1024\">\
         <p><button id=\"restore\">Restore this backup</button></p></form>\
         <p id=\"restore-result\" role=\"status\"></p>",
        notice(n),
        escape(csrf),
        r_backupdownload = Route::BackupDownload
    )
}

/// The owner section: change the passphrase.
pub fn owner(csrf: &str, n: &Notice) -> String {
    format!(
        "{}<h2>Change the passphrase</h2><p>Every browser signed in is signed out.</p>\
         <form method=\"post\" action=\"{r_passphrase}\">{}\
         <label for=\"current\">Current passphrase</label>\
         <input type=\"password\" id=\"current\" name=\"current\" autocomplete=\"current-password\" \
         maxlength=\"1024\" required>{}\
         <label for=\"confirm\">The new one again</label>\
         <input type=\"password\" id=\"confirm\" name=\"confirm\" autocomplete=\"new-password\" \
         maxlength=\"1024\" required>\
         <p><button id=\"change\">Change it</button></p></form>",
        notice(n),
        csrf_field(csrf),
        strength_input("passphrase", "New passphrase", csrf),
        r_passphrase = Route::Passphrase,
    )
}

/// A page with a message only: in one `#result` block, which is what the restore form's
/// script shows of an answer (the rest of the page would repeat around it).
pub fn message(text: &str, n: &Notice) -> String {
    format!(
        "<div id=\"result\">{}<p>{}</p></div>",
        notice(n),
        escape(text)
    )
}

/// A refusal: its one sentence, and a way back.
pub fn refusal(text: &str, back: (&str, &str)) -> String {
    format!(
        "<div id=\"result\"><p class=\"bad\" role=\"alert\" id=\"notice\">{}</p></div>\
         <p><a id=\"back\" href=\"{}\">{}</a></p>",
        escape(text),
        back.0,
        escape(back.1)
    )
}

/// A pairing result asked for again (a reload): it is shown once only.
pub fn already_shown() -> String {
    format!(
        "<div id=\"result\"><p class=\"warn\" id=\"notice\">This pairing code was shown once and \
     is not shown again, so reloading pairs nothing.</p></div>\
     <p>If the phone did not get it, revoke that device and pair again on \
     <a id=\"back\" href=\"{}\">Devices</a>.</p>",
        Route::Devices
    )
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
