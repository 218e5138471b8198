// The admin page's only script (served from the box: CSP script-src 'self', nothing inline).
// It shows a passphrase's strength while it is typed, asks before revoking a device,
// refreshes the home page's health, brings a restarting page back, sends a restore or update
// upload and reloads the Update page while an update runs; every other form works without it.
"use strict";
(function () {
  // The meter shows the gateway's own verdict (POST /admin/strength): the very test set-up
  // and the change apply, so the two cannot disagree. Asked once typing pauses.
  document.querySelectorAll("input[data-strength]").forEach(function (input) {
    var meter = document.getElementById(input.dataset.strength);
    var text = document.getElementById(input.dataset.strength + "-text");
    var timer = null;
    var asked = 0;
    function ask() {
      var mine = ++asked;
      fetch("/admin/strength", {
        method: "POST",
        headers: { "X-CSRF-Token": input.dataset.token },
        body: new URLSearchParams({ passphrase: input.value })
      }).then(function (r) {
        return r.json();
      }).then(function (v) {
        if (mine !== asked) return;
        if (meter) meter.value = v.ok ? Math.max(v.score, 3) : Math.min(v.score || 0, 2);
        if (text) text.textContent = v.words;
      }, function () {
        if (mine === asked && text) text.textContent = "Checked when you send the form.";
      });
    }
    input.addEventListener("input", function () {
      if (meter) meter.value = 0;
      clearTimeout(timer);
      timer = setTimeout(ask, 250);
    });
  });
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (e) {
      if (!window.confirm(form.dataset.confirm)) e.preventDefault();
    });
  });
  // The home page's figures, from the JSON beside it (admin/health.rs). Signed out, the JSON's
  // address answers with the sign-in page: `redirected`.
  function health() {
    return fetch("/admin/health.json", { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (r.redirected || !r.ok) throw r;
        return r.json();
      });
  }
  var box = document.getElementById("box-health");
  if (box) {
    window.setInterval(function () {
      health().then(function (h) {
        h.values.forEach(function (v) {
          var el = document.getElementById(v[0]);
          if (el) el.textContent = v[1];
        });
        var list = document.getElementById("problems");
        list.replaceChildren.apply(list, h.problems.map(function (p) {
          var li = document.createElement("li");
          var a = document.createElement("a");
          a.href = p.href;
          a.textContent = p.fix;
          li.append(p.text + " ", a);
          return li;
        }));
        document.getElementById("no-problems").hidden = h.problems.length > 0;
      }, function () {});
    }, Number(box.dataset.every) * 1000);
  }
  // Restarting, rebooting: wait until another start of the gateway answers, then go home.
  var back = document.getElementById("coming-back");
  if (back) {
    window.setInterval(function () {
      health().then(function (h) {
        if (h.instance !== back.dataset.from) window.location.replace("/admin/");
      }, function (r) {
        if (r && r.redirected) window.location.replace("/admin/");
      });
    }, Number(back.dataset.every) * 1000);
  }
  // An update under way: the page reloads itself until it has ended (the gateway restarts in
  // between; a reload that fails is tried again at the next tick).
  var underWay = document.querySelector("[data-reload]");
  if (underWay) {
    window.setTimeout(function () {
      window.location.reload();
    }, Number(underWay.dataset.reload) * 1000);
  }
  // A file upload (a restore, an update): the file goes as the request body, the CSRF token in
  // a header. An upload that started a job answers with its page: the browser goes there. Any
  // other answer is a whole page; only its #result block is shown in `out` (the rest would
  // repeat around it). `done(ok)` follows the answer.
  function sendFile(url, headers, file, out, done) {
    out.textContent = "Uploading\u2026";
    fetch(url, {
      method: "POST",
      headers: headers,
      body: file
    }).then(function (r) {
      if (r.redirected && r.url.indexOf("/admin/job/") >= 0) {
        window.location.assign(r.url);
        return;
      }
      return r.text().then(function (t) {
        var doc = new DOMParser().parseFromString(t, "text/html");
        var result = doc.getElementById("result");
        var said = result ? Array.prototype.map.call(result.querySelectorAll("p"), function (p) {
          return p.textContent;
        }).join(" ") : "";
        out.textContent = said || "The gateway answered HTTP " + r.status + ".";
        out.className = r.ok ? "good" : "bad";
        done(r.ok);
      });
    }, function (err) {
      out.textContent = "The upload failed: " + err;
      out.className = "bad";
    });
  }
  // Update upload, with the owner's two choices in the query; accepted, the page follows the
  // update (it reloads, and keeps reloading while the update is under way).
  var update = document.getElementById("update-form");
  if (update) {
    update.addEventListener("submit", function (e) {
      e.preventDefault();
      var file = document.getElementById("update-file").files[0];
      if (!file) return;
      var q = [];
      if (document.getElementById("update-major").checked) q.push("major=1");
      if (document.getElementById("update-downgrade").checked) q.push("downgrade=1");
      var url = "/admin/update/upload" + (q.length ? "?" + q.join("&") : "");
      sendFile(url, { "X-CSRF-Token": update.dataset.csrf }, file,
        document.getElementById("update-result"), function (ok) {
        if (ok) window.setTimeout(function () { window.location.reload(); }, 3000);
      });
    });
  }
  var restore = document.getElementById("restore-form");
  if (restore) {
    restore.addEventListener("submit", function (e) {
      e.preventDefault();
      var file = document.getElementById("restore-file").files[0];
      if (!file || !window.confirm("Replace everything with this backup?")) return;
      // A scheduled backup's passphrase travels in a header (percent-encoded: a header is
      // Latin-1), never in the address, which logs may keep.
      var headers = { "X-CSRF-Token": restore.dataset.csrf };
      var pass = document.getElementById("restore-upload-passphrase").value;
      if (pass) headers["X-Backup-Passphrase"] = encodeURIComponent(pass);
      sendFile("/admin/backup/restore", headers, file,
        document.getElementById("restore-result"), function () {});
    });
  }
})();
