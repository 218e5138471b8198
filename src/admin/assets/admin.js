// The admin page's only script (served from the box: CSP script-src 'self', nothing inline).
// It shows a passphrase's strength while it is typed, asks before revoking a device, refreshes
// the home page's health and brings a restarting page back; every form works without it.
"use strict";
(function () {
  // A rough estimate in bits: length times the alphabet the characters come from, with a
  // penalty for repeated characters. Shown only as advice; the gateway enforces the minimum.
  function bits(p) {
    var pool = 0;
    if (/[a-z]/.test(p)) pool += 26;
    if (/[A-Z]/.test(p)) pool += 26;
    if (/[0-9]/.test(p)) pool += 10;
    if (/[^a-zA-Z0-9]/.test(p)) pool += 33;
    var unique = new Set(p).size;
    return Math.round(Math.log2(Math.max(pool, 1)) * Math.min(p.length, unique * 2));
  }
  function words(b, len) {
    if (len < 12) return "too short: at least 12 characters";
    if (b < 50) return "weak";
    if (b < 70) return "fair";
    return "strong";
  }
  document.querySelectorAll("input[data-strength]").forEach(function (input) {
    var meter = document.getElementById(input.dataset.strength);
    var text = document.getElementById(input.dataset.strength + "-text");
    input.addEventListener("input", function () {
      var b = bits(input.value);
      if (meter) meter.value = Math.min(b, 100);
      if (text) text.textContent = words(b, [...input.value].length);
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
  // Restore: the file goes as the request body, the CSRF token in a header.
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
          var main = doc.querySelector("main");
          out.textContent = (r.ok ? "" : "HTTP " + r.status + ": ") + (main ? main.innerText : t);
          out.className = r.ok ? "good" : "bad";
        });
      }, function (err) {
        out.textContent = "The upload failed: " + err;
        out.className = "bad";
      });
    });
  }
})();
