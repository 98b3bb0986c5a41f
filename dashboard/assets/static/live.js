// Live updates: the page listens to the dashboard's event stream (the
// controller's WatchEvents) and, after each burst of events, fetches
// itself again and swaps in the new content. No framework, no build step.
(function () {
  "use strict";
  var indicator = document.getElementById("live");
  var m = location.pathname.match(/^\/jobs\/([^/]+)$/);
  var url = "/events" + (m ? "?job=" + encodeURIComponent(decodeURIComponent(m[1])) : "");
  var pending = null;

  function setLive(on, text) {
    if (!indicator) return;
    indicator.textContent = (on ? "● " : "○ ") + text;
    indicator.className = on ? "live on" : "live";
  }

  function reload() {
    pending = null;
    fetch(location.href, { headers: { "Accept": "text/html" }, cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        var fresh = doc.getElementById("main");
        var main = document.getElementById("main");
        if (fresh && main) main.replaceWith(fresh);
      })
      .catch(function () { /* the next event tries again */ });
  }

  var es = new EventSource(url);
  es.onopen = function () { setLive(true, "live"); };
  es.onerror = function () { setLive(false, "reconnecting"); };
  es.addEventListener("rdzv", function () {
    setLive(true, "live");
    // A failure is a burst of events: reload once it has settled.
    if (pending) clearTimeout(pending);
    pending = setTimeout(reload, 300);
  });
})();
