// troth console: live pages. A page whose <main> has data-live listens to /events
// (Server-Sent Events from the server's watch stream) and, on a change, fetches
// itself again and swaps <main>'s content in: unless a form on it is being
// filled in, when it says so instead of throwing the input away.
"use strict";

(function () {
  const goto = document.querySelector("form[data-goto]");
  if (goto) {
    goto.addEventListener("submit", (event) => {
      event.preventDefault();
      const id = goto.elements.id.value.trim();
      if (id) location.href = "/workflows/" + encodeURIComponent(id);
    });
  }

  const main = document.querySelector("main[data-live]");
  if (!main || !window.EventSource) return;
  const note = document.getElementById("live-note");
  const dot = document.getElementById("live-dot");
  let dirty = false;
  let timer = null;
  let busy = false;
  let again = false;

  main.addEventListener("input", () => { dirty = true; });
  main.addEventListener("submit", () => { dirty = true; });

  async function refresh() {
    if (dirty) { note.hidden = false; return; }
    if (busy) { again = true; return; }
    busy = true;
    try {
      const response = await fetch(location.href, { headers: { "X-Troth-Live": "1" } });
      if (!response.ok) return;
      const page = new DOMParser().parseFromString(await response.text(), "text/html");
      const fresh = page.querySelector("main");
      if (fresh && !dirty) {
        main.replaceChildren(...fresh.childNodes);
        document.body.dataset.updated = String(Date.now());
      }
    } finally {
      busy = false;
      if (again) { again = false; schedule(); }
    }
  }

  function schedule() {
    clearTimeout(timer);
    timer = setTimeout(refresh, 150);
  }

  const query = new URLSearchParams();
  if (main.dataset.watchId) query.set("id", main.dataset.watchId);
  if (main.dataset.watchKind) query.set("kind", main.dataset.watchKind);
  const source = new EventSource("/events?" + query.toString());
  source.addEventListener("ready", () => {
    // The watch is in place from now on: re-read the page once, for what changed
    // between its rendering and now (as Client.watch_promises says to).
    dot.classList.add("on");
    document.body.dataset.live = "ready";
    schedule();
  });
  source.addEventListener("promise", schedule);
  source.addEventListener("reload", schedule);
  source.addEventListener("failed", () => { dot.classList.remove("on"); source.close(); });
  source.onerror = () => { dot.classList.remove("on"); };
})();
