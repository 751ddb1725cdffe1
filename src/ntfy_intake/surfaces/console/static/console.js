// ntfy-intake owner console: refresh the page's content in place, say so when it goes stale.
// No framework and no build step (a few lines do what htmx would, under CSP default-src 'self').
// Every few seconds while the tab is visible, once a minute while hidden; a failed or slow
// refresh shows "not updated for N s: the daemon is not answering" until one succeeds.
(function () {
  "use strict";
  var VISIBLE_MS = 5000, HIDDEN_MS = 60000, TIMEOUT_MS = 4000;
  var lastOk = Date.now(), failing = false, timer = null;
  var banner = document.getElementById("stale");
  if (!banner || document.body.dataset.page === "login") { return; }

  function showStale() {
    if (!failing) { banner.hidden = true; return; }
    var secs = Math.round((Date.now() - lastOk) / 1000);
    banner.textContent = "not updated for " + secs + " s: the daemon is not answering";
    banner.hidden = false;
  }

  function editing() {
    var el = document.activeElement;
    return el && el.form && el.tagName !== "BUTTON";
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, document.hidden ? HIDDEN_MS : VISIBLE_MS);
  }

  function refresh() {
    if (editing()) { schedule(); return; }
    var ctrl = new AbortController();
    var cut = setTimeout(function () { ctrl.abort(); }, TIMEOUT_MS);
    fetch(location.href, { credentials: "same-origin", cache: "no-store", signal: ctrl.signal,
                           headers: { "X-Console-Refresh": "1" } })
      .then(function (resp) {
        if (resp.redirected && resp.url.indexOf("/console/login") !== -1) {
          location.assign("/console/login");
          return null;
        }
        if (!resp.ok) { throw new Error("HTTP " + resp.status); }
        return resp.text();
      })
      .then(function (html) {
        if (html === null) { return; }
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("content");
        var here = document.getElementById("content");
        if (fresh && here && !editing()) { here.replaceWith(document.adoptNode(fresh)); }
        if (doc.title) { document.title = doc.title; }
        var pill = doc.getElementById("status-pill"), mine = document.getElementById("status-pill");
        if (pill && mine) { mine.replaceWith(document.adoptNode(pill)); }
        lastOk = Date.now();
        failing = false;
        showStale();
      })
      .catch(function () {
        failing = true;
        showStale();
        document.title = "not answering · " + document.title.replace(/^not answering · /, "");
      })
      .finally(function () { clearTimeout(cut); schedule(); });
  }

  setInterval(showStale, 1000);
  document.addEventListener("visibilitychange", function () { if (!document.hidden) { refresh(); } else { schedule(); } });
  schedule();
})();
