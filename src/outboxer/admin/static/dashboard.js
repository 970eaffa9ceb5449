// outboxer dashboard: polls the admin API and draws its own SVG charts (no dependencies, no CDN).
// Every value from the server is inserted with textContent, never as markup.
"use strict";

(function () {
  const POLL_MS = Math.max(500, Number(new URLSearchParams(location.search).get("interval")) || 3000);
  const WINDOW = 200; // points kept per chart: 10 minutes at the default interval
  const TOKEN_KEY = "outboxer.adminToken";
  const PAGE = 50;

  const $ = (id) => document.getElementById(id);
  const history = []; // {t, pending, rate, age}
  let previous = null; // last stats sample, for the rate
  let deadLetterCount = null;
  let selected = null;

  // -- API -------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, detail) {
      super(typeof detail === "string" ? detail : JSON.stringify(detail));
      this.status = status;
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method: options.method || "GET",
      headers,
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
    });
    let body = null;
    try { body = await response.json(); } catch (_) { body = null; }
    if (!response.ok) {
      const detail = body && body.detail !== undefined ? body.detail : response.statusText;
      if (response.status === 401 || response.status === 403) askForToken(detail);
      throw new ApiError(response.status, detail);
    }
    return body;
  }

  // A failed action stays on screen until the next action; a failed poll clears itself.
  function showError(error, sticky) {
    const box = $("error");
    if (!error) { box.hidden = true; box.textContent = ""; delete box.dataset.sticky; return; }
    if (sticky) box.dataset.sticky = "1";
    box.textContent = error instanceof ApiError ? `${error.status}: ${error.message}` : String(error);
    box.hidden = false;
  }

  // -- token -----------------------------------------------------------------------------------

  function askForToken(reason) {
    $("token-reason").textContent = typeof reason === "string" ? reason : "The admin API needs a token.";
    $("token-panel").hidden = false;
    $("token-input").focus();
  }

  $("token-button").addEventListener("click", () => askForToken("Enter the admin token of this server."));
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const value = $("token-input").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $("token-input").value = "";
    $("token-panel").hidden = true;
    showError(null);
    refresh();
    loadDeadLetters(true);
  });
  $("token-clear").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token-input").value = "";
  });

  // -- formatting ------------------------------------------------------------------------------

  function seconds(value) {
    if (value === null || value === undefined) return "–";
    if (value < 60) return value.toFixed(1) + " s";
    if (value < 3600) return (value / 60).toFixed(1) + " min";
    return (value / 3600).toFixed(1) + " h";
  }

  function when(iso) {
    if (!iso) return "–";
    const date = new Date(iso);
    return isNaN(date) ? String(iso) : date.toLocaleString();
  }

  function cell(row, text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "–" : String(text);
    if (className) td.className = className;
    row.appendChild(td);
    return td;
  }

  function button(label, className, onClick) {
    const b = document.createElement("button");
    b.type = "button";
    b.textContent = label;
    if (className) b.className = className;
    b.addEventListener("click", (event) => { event.stopPropagation(); onClick(b); });
    return b;
  }

  // -- charts ----------------------------------------------------------------------------------

  const SVG = "http://www.w3.org/2000/svg";

  function svgElement(name, attributes) {
    const element = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attributes)) element.setAttribute(k, String(v));
    return element;
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const power = Math.pow(10, Math.floor(Math.log10(value)));
    for (const step of [1, 2, 2.5, 5, 10]) if (value <= step * power) return step * power;
    return 10 * power;
  }

  function formatTick(value) {
    if (value >= 1e6) return (value / 1e6).toFixed(1) + "M";
    if (value >= 1e3) return (value / 1e3).toFixed(1) + "k";
    if (Number.isInteger(value)) return String(value);
    return String(value < 10 ? Number(value.toFixed(2)) : Number(value.toFixed(1)));
  }

  function drawChart(svg, field) {
    const width = svg.clientWidth || 300;
    const height = svg.clientHeight || 140;
    const left = 40, right = 6, top = 6, bottom = 18;
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const points = history.filter((p) => p[field] !== null && p[field] !== undefined);
    const max = niceMax(Math.max(0, ...points.map((p) => p[field])));
    const now = history.length ? history[history.length - 1].t : Date.now();
    // The x axis covers what has been seen (at least 30 s), up to the rolling window.
    const seen = history.length ? now - history[0].t : 0;
    const span = Math.min(Math.max(seen, 30000), Math.max(POLL_MS * (WINDOW - 1), 30000));
    const x = (t) => left + (width - left - right) * (1 - (now - t) / span);
    const y = (v) => top + (height - top - bottom) * (1 - v / max);
    for (const fraction of [0, 0.5, 1]) {
      const v = max * fraction;
      svg.appendChild(svgElement("line", { class: "grid", x1: left, x2: width - right, y1: y(v), y2: y(v) }));
      const label = svgElement("text", { class: "axis", x: left - 4, y: y(v) + 3, "text-anchor": "end" });
      label.textContent = formatTick(v);
      svg.appendChild(label);
    }
    const start = svgElement("text", { class: "axis", x: left, y: height - 4 });
    start.textContent = span < 120000 ? `−${Math.round(span / 1000)} s` : `−${Math.round(span / 60000)} min`;
    svg.appendChild(start);
    const end = svgElement("text", { class: "axis", x: width - right, y: height - 4, "text-anchor": "end" });
    end.textContent = "now";
    svg.appendChild(end);
    if (!points.length) return;
    const path = points.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${y(p[field]).toFixed(1)}`).join(" ");
    const first = points[0], last = points[points.length - 1];
    const area = `${path} L${x(last.t).toFixed(1)},${y(0)} L${x(first.t).toFixed(1)},${y(0)} Z`;
    svg.appendChild(svgElement("path", { class: "area", d: area }));
    svg.appendChild(svgElement("path", { class: "series", d: path }));
    if (points.length === 1) {
      svg.appendChild(svgElement("circle", { cx: x(last.t), cy: y(last[field]), r: 2.5, fill: "currentColor", class: "series" }));
    }
  }

  function drawCharts() {
    drawChart($("chart-backlog"), "pending");
    drawChart($("chart-rate"), "rate");
    drawChart($("chart-age"), "age");
  }

  // Publish rate: from a cumulative published counter when the server reports one; otherwise
  // the decrease of the backlog (pending + in flight) between two samples, a lower bound that
  // ignores messages written meanwhile.
  function rateFrom(stats, t) {
    let rate = null;
    if (previous) {
      const dt = (t - previous.t) / 1000;
      if (dt > 0) {
        if (typeof stats.published_total === "number" && typeof previous.published_total === "number") {
          rate = Math.max(0, stats.published_total - previous.published_total) / dt;
        } else {
          rate = Math.max(0, previous.backlog - (stats.pending + stats.in_flight)) / dt;
        }
      }
    }
    $("rate-caption").textContent = typeof stats.published_total === "number"
      ? "Publish rate (msg/s)"
      : "Publish rate (msg/s, from backlog decrease)";
    previous = { t, backlog: stats.pending + stats.in_flight, published_total: stats.published_total };
    return rate;
  }

  // -- stats -----------------------------------------------------------------------------------

  function renderStats(stats) {
    const t = Date.now();
    $("pending").textContent = stats.pending;
    $("in_flight").textContent = stats.in_flight;
    $("dead_letters").textContent = stats.dead_letters;
    $("oldest").textContent = seconds(stats.oldest_pending_age_seconds);
    $("relay_count").textContent = stats.relays.length;
    history.push({ t, pending: stats.pending, rate: rateFrom(stats, t), age: stats.oldest_pending_age_seconds || 0 });
    while (history.length > WINDOW) history.shift();
    drawCharts();

    const tbody = $("relays").querySelector("tbody");
    tbody.replaceChildren();
    for (const relay of stats.relays) {
      const row = document.createElement("tr");
      cell(row, relay.relay_id, "id");
      cell(row, relay.hostname);
      cell(row, relay.pid);
      cell(row, relay.in_flight);
      cell(row, when(relay.heartbeat_at));
      tbody.appendChild(row);
    }
    $("no-relays").hidden = stats.relays.length > 0;

    // Shown only while some consumer has failed messages still to re-drive.
    const failing = Object.entries(stats.consume_failures || {});
    const failures = $("consume-failures").querySelector("tbody");
    failures.replaceChildren();
    for (const [consumer, figures] of failing) {
      const row = document.createElement("tr");
      cell(row, consumer, "id");
      cell(row, figures.retrying);
      cell(row, figures.waiting);
      cell(row, seconds(figures.oldest_age_seconds));
      failures.appendChild(row);
    }
    $("consume-failures-panel").hidden = failing.length === 0;

    const sweep = $("sweep");
    sweep.replaceChildren();
    $("no-sweep").hidden = !!stats.last_sweep;
    if (stats.last_sweep) {
      for (const [name, value] of Object.entries(stats.last_sweep)) {
        const dt = document.createElement("dt");
        dt.textContent = name.replace(/_/g, " ");
        const dd = document.createElement("dd");
        dd.textContent = typeof value === "string" && /^\d{4}-\d\d-\d\dT/.test(value) ? when(value)
          : value !== null && typeof value === "object" ? JSON.stringify(value) : String(value);
        sweep.append(dt, dd);
      }
    }
    $("updated").textContent = "updated " + new Date(t).toLocaleTimeString();

    if (deadLetterCount !== null && deadLetterCount !== stats.dead_letters && !deadLetters.cursor) {
      deadLetters.load(true);
    }
    deadLetterCount = stats.dead_letters;
    if (!messages.cursor) messages.load(true); // the first page moves with the backlog
  }

  async function renderReadiness() {
    const pill = $("status");
    try {
      const response = await fetch("readyz", { headers: { Accept: "application/json" } });
      const body = await response.json();
      if (body.ready) {
        pill.dataset.state = "ok";
        pill.textContent = "ready";
        pill.title = "";
      } else {
        const failing = Object.entries(body.checks).filter(([, c]) => !c.ok);
        pill.dataset.state = failing.some(([name]) => name === "database") ? "bad" : "warn";
        pill.textContent = "not ready: " + failing.map(([name]) => name).join(", ");
        pill.title = failing.map(([name, c]) => `${name}: ${c.detail}`).join("\n");
      }
    } catch (error) {
      pill.dataset.state = "bad";
      pill.textContent = "server unreachable";
    }
  }

  async function refresh() {
    renderReadiness();
    try {
      renderStats(await api("api/stats"));
      if (!$("error").dataset.sticky) showError(null);
    } catch (error) {
      showError(error);
    }
  }

  // -- paged lists (dead letters, messages) ----------------------------------------------------

  // A table filled page by page from a list endpoint ({items, next_cursor}); its filter form
  // (text inputs and selects named after the query parameters) replaces the filter on submit.
  function pagedList(path, name, makeRow) {
    const list = { cursor: null, filter: {} };
    const tbody = $(name).querySelector("tbody");
    list.load = async (reset) => {
      if (reset) list.cursor = null;
      const params = new URLSearchParams({ limit: String(PAGE) });
      for (const [k, v] of Object.entries(list.filter)) params.set(k, v);
      if (list.cursor) params.set("cursor", list.cursor);
      let page;
      try {
        page = await api(path + "?" + params.toString());
      } catch (error) {
        showError(error);
        return;
      }
      if (reset) tbody.replaceChildren();
      for (const item of page.items) tbody.appendChild(makeRow(item));
      list.cursor = page.next_cursor;
      $(name + "-more").hidden = !list.cursor;
      $("no-" + name).hidden = tbody.children.length > 0;
    };
    $(name + "-more").addEventListener("click", () => list.load(false));
    $(name + "-filter").addEventListener("submit", (event) => {
      event.preventDefault();
      list.filter = {};
      for (const [k, v] of new FormData(event.target)) {
        const value = String(v).trim();
        if (value) list.filter[k] = value;
      }
      list.load(true);
    });
    return list;
  }

  // -- messages not yet published --------------------------------------------------------------

  const messages = pagedList("api/messages", "messages", (message) => {
    const row = document.createElement("tr");
    cell(row, message.id, "id");
    cell(row, message.topic);
    cell(row, message.type);
    cell(row, message.key);
    const state = cell(row, message.state.replace("_", " "), "state");
    state.dataset.state = message.state;
    cell(row, message.attempts);
    cell(row, message.state === "in_flight" ? "lease until " + when(message.lease_expires_at)
      : when(message.next_attempt_at), "when");
    cell(row, message.relay, "id");
    cell(row, message.last_error, "reason").title = message.last_error || "";
    return row;
  });

  // -- dead letters ----------------------------------------------------------------------------

  const deadLetters = pagedList("api/deadletters", "dead-letters", deadLetterRow);
  const loadDeadLetters = deadLetters.load;

  function deadLetterRow(dead) {
    const row = document.createElement("tr");
    row.dataset.id = dead.id;
    row.dataset.direction = dead.direction;
    if (isSelected(dead.id, dead.direction)) row.className = "selected";
    cell(row, dead.id, "id");
    cell(row, dead.direction);
    cell(row, dead.topic);
    cell(row, dead.type);
    cell(row, dead.key);
    cell(row, dead.attempts);
    cell(row, when(dead.dead_lettered_at), "when");
    cell(row, dead.failure_reason, "reason").title = dead.failure_reason;
    const actionsCell = document.createElement("td");
    const actions = document.createElement("div");
    actions.className = "actions";
    actionsCell.appendChild(actions);
    actions.append(
      button("Inspect", "secondary", () => inspect(dead.id, dead.direction)),
      button("Replay", "", (b) => replay(dead.id, dead.direction, b)),
      button("Delete", "danger", (b) => remove(dead.id, dead.direction, b)),
    );
    row.appendChild(actionsCell);
    return row;
  }

  // An id may have two dead letters (one publish, one consume): a row is the pair.
  function isSelected(id, direction) {
    return selected !== null && selected.id === id && selected.direction === direction;
  }

  async function inspect(id, direction) {
    let dead;
    try {
      dead = await api(oneDeadLetter(id, direction));
    } catch (error) {
      showError(error);
      return;
    }
    selected = { id, direction };
    for (const row of $("dead-letters").querySelectorAll("tbody tr")) {
      row.className = isSelected(row.dataset.id, row.dataset.direction) ? "selected" : "";
    }
    $("detail-id").textContent = dead.id;
    const fields = $("detail-fields");
    fields.replaceChildren();
    for (const name of ["topic", "type", "key", "attempts", "failure_reason", "direction",
      "content_type", "created_at", "dead_lettered_at", "headers"]) {
      const dt = document.createElement("dt");
      dt.textContent = name.replace(/_/g, " ");
      const dd = document.createElement("dd");
      const value = dead[name];
      dd.textContent = name.endsWith("_at") ? when(value)
        : value !== null && typeof value === "object" ? JSON.stringify(value) : (value === null ? "–" : String(value));
      fields.append(dt, dd);
    }
    $("detail-payload").textContent = typeof dead.payload === "string"
      ? dead.payload : JSON.stringify(dead.payload, null, 2);
    $("detail").hidden = false;
    $("detail").scrollIntoView({ block: "nearest" });
  }

  function closeDetail() {
    selected = null;
    $("detail").hidden = true;
  }

  async function afterChange(message) {
    showError(null);
    if (message) {
      $("updated").textContent = message;
    }
    await loadDeadLetters(true);
    await refresh();
  }

  // Each row is one dead letter: its id and direction (an id may have one of each).
  function oneDeadLetter(id, direction, action = "") {
    return "api/deadletters/" + encodeURIComponent(id) + action
      + "?direction=" + encodeURIComponent(direction);
  }

  async function replay(id, direction, control) {
    if (control) control.disabled = true;
    try {
      await api(oneDeadLetter(id, direction, "/replay"), { method: "POST" });
      if (isSelected(id, direction)) closeDetail();
      await afterChange("replayed " + id);
    } catch (error) {
      showError(error, true);
      if (control) control.disabled = false;
    }
  }

  async function remove(id, direction, control) {
    if (!confirm("Delete the " + direction + " dead letter " + id + " for good?")) return;
    if (control) control.disabled = true;
    try {
      await api(oneDeadLetter(id, direction), { method: "DELETE" });
      if (isSelected(id, direction)) closeDetail();
      await afterChange("deleted " + id);
    } catch (error) {
      showError(error, true);
      if (control) control.disabled = false;
    }
  }

  $("detail-replay").addEventListener("click",
    () => selected && replay(selected.id, selected.direction, $("detail-replay")));
  $("detail-delete").addEventListener("click",
    () => selected && remove(selected.id, selected.direction, $("detail-delete")));
  $("detail-close").addEventListener("click", closeDetail);

  $("replay-filtered").addEventListener("click", async () => {
    const filter = deadLetters.filter;
    const body = Object.keys(filter).length ? { ...filter } : { all: true };
    const what = body.all ? "ALL dead letters" : "every dead letter matching " + JSON.stringify(filter);
    if (!confirm("Replay " + what + "?")) return;
    try {
      const result = await api("api/deadletters/replay", { method: "POST", body });
      await afterChange(`replayed ${result.count} dead letter(s)`);
    } catch (error) {
      showError(error, true);
    }
  });

  window.addEventListener("resize", drawCharts);

  refresh();
  loadDeadLetters(true);
  setInterval(refresh, POLL_MS);
})();
