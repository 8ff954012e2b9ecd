// Live progress for the runs list and an evaluation page: each element with data-events follows one stream of
// server-sent events and updates the status, the progress bar and the finished count of the evaluation each event
// names (the runs list's row with that data-evaluation, else the element itself). Without JavaScript the pages
// show the same figures as of their loading, with a link to reload.
"use strict";

function follow(element) {
  const url = element.getAttribute("data-events");
  if (!url || typeof EventSource === "undefined") {
    return;
  }
  const source = new EventSource(url);
  let verdicts = 0;
  source.addEventListener("progress", (event) => {
    const progress = JSON.parse(event.data);
    let scope = element;
    if (progress.evaluation_id) {
      const row = element.querySelector('[data-evaluation="' + CSS.escape(progress.evaluation_id) + '"]');
      scope = row || element;
    }
    const field = (name) => scope.querySelector('[data-field="' + name + '"]');
    const counts = progress.counts || {};
    const done = ["done", "unavailable", "cancelled"].reduce((sum, state) => sum + (counts[state] || 0), 0);
    const bar = field("progress");
    if (bar) {
      bar.max = progress.total;
      bar.value = done;
    }
    const shown = field("done");
    if (shown) {
      shown.textContent = String(done);
    }
    const status = field("status");
    if (status) {
      const badge = status.classList.contains("badge") ? status : status.querySelector(".badge");
      if (badge) {
        badge.textContent = progress.status;
        badge.className = "badge " + progress.status;
      }
    }
  });
  source.addEventListener("verdict", () => {
    verdicts += 1;
    const live = element.querySelector('[data-field="live"]');
    const graded = element.querySelector('[data-field="graded"]');
    if (live && graded) {
      live.hidden = false;
      graded.textContent = String(verdicts);
    }
  });
  source.addEventListener("end", () => {
    source.close();
    element.setAttribute("data-ended", "true");
  });
  source.onerror = () => {
    // The browser reconnects by itself; a page whose evaluation ended has closed its source already.
  };
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-events]").forEach(follow);
});
