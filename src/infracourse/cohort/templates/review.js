// infracourse cohort review: the keyboard, and saving each score as it is given (PUT, JSON).
// Learner text is never read into HTML here: the page was escaped by the server; this script only moves
// focus and sends the reviewer's own input.
"use strict";

function queueKeys() {
  const rows = [...document.querySelectorAll("#queue tbody tr")].filter(r => r.querySelector("a"));
  if (!rows.length) return;
  let at = Math.max(0, rows.findIndex(r => r.classList.contains("todo")));
  const select = i => {
    rows[at].classList.remove("selected");
    at = Math.min(rows.length - 1, Math.max(0, i));
    rows[at].classList.add("selected");
    rows[at].scrollIntoView({block: "nearest"});
  };
  select(at);
  document.addEventListener("keydown", e => {
    if (e.key === "j" || e.key === "ArrowDown") { select(at + 1); e.preventDefault(); }
    else if (e.key === "k" || e.key === "ArrowUp") { select(at - 1); e.preventDefault(); }
    else if (e.key === "Enter") { location.href = rows[at].querySelector("a").href; }
  });
}

function rubricKeys(form) {
  const items = [...form.querySelectorAll("fieldset.item")];
  let at = 0;
  const focus = i => {
    items[at].classList.remove("focused");
    at = Math.min(items.length - 1, Math.max(0, i));
    items[at].classList.add("focused");
    items[at].focus({preventScroll: true});
    items[at].scrollIntoView({block: "nearest"});
  };
  const total = () => {
    const points = items.map(f => f.querySelector("input:checked")).filter(Boolean).map(r => Number(r.value));
    const max = document.getElementById("total").textContent.split("/")[1];
    document.getElementById("total").textContent = points.reduce((a, b) => a + b, 0) + "/" + max;
  };
  // One save at a time per item: a second one (the comment, just after the level) waits for the first's
  // reply and sends the score id it returned, or it would be refused as a conflict with the first.
  const save = item => { item.pending = (item.pending || Promise.resolve()).then(() => send(item)); };
  const send = async item => {
    const chosen = item.querySelector("input:checked");
    const state = item.querySelector(".state");
    if (!chosen) { state.textContent = "pick a level first (0-9), then the comment is saved with it"; return; }
    const body = {points: Number(chosen.value), comment: item.querySelector("textarea").value,
                  base: item.dataset.base === "" ? null : Number(item.dataset.base)};
    item.classList.add("unsaved");
    state.textContent = "saving…";
    let reply, data;
    try {
      reply = await fetch(`/api/submissions/${form.dataset.submission}/scores/${item.dataset.item}`,
                          {method: "PUT", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body)});
      data = await reply.json();
    } catch (err) {
      state.textContent = "not saved (" + err + "): your score is still here; press the level again to retry";
      return;
    }
    if (reply.ok) {
      item.dataset.base = data.score.id;
      item.classList.remove("unsaved", "conflict");
      state.textContent = "saved " + data.score.scored_at;
    } else if (reply.status === 409) {
      item.classList.add("conflict");
      state.textContent = "not saved: " + data.error + (data.current ? ` (now ${data.current.points})` : "");
    } else {
      state.textContent = "not saved: " + data.error;
    }
    total();
  };
  items.forEach((item, i) => {
    item.addEventListener("focusin", () => { items[at].classList.remove("focused"); at = i; item.classList.add("focused"); });
    item.querySelectorAll("input").forEach(r => r.addEventListener("change", () => save(item)));
    item.querySelector("textarea").addEventListener("change", () => save(item));
  });
  focus(0);
  document.addEventListener("keydown", e => {
    if (e.target.tagName === "TEXTAREA") {
      if (e.key === "Escape") { e.target.blur(); focus(at); }
      return;
    }
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    const go = id => { const a = document.getElementById(id); if (a) location.href = a.href; };
    if (/^[0-9]$/.test(e.key)) {
      const radios = items[at].querySelectorAll("input[type=radio]");
      const radio = radios[Number(e.key)];
      if (radio) { radio.checked = true; save(items[at]); }
      e.preventDefault();
    } else if (e.key === "ArrowDown" || e.key === "j") { focus(at + 1); e.preventDefault(); }
    else if (e.key === "ArrowUp" || e.key === "k") { focus(at - 1); e.preventDefault(); }
    else if (e.key === "c") { items[at].querySelector("textarea").focus(); e.preventDefault(); }
    else if (e.key === "n") { go("next"); }
    else if (e.key === "p") { go("previous"); }
    else if (e.key === "g") { location.href = "/"; }
    else if (e.key === "?") { const h = document.getElementById("help"); h.hidden = !h.hidden; }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const form = document.getElementById("rubric");
  if (form) rubricKeys(form); else queueKeys();
});
