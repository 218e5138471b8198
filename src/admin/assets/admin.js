// The admin page's only script (served from the box: CSP script-src 'self', nothing inline).
// It shows a passphrase's strength while it is typed, asks before revoking a device,
// refreshes the home page's health, brings a restarting page back and sends a restore upload;
// every other form works without it.
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
  // Restore: the file goes as the request body, the CSRF token in a header. The answer is a
  // whole page; only its #result block is shown here (the rest would repeat around it).
  var restore = document.getElementById("restore-form");
  if (restore) {
    restore.addEventListener("submit", function (e) {
      e.preventDefault();
      var file = document.getElementById("restore-file").files[0];
      var out = document.getElementById("restore-result");
      if (!file || !window.confirm("Replace everything with this backup?")) return;
      out.textContent = "Uploading and checking\u2026";
      fetch("/admin/backup/restore", {
        method: "POST",
        headers: { "X-CSRF-Token": restore.dataset.csrf },
        body: file
      }).then(function (r) {
        return r.text().then(function (t) {
          var doc = new DOMParser().parseFromString(t, "text/html");
          var result = doc.getElementById("result");
          var said = result ? Array.prototype.map.call(result.querySelectorAll("p"), function (p) {
            return p.textContent;
          }).join(" ") : "";
          out.textContent = said || "The gateway answered HTTP " + r.status + ".";
          out.className = r.ok ? "good" : "bad";
        });
      }, function (err) {
        out.textContent = "The upload failed: " + err;
        out.className = "bad";
      });
    });
  }
})();
