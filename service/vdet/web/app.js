// vdet's operator page: the stream list, a live view with overlays, add/remove/change streams.
// Plain JavaScript, no framework and no build step. Everything comes from the public API; the
// API key travels in headers (REST, the MJPEG fetch) and in the WebSocket subprotocol, never
// in a URL.
"use strict";

const POLL_STREAMS_MS = 1000;
const POLL_GPU_MS = 15000; // placement rarely changes; /metrics grows with streams
const LIVE_FPS = 15; // asked of the server; it caps it at live.max_fps
const LIVE_WIDTH = 960;
const KEPT_RESULTS = 120; // WebSocket results kept to pair with frames
// Frames wait for detection to catch up with them (see "playout" below), at most this long.
const MAX_DELAY_MS = 1500;
const LAG_WINDOW_MS = 3000; // the delay follows the longest wait seen over this long
const MAX_PENDING = 45; // frames received and not shown yet (3 s at 15 fps)
const KEY_STORE = "vdet.apiKey";
const POLL_SHOTS_MS = 3000; // the event snapshots of the stream in the live view
const SHOWN_SHOTS = 6; // the newest, newest first
const REMOVE_ARMED_MS = 4000; // a second click on Remove within this confirms
// Camera tiles: one snapshot.jpg every TILE_STEP_MS across all tiles (a JPEG encode each on
// the server), and each tile at most every TILE_MIN_MS; the stream in focus has the live view.
const TILE_STEP_MS = 250;
const TILE_MIN_MS = 2000;
const POLL_COUNTS_MS = 2000; // zone and line counts of the stream in the live view
const POLL_HISTORY_MS = 5000; // the event history's newest page, while it is shown
const HISTORY_PAGE = 25;

const $ = (sel, root = document) => root.querySelector(sel);

// --- API key and requests ----------------------------------------------------------------

let apiKey = sessionStorage.getItem(KEY_STORE) || localStorage.getItem(KEY_STORE) || "";

function authHeaders(extra = {}) {
  return apiKey ? { ...extra, "X-API-Key": apiKey } : extra;
}

class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : `HTTP ${status}`);
    this.status = status;
    this.detail = detail;
  }
}

async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: authHeaders(), cache: "no-store", signal };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (response.status === 401) {
    askForKey(apiKey ? "The server refused this key." : "");
  }
  if (response.status === 204) return null;
  const data = await response.json().catch(() => null);
  if (!response.ok) throw new ApiError(response.status, data && data.detail);
  return data;
}

function askForKey(message) {
  const dialog = $("#key-dialog");
  $("#key-error").textContent = message;
  if (!dialog.open) dialog.showModal();
}

function setupKeyDialog() {
  $("#key-button").addEventListener("click", () => askForKey(""));
  $("#key-form").addEventListener("submit", () => {
    apiKey = $("#key-input").value.trim();
    $("#key-input").value = "";
    sessionStorage.setItem(KEY_STORE, apiKey);
    if ($("#key-remember").checked) localStorage.setItem(KEY_STORE, apiKey);
    $("#key-dialog").close();
    refreshStreams();
    if (live) openLive(live.id); // reconnect the feeds with the new key
  });
  $("#key-forget").addEventListener("click", () => {
    apiKey = "";
    sessionStorage.removeItem(KEY_STORE);
    localStorage.removeItem(KEY_STORE);
    $("#key-dialog").close();
  });
}

// --- the stream list -----------------------------------------------------------------------

let streams = [];
// The stream list is asked for every second and after each change: an answer older than
// one already shown (a slow poll overtaken by the refresh after a Remove) is not drawn.
let streamsAsked = 0;
let streamsShown = 0;
let autoOpened = false;
let offlineSince = null; // Date the server stopped answering, or null
const countersBefore = new Map(); // id -> {processed, dropped, skipped, at}
const rates = new Map(); // id -> {detect, dropped, skipped}: per second over the last poll
const gpuOf = new Map();

function fmt(value, digits = 1) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

async function refreshStreams() {
  if ($("#key-dialog").open) return; // waiting for the key: no point asking again
  const asked = ++streamsAsked;
  try {
    const data = await api("/v1/streams");
    if (asked < streamsShown) return;
    streamsShown = asked;
    streams = data.streams;
    const now = performance.now();
    for (const s of streams) {
      const st = s.status;
      const counters = {
        processed: st.frames_processed,
        dropped: st.frames_dropped,
        skipped: st.frames_skipped ?? 0,
        at: now,
      };
      const before = countersBefore.get(s.id);
      if (before && now > before.at) {
        const per = (key) => Math.max(0, ((counters[key] - before[key]) * 1000) / (now - before.at));
        rates.set(s.id, { detect: per("processed"), dropped: per("dropped"), skipped: per("skipped") });
      }
      countersBefore.set(s.id, counters);
    }
    $("#streams-error").textContent = "";
    $("#conn").textContent = "";
    setOffline(false);
    renderStreams();
    renderGrid();
    fillStreamChoices();
    if (!autoOpened && !live) {
      // The first stream that is streaming, once; then the operator picks.
      const first = streams.find((s) => s.status.state === "streaming");
      if (first) {
        autoOpened = true;
        openLive(first.id);
      }
    }
  } catch (err) {
    if (asked < streamsShown) return;
    if (err instanceof ApiError) {
      setOffline(false);
      $("#streams-error").textContent = err.message;
    } else {
      setOffline(true);
    }
  }
}

// The server stopped answering: say so, since when, and stop showing states as current.
function setOffline(offline) {
  if (offline === (offlineSince !== null)) return;
  offlineSince = offline ? new Date() : null;
  document.body.classList.toggle("offline", offline);
  $("#offline").hidden = !offline;
  $("#offline-since").textContent = offline ? offlineSince.toLocaleTimeString() : "";
  $("#conn").textContent = offline ? "offline" : "";
  renderStreams();
  renderGrid();
  if (live) $("#live-status").textContent = offline ? "offline: the last frame received" : "";
}

async function refreshGpus() {
  // The GPU each stream runs on is a label of vdet_source_gpu (metrics are always public).
  try {
    const response = await fetch("/metrics", { cache: "no-store" });
    if (!response.ok) return;
    const text = await response.text();
    const pattern = /^vdet_source_gpu\{([^}]*)\} 1(?:\.0)?$/gm;
    gpuOf.clear();
    for (const match of text.matchAll(pattern)) {
      const labels = Object.fromEntries(
        [...match[1].matchAll(/(\w+)="([^"]*)"/g)].map((m) => [m[1], m[2]]),
      );
      if (labels.source) gpuOf.set(labels.source, labels.gpu);
    }
  } catch {
    /* metrics are a nicety here: the list works without them */
  }
}

function cell(row, text, className, label) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  if (label) td.dataset.label = label; // the narrow layout shows it before the value
  return td;
}

function rateAndTotal(rate, total) {
  return rate === undefined ? String(total) : `${fmt(rate)}/s (${total})`;
}

function renderStreams() {
  const body = $("#streams tbody");
  body.replaceChildren();
  $("#streams-empty").hidden = streams.length > 0;
  const now = performance.now();
  for (const s of streams) {
    const st = s.status;
    const r = rates.get(s.id) || {};
    const row = body.insertRow();
    row.dataset.streamId = s.id;
    if (live && live.id === s.id) row.classList.add("selected");
    const idCell = row.insertCell();
    idCell.dataset.label = "id";
    const view = document.createElement("button");
    view.type = "button";
    view.textContent = s.id;
    view.title = `live view of ${s.id}`;
    view.addEventListener("click", () => openLive(s.id));
    idCell.append(view);
    const state = document.createElement("span");
    // Offline, the last state known is not the state now: shown as such.
    state.className = offlineSince ? "state state-unknown" : `state state-${st.state}`;
    state.textContent = offlineSince ? `unknown (was ${st.state})` : st.state;
    const stateCell = row.insertCell();
    stateCell.append(state);
    stateCell.dataset.label = "state";
    cell(row, fmt(st.fps), "num", "source fps");
    cell(row, fmt(r.detect), "num", "detect fps");
    cell(row, rateAndTotal(r.dropped, st.frames_dropped), "num", "dropped");
    cell(row, rateAndTotal(r.skipped, st.frames_skipped ?? 0), "num", "skipped");
    cell(row, String(st.reconnects), "num", "reconnects");
    cell(row, gpuOf.get(s.id) ?? (s.spec.gpu ?? "–"), "", "GPU");
    cell(row, st.pipeline_error || st.last_error || "", "err", "last error");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "danger";
    const armed = (armedRemovals.get(s.id) ?? 0) > now;
    remove.textContent = armed ? "Click again to remove" : "Remove";
    remove.classList.toggle("armed", armed);
    remove.addEventListener("click", () => removeStream(s.id));
    row.insertCell().append(remove);
  }
  if (live) {
    const current = streams.find((s) => s.id === live.id);
    if (current) live.stream = current;
    else closeLive(); // removed, here or elsewhere
  }
}

// id -> until when (performance.now()) a second click removes it. The table is redrawn every
// second: the button's text comes from here, so the confirmation stays visible while armed.
const armedRemovals = new Map();

async function removeStream(id) {
  const now = performance.now();
  if ((armedRemovals.get(id) ?? 0) <= now) {
    armedRemovals.set(id, now + REMOVE_ARMED_MS);
    renderStreams();
    setTimeout(() => {
      if ((armedRemovals.get(id) ?? 0) <= performance.now()) {
        armedRemovals.delete(id);
        renderStreams();
      }
    }, REMOVE_ARMED_MS + 50);
    return;
  }
  armedRemovals.delete(id);
  try {
    await api(`/v1/streams/${encodeURIComponent(id)}`, { method: "DELETE" });
    if (live && live.id === id) closeLive();
  } catch (err) {
    $("#streams-error").textContent = `${id}: ${err.message}`;
  }
  refreshStreams();
}

// --- forms and the API's validation errors -------------------------------------------------

function clearErrors(form) {
  for (const el of form.querySelectorAll("[data-error-for]")) el.textContent = "";
  for (const el of form.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
  form.querySelector("[data-done]").textContent = "";
}

function showError(form, field, message) {
  const slot =
    form.querySelector(`[data-error-for="${field}"]`) || form.querySelector('[data-error-for="_form"]');
  slot.textContent = slot.textContent ? `${slot.textContent}; ${message}` : message;
  const input = form.elements.namedItem(field);
  if (input && input.setAttribute) input.setAttribute("aria-invalid", "true");
}

// Where a sentence-style `detail` belongs (the server's own checks, not pydantic's).
function fieldOfMessage(message, status) {
  const m = message.toLowerCase();
  if (/class/.test(m)) return "classes";
  if (/scheme|url|file|source|host/.test(m)) return "url";
  if (status === 409 && /exist|duplicate|already/.test(m)) return "id";
  return "_form";
}

function showApiErrors(form, err) {
  if (!(err instanceof ApiError)) {
    showError(form, "_form", "server unreachable");
    return;
  }
  if (Array.isArray(err.detail)) {
    // FastAPI's request validation: [{loc: ["body", field, ...], msg}, ...]
    for (const issue of err.detail) {
      const loc = issue.loc || [];
      const field = loc[0] === "body" && loc.length > 1 ? String(loc[1]) : "_form";
      showError(form, field, issue.msg);
    }
  } else {
    showError(form, fieldOfMessage(err.message, err.status), err.message);
  }
}

function numberOrNull(value) {
  return value === "" ? null : Number(value);
}

function classesOrNull(value) {
  const names = value.split(",").map((s) => s.trim()).filter(Boolean);
  return names.length ? names.map((n) => (/^\d+$/.test(n) ? Number(n) : n)) : null;
}

function setupAddForm() {
  const form = $("#add-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    clearErrors(form);
    const f = form.elements;
    const body = {
      id: f.namedItem("id").value.trim(),
      url: f.namedItem("url").value.trim(),
      loop: f.namedItem("loop").checked,
    };
    const conf = numberOrNull(f.conf_threshold.value);
    const iou = numberOrNull(f.iou_threshold.value);
    const classes = classesOrNull(f.classes.value);
    const detectFps = numberOrNull(f.detect_fps.value);
    if (conf !== null) body.conf_threshold = conf;
    if (detectFps !== null) body.detect_fps = detectFps;
    if (iou !== null) body.iou_threshold = iou;
    if (classes !== null) body.classes = classes;
    try {
      await api("/v1/streams", { method: "POST", body });
      form.querySelector("[data-done]").textContent = `added ${body.id}`;
      form.reset();
      refreshStreams();
    } catch (err) {
      showApiErrors(form, err);
    }
  });
}

function setupParamsForm() {
  const form = $("#params-form");
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!live) return;
    clearErrors(form);
    const f = form.elements;
    const patch = {
      conf_threshold: numberOrNull(f.conf_threshold.value),
      iou_threshold: numberOrNull(f.iou_threshold.value),
      max_det: numberOrNull(f.max_det.value),
      classes: classesOrNull(f.classes.value),
      detect_fps: numberOrNull(f.detect_fps.value),
    };
    try {
      const updated = await api(`/v1/streams/${encodeURIComponent(live.id)}`, {
        method: "PATCH",
        body: patch,
      });
      live.stream = updated;
      fillParams(updated);
      form.querySelector("[data-done]").textContent = "applied";
    } catch (err) {
      showApiErrors(form, err);
    }
  });
}

function fillParams(stream) {
  const f = $("#params-form").elements;
  const e = stream.effective;
  f.conf_threshold.value = e.conf_threshold;
  f.iou_threshold.value = e.iou_threshold;
  f.max_det.value = e.max_det;
  f.classes.value = e.classes ? e.classes.join(", ") : "";
  f.detect_fps.value = stream.spec.detect_fps ?? "";
}

// --- the live view ----------------------------------------------------------------------------

let live = null; // {id, stream, abort, ws, results: Map(seq -> result), frame, pending, ...}

function closeLive() {
  if (!live) return;
  live.closed = true;
  live.abort.abort();
  if (live.ws) live.ws.close(1000);
  cancelAnimationFrame(live.raf);
  if (live.frame) live.frame.bitmap.close();
  for (const frame of live.pending) frame.bitmap.close();
  clearTimeout(live.shotsTimer);
  clearTimeout(live.countsTimer);
  showShots(live, []);
  live = null;
  $("#live-section").hidden = true;
  renderStreams();
  renderGrid();
}

function openLive(id) {
  closeLive();
  const stream = streams.find((s) => s.id === id);
  live = {
    id,
    stream,
    abort: new AbortController(),
    ws: null,
    results: new Map(),
    lastSeq: null,
    newestResultIndex: -1, // the highest frame_index of any result received
    frame: null, // the frame shown
    pending: [], // frames received, waiting for their turn (oldest first)
    delay: 0, // ms each frame is held after it arrives, so that its detections have come
    lags: [], // [when, ms a frame waited for detection to reach it]
    shown: 0,
    shownSince: performance.now(),
    drawnSeq: null,
    raf: 0,
    zones: [],
    drawn: [],
    labels: [],
    shots: new Map(), // url -> {figure, objectUrl}: event snapshots shown
    shotsTimer: 0,
    counts: null, // GET /v1/streams/{id}/counts
    countsTimer: 0,
    closed: false,
  };
  $("#live-section").hidden = false;
  $("#live-id").textContent = id;
  $("#live-fps").textContent = "";
  $("#live-status").textContent = "waiting for frames…";
  clearErrors($("#params-form"));
  if (stream) fillParams(stream);
  renderStreams();
  const view = live;
  connectEvents(view);
  readVideo(view);
  loadZones(view).then(() => renderZones(view));
  loadShots(view);
  loadCounts(view);
  resetEditor();
  renderGrid();
  view.raf = requestAnimationFrame(() => playout(view));
}

// --- event snapshots ---------------------------------------------------------------------

// The JPEGs the server kept of the frames with zone and line events: polled, the newest few
// shown, each fetched once with the key in a header (an <img src> could not send it).
async function loadShots(view) {
  if (view.closed) return;
  try {
    const data = await api(`/v1/streams/${encodeURIComponent(view.id)}/snapshots`, {
      signal: view.abort.signal,
    });
    const newest = data.snapshots.slice(-SHOWN_SHOTS).reverse();
    await showShots(view, newest);
    $("#shots-count").textContent = data.kept ? `(${data.kept} since the stream started)` : "";
  } catch {
    // The stream went away or the server is restarting: the next poll tells.
  }
  if (!view.closed) view.shotsTimer = setTimeout(() => loadShots(view), POLL_SHOTS_MS);
}

async function showShots(view, snapshots) {
  const wanted = new Set(snapshots.map((s) => s.url));
  for (const [url, shown] of view.shots) {
    if (wanted.has(url)) continue;
    shown.figure.remove();
    URL.revokeObjectURL(shown.objectUrl);
    view.shots.delete(url);
  }
  const box = $("#shots");
  for (const snap of snapshots) {
    if (view.shots.has(snap.url)) continue;
    const response = await fetch(snap.url, { headers: authHeaders(), signal: view.abort.signal });
    if (!response.ok || view.closed) continue; // no longer kept: gone from the next listing
    const objectUrl = URL.createObjectURL(await response.blob());
    const figure = document.createElement("figure");
    const img = document.createElement("img");
    img.src = objectUrl;
    img.alt = `frame ${snap.frame_index}`;
    img.width = snap.width;
    img.height = snap.height;
    const caption = document.createElement("figcaption");
    const when = new Date(snap.arrival_time * 1000).toLocaleTimeString();
    const what = snap.events.map((e) => `${e.type} ${e.zone} (${e.class_name} #${e.track_id})`);
    caption.textContent = `${when}: ${what.join(", ")}`;
    figure.append(img, caption);
    view.shots.set(snap.url, { figure, objectUrl });
  }
  // Newest first, in the listing's order.
  for (const snap of snapshots) {
    const shown = view.shots.get(snap.url);
    if (shown) box.append(shown.figure);
  }
  $("#shots-empty").hidden = view.shots.size > 0;
}

function connectEvents(view) {
  if (view.closed) return;
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const after = view.lastSeq === null ? "" : `?after=${view.lastSeq}`;
  const protocols = apiKey ? ["vdet.v1", `vdet.api-key.${apiKey}`] : ["vdet.v1"];
  const url = `${scheme}//${location.host}/v1/streams/${encodeURIComponent(view.id)}/events${after}`;
  let ws;
  try {
    ws = new WebSocket(url, protocols);
  } catch {
    // A key with characters a subprotocol cannot carry (spaces, commas, ...).
    $("#live-status").textContent = "this API key cannot be sent on a WebSocket";
    return;
  }
  view.ws = ws;
  let ended = false;
  ws.addEventListener("message", (event) => {
    const message = JSON.parse(event.data);
    if (message.type === "result") {
      const result = message.result;
      view.lastSeq = result.seq;
      view.results.set(result.seq, result);
      if (view.results.size > KEPT_RESULTS) {
        view.results.delete(view.results.keys().next().value);
      }
      if (result.frame_index > view.newestResultIndex) {
        view.newestResultIndex = result.frame_index;
        const now = performance.now();
        for (const frame of view.pending) {
          if (frame.coveredAt === null && frame.index <= result.frame_index) {
            frame.coveredAt = now;
            noteLag(view, now, now - frame.receivedAt);
          }
        }
      }
    } else if (message.type === "stream_removed") {
      ended = true;
    }
  });
  ws.addEventListener("close", () => {
    if (!ended && !view.closed && view.ws === ws) setTimeout(() => connectEvents(view), 1000);
  });
}

async function loadZones(view) {
  // Zones and lines, where the server has them; a server without the endpoint draws none.
  try {
    const response = await fetch(`/v1/streams/${encodeURIComponent(view.id)}/zones`, {
      headers: authHeaders(),
      cache: "no-store",
    });
    if (response.ok) {
      const data = await response.json();
      view.zones = Array.isArray(data.zones) ? data.zones : [];
    }
  } catch {
    view.zones = [];
  }
}

function indexOf(haystack, needle, from) {
  outer: for (let i = from; i <= haystack.length - needle.length; i++) {
    for (let j = 0; j < needle.length; j++) if (haystack[i + j] !== needle[j]) continue outer;
    return i;
  }
  return -1;
}

const CRLF2 = new TextEncoder().encode("\r\n\r\n");

// multipart/x-mixed-replace over fetch(), so the key can go in a header: parse each part's
// headers, take Content-Length bytes of JPEG, repeat.
async function readVideo(view) {
  const query = `fps=${LIVE_FPS}&boxes=false&max_width=${LIVE_WIDTH}`;
  const url = `/v1/streams/${encodeURIComponent(view.id)}/live.mjpeg?${query}`;
  let response;
  try {
    response = await fetch(url, { headers: authHeaders(), signal: view.abort.signal });
  } catch {
    if (!view.closed) setTimeout(() => readVideo(view), 2000);
    return;
  }
  if (!response.ok) {
    const data = await response.json().catch(() => null);
    $("#live-status").textContent = `live video: ${(data && data.detail) || response.status}`;
    if (response.status === 401) askForKey("");
    if (response.status === 503 && !view.closed) setTimeout(() => readVideo(view), 5000);
    return;
  }
  const reader = response.body.getReader();
  let buffer = new Uint8Array(0);
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      const joined = new Uint8Array(buffer.length + value.length);
      joined.set(buffer);
      joined.set(value, buffer.length);
      buffer = joined;
      for (;;) {
        const headEnd = indexOf(buffer, CRLF2, 0);
        if (headEnd < 0) break;
        const head = new TextDecoder().decode(buffer.subarray(0, headEnd));
        const headers = {};
        for (const line of head.split("\r\n")) {
          const colon = line.indexOf(":");
          if (colon > 0) headers[line.slice(0, colon).trim().toLowerCase()] = line.slice(colon + 1).trim();
        }
        const length = Number(headers["content-length"]);
        const start = headEnd + CRLF2.length;
        if (!(length > 0) || buffer.length < start + length) break;
        const jpeg = buffer.slice(start, start + length);
        buffer = buffer.slice(start + length);
        const seq = Number(headers["x-vdet-seq"]);
        const index = Number(headers["x-vdet-frame"]);
        const resultIndex = Number(headers["x-vdet-result-frame"]);
        const [sw, sh] = (headers["x-vdet-source-size"] || "").split("x").map(Number);
        const bitmap = await createImageBitmap(new Blob([jpeg], { type: "image/jpeg" }));
        if (view.closed) {
          bitmap.close();
          return;
        }
        const last = view.pending.length ? view.pending[view.pending.length - 1] : view.frame;
        if (last && index < last.index) {
          // Frame numbers went back: the stream was removed and added again. Its results
          // start over too.
          view.newestResultIndex = -1;
          view.results.clear();
        }
        const now = performance.now();
        const covered = index <= view.newestResultIndex;
        view.pending.push({
          bitmap,
          seq,
          index,
          resultIndex,
          sourceWidth: sw || bitmap.width,
          sourceHeight: sh || bitmap.height,
          receivedAt: now,
          coveredAt: covered ? now : null,
        });
        if (covered) noteLag(view, now, 0);
        while (view.pending.length > MAX_PENDING) view.pending.shift().bitmap.close();
      }
    }
  } catch {
    /* aborted or the connection dropped: reconnect below unless closed */
  }
  if (!view.closed) setTimeout(() => readVideo(view), 1000);
}

// Playout. The server sends the newest decoded frame; detection finishes a frame some time
// later (on a CPU, a few hundred ms). Drawn at once, a frame would get boxes detected several
// frames before it, trailing every moving object. So each frame is held until a result of
// it or of a later frame has arrived ("covered"), then shown with the newest result of a
// frame at or before it: the boxes are then at most one detection interval older than the
// picture, and the video runs that much behind live. To keep the frames' own cadence, every
// frame is held the same time: the longest wait for detection seen in the last few seconds.
function noteLag(view, now, lag) {
  view.lags.push([now, lag]);
  while (view.lags.length && view.lags[0][0] < now - LAG_WINDOW_MS) view.lags.shift();
  const longest = Math.max(...view.lags.map(([, l]) => l));
  view.delay = Math.min(MAX_DELAY_MS, longest);
}

function playout(view) {
  if (view.closed) return;
  const now = performance.now();
  let next = null;
  while (view.pending.length) {
    const frame = view.pending[0];
    const due = frame.receivedAt + view.delay <= now;
    const ready = frame.coveredAt !== null || now - frame.receivedAt >= MAX_DELAY_MS;
    if (!due || !ready) break;
    view.pending.shift();
    if (next) next.bitmap.close(); // two due at once: show the later one
    next = frame;
  }
  if (next) {
    if (view.frame) view.frame.bitmap.close();
    view.frame = next;
    view.shown += 1;
    draw(view);
  } else if (view.frame) {
    const result = resultFor(view, view.frame);
    if (result && result.seq !== view.drawnSeq) draw(view); // a result came in late
  }
  if (now - view.shownSince >= 1000) {
    view.fps = (view.shown * 1000) / (now - view.shownSince);
    $("#live-fps").textContent = `${view.fps.toFixed(1)} fps`;
    $("#live").dataset.fps = view.fps.toFixed(2);
    view.shown = 0;
    view.shownSince = now;
  }
  view.raf = requestAnimationFrame(() => playout(view));
}

function classColour(classId) {
  // The server's snapshot colours: hue (classId * 47) mod 180 on OpenCV's 0-180 scale.
  return `hsl(${((classId * 47) % 180) * 2} 100% 55%)`;
}

// The newest result detected on this frame or before it; else the one the server paired it
// with (X-Vdet-Seq), when the feed has it.
function resultFor(view, frame) {
  let best = null;
  for (const r of view.results.values()) {
    if (r.frame_index <= frame.index && (!best || r.frame_index > best.frame_index)) best = r;
  }
  return best || view.results.get(frame.seq) || null;
}

function draw(view) {
  const canvas = $("#live");
  const frame = view.frame;
  if (!frame) return;
  if (canvas.width !== frame.bitmap.width || canvas.height !== frame.bitmap.height) {
    canvas.width = frame.bitmap.width;
    canvas.height = frame.bitmap.height;
  }
  const ctx = canvas.getContext("2d");
  ctx.drawImage(frame.bitmap, 0, 0);
  const sx = canvas.width / frame.sourceWidth;
  const sy = canvas.height / frame.sourceHeight;
  drawZones(ctx, view.zones, frame, sx, sy);
  drawEditor(ctx, canvas);
  const result = resultFor(view, frame);
  const detections = result ? result.detections : [];
  const lineWidth = Math.max(2, Math.round(canvas.width / 400));
  ctx.lineWidth = lineWidth;
  ctx.font = `${Math.max(12, Math.round(canvas.width / 70))}px system-ui, sans-serif`;
  ctx.textBaseline = "bottom";
  const labels = [];
  for (const d of detections) {
    const [x1, y1, x2, y2] = d.box;
    const colour = classColour(d.class_id);
    ctx.strokeStyle = colour;
    ctx.strokeRect(x1 * sx, y1 * sy, (x2 - x1) * sx, (y2 - y1) * sy);
    const track = d.track_id === null || d.track_id === undefined ? "" : ` #${d.track_id}`;
    const label = `${d.class_name} ${d.score.toFixed(2)}${track}`;
    labels.push(label);
    const width = ctx.measureText(label).width + 6;
    const height = parseInt(ctx.font, 10) + 4;
    const top = y1 * sy - height >= 0 ? y1 * sy - height : y1 * sy;
    ctx.fillStyle = colour;
    ctx.fillRect(x1 * sx, top, width, height);
    ctx.fillStyle = "#000";
    ctx.fillText(label, x1 * sx + 3, top + height - 2);
  }
  view.drawn = detections;
  view.drawnSeq = result ? result.seq : null;
  view.labels = labels;
  canvas.dataset.seq = String(result ? result.seq : frame.seq);
  canvas.dataset.frame = String(frame.index);
  canvas.dataset.boxes = String(detections.length);
  const older = result ? frame.index - result.frame_index : 0;
  const boxesOf = older > 0 ? `, boxes of ${older} frame(s) before` : "";
  const behind = `, shown ${Math.round(view.delay)} ms behind live`;
  canvas.dataset.delay = String(Math.round(view.delay));
  canvas.dataset.older = String(older);
  $("#live-status").textContent = result
    ? `frame ${frame.index} (seq ${result.seq}${boxesOf}${behind}): ${detections.length} detection(s)`
    : `frame ${frame.index}${behind}`;
}

function drawZones(ctx, zones, frame, sx, sy) {
  ctx.save();
  ctx.lineWidth = 2;
  ctx.setLineDash([8, 6]);
  ctx.strokeStyle = "rgb(255 255 255 / 85%)";
  ctx.fillStyle = "rgb(255 255 255 / 12%)";
  for (const zone of zones) {
    const points = Array.isArray(zone.points) ? zone.points : [];
    if (points.length < 2) continue;
    const kx = (zone.normalized ? frame.sourceWidth : 1) * sx;
    const ky = (zone.normalized ? frame.sourceHeight : 1) * sy;
    const mask = zone.kind === "mask"; // detections inside are dropped: shown shaded dark
    ctx.beginPath();
    points.forEach(([x, y], i) => (i ? ctx.lineTo(x * kx, y * ky) : ctx.moveTo(x * kx, y * ky)));
    if (zone.kind === "polygon" || mask) {
      ctx.closePath();
      ctx.fillStyle = mask ? "rgb(0 0 0 / 45%)" : "rgb(255 255 255 / 12%)";
      ctx.fill();
    }
    ctx.stroke();
    if (zone.id) {
      ctx.fillStyle = "#fff";
      ctx.fillText(String(zone.id), points[0][0] * kx + 4, points[0][1] * ky - 4);
    }
  }
  ctx.restore();
}

// --- the camera grid ---------------------------------------------------------------------

// One tile per stream: its latest frame (snapshot.jpg, with its boxes, fetched with the key in
// a header), refreshed at a low rate: one snapshot every TILE_STEP_MS over all tiles, each at
// most every TILE_MIN_MS. The stream in focus is the live view below; its tile says so.
const tiles = new Map(); // id -> {figure, img, caption, objectUrl, fetchedAt}
let tileTurn = 0;

function renderGrid() {
  const grid = $("#grid");
  $("#grid-section").hidden = streams.length === 0;
  const ids = new Set(streams.map((s) => s.id));
  for (const [id, tile] of tiles) {
    if (ids.has(id)) continue;
    tile.figure.remove();
    if (tile.objectUrl) URL.revokeObjectURL(tile.objectUrl);
    tiles.delete(id);
  }
  for (const s of streams) {
    let tile = tiles.get(s.id);
    if (!tile) {
      const figure = document.createElement("figure");
      figure.className = "tile";
      figure.dataset.streamId = s.id;
      figure.tabIndex = 0;
      const img = document.createElement("img");
      img.alt = ""; // the caption names it; no broken-image text before the first frame
      const caption = document.createElement("figcaption");
      figure.append(img, caption);
      const focus = () => {
        openLive(s.id);
        $("#live-section").scrollIntoView({ behavior: "smooth", block: "start" });
      };
      figure.addEventListener("click", focus);
      figure.addEventListener("keydown", (e) => (e.key === "Enter" ? focus() : null));
      tile = { figure, img, caption, objectUrl: null, fetchedAt: 0 };
      tiles.set(s.id, tile);
    }
    grid.append(tile.figure); // in the list's order
    const state = offlineSince ? "unknown" : s.status.state;
    const r = rates.get(s.id) || {};
    const focused = live && live.id === s.id;
    tile.figure.classList.toggle("focused", Boolean(focused));
    tile.figure.dataset.state = state;
    tile.caption.textContent = `${s.id} · ${state}${r.detect ? ` · ${fmt(r.detect)} fps` : ""}${
      focused ? " · live below" : ""
    }`;
  }
  $("#grid-note").textContent = streams.length
    ? `(a frame every ${(Math.max(TILE_MIN_MS, streams.length * TILE_STEP_MS) / 1000).toFixed(1)} s; click for live video)`
    : "";
}

async function refreshTile() {
  const ids = [...tiles.keys()];
  if (ids.length && !offlineSince && !$("#key-dialog").open) {
    for (let tried = 0; tried < ids.length; tried++) {
      const id = ids[tileTurn++ % ids.length];
      const tile = tiles.get(id);
      const stream = streams.find((s) => s.id === id);
      const now = performance.now();
      if (!tile || !stream || now - tile.fetchedAt < TILE_MIN_MS) continue;
      if (stream.status.state !== "streaming" && tile.objectUrl) continue; // keep the last
      tile.fetchedAt = now;
      try {
        const response = await fetch(`/v1/streams/${encodeURIComponent(id)}/snapshot.jpg`, {
          headers: authHeaders(),
          cache: "no-store",
        });
        if (response.ok) {
          const objectUrl = URL.createObjectURL(await response.blob());
          if (tile.objectUrl) URL.revokeObjectURL(tile.objectUrl);
          tile.objectUrl = objectUrl;
          tile.img.src = objectUrl;
        }
      } catch {
        /* the next poll of the list tells whether the server is there */
      }
      break;
    }
  }
  setTimeout(refreshTile, TILE_STEP_MS);
}

// --- zones, lines and masks: the editor on the live view ---------------------------------

const editor = { drawing: false, kind: "polygon", id: "", points: [] }; // points: 0..1

function resetEditor() {
  editor.drawing = false;
  editor.points = [];
  $("#zone-draw").disabled = false;
  $("#zone-save").disabled = true;
  $("#zone-cancel").disabled = true;
  $("#live").classList.remove("drawing");
  if (live && live.frame) draw(live);
}

function setupEditor() {
  $("#zone-draw").addEventListener("click", () => {
    $("#zone-error").textContent = "";
    $("#zone-done").textContent = "";
    const id = $("#zone-id").value.trim();
    if (!id) {
      $("#zone-error").textContent = "give the zone an id first";
      return;
    }
    editor.drawing = true;
    editor.kind = $("#zone-kind").value;
    editor.id = id;
    editor.points = [];
    $("#zone-draw").disabled = true;
    $("#zone-cancel").disabled = false;
    $("#live").classList.add("drawing");
  });
  $("#zone-cancel").addEventListener("click", resetEditor);
  $("#zone-save").addEventListener("click", saveZone);
  $("#live").addEventListener("click", (event) => {
    if (!editor.drawing || !live) return;
    const box = event.currentTarget.getBoundingClientRect();
    const x = Math.min(1, Math.max(0, (event.clientX - box.left) / box.width));
    const y = Math.min(1, Math.max(0, (event.clientY - box.top) / box.height));
    editor.points.push([Number(x.toFixed(4)), Number(y.toFixed(4))]);
    const enough = editor.kind === "line" ? 2 : 3;
    $("#zone-save").disabled = editor.points.length < enough;
    if (editor.kind === "line" && editor.points.length === 2) {
      editor.drawing = false; // a line is two points: done
      $("#live").classList.remove("drawing");
    }
    if (live.frame) draw(live);
  });
}

async function saveZone() {
  if (!live) return;
  $("#zone-error").textContent = "";
  const body = { kind: editor.kind, points: editor.points, normalized: true };
  const classes = classesOrNull($("#zone-classes").value);
  if (classes !== null) body.classes = classes;
  const path = `/v1/streams/${encodeURIComponent(live.id)}/zones/${encodeURIComponent(editor.id)}`;
  try {
    await api(path, { method: "PUT", body });
    $("#zone-done").textContent = `saved ${editor.id}`;
    resetEditor();
    await loadZones(live);
    renderZones(live);
  } catch (err) {
    $("#zone-error").textContent = apiErrorText(err);
  }
}

async function deleteZone(view, zoneId) {
  try {
    await api(`/v1/streams/${encodeURIComponent(view.id)}/zones/${encodeURIComponent(zoneId)}`, {
      method: "DELETE",
    });
    await loadZones(view);
    renderZones(view);
  } catch (err) {
    $("#zone-error").textContent = apiErrorText(err);
  }
}

function apiErrorText(err) {
  if (!(err instanceof ApiError)) return "server unreachable";
  if (Array.isArray(err.detail)) {
    return err.detail.map((d) => `${(d.loc || []).slice(1).join(".") || "zone"}: ${d.msg}`).join("; ");
  }
  return err.message;
}

function countsText(zone, counts) {
  const byClass = (map) =>
    Object.entries(map || {})
      .map(([name, n]) => `${name} ${n}`)
      .join(", ") || "0";
  if (zone.kind === "line") {
    const line = (counts.crossings || {})[zone.id] || {};
    return `in: ${byClass(line.in)} · out: ${byClass(line.out)}`;
  }
  if (zone.kind === "mask") return "–";
  return byClass((counts.objects || {})[zone.id]);
}

function renderZones(view) {
  const body = $("#zones tbody");
  body.replaceChildren();
  for (const zone of view.zones) {
    const row = body.insertRow();
    row.dataset.zoneId = zone.id;
    cell(row, zone.id, "", "zone");
    cell(row, zone.kind, "", "kind");
    cell(row, countsText(zone, view.counts || {}), "num", "counts");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "danger";
    remove.textContent = "Delete";
    remove.addEventListener("click", () => deleteZone(view, zone.id));
    row.insertCell().append(remove);
  }
  $("#zones").hidden = view.zones.length === 0;
}

async function loadCounts(view) {
  if (view.closed) return;
  try {
    view.counts = await api(`/v1/streams/${encodeURIComponent(view.id)}/counts`, {
      signal: view.abort.signal,
    });
    renderZones(view);
  } catch {
    /* gone or restarting: the next poll tells */
  }
  if (!view.closed) view.countsTimer = setTimeout(() => loadCounts(view), POLL_COUNTS_MS);
}

function drawEditor(ctx, canvas) {
  if (!editor.points.length) return;
  ctx.save();
  ctx.lineWidth = 3;
  ctx.strokeStyle = "#ffd400";
  ctx.fillStyle = "rgb(255 212 0 / 20%)";
  ctx.beginPath();
  editor.points.forEach(([x, y], i) =>
    i ? ctx.lineTo(x * canvas.width, y * canvas.height) : ctx.moveTo(x * canvas.width, y * canvas.height),
  );
  if (editor.kind !== "line" && editor.points.length > 2) {
    ctx.closePath();
    ctx.fill();
  }
  ctx.stroke();
  for (const [x, y] of editor.points) {
    ctx.beginPath();
    ctx.arc(x * canvas.width, y * canvas.height, 5, 0, 2 * Math.PI);
    ctx.fillStyle = "#ffd400";
    ctx.fill();
  }
  ctx.restore();
}

// --- the event history -------------------------------------------------------------------

// `asked` counts the pages asked for: a page that comes back after a later one was asked
// for (the newest page's poll, answered after a click on "older") is dropped, not shown.
const historyState = { before: null, cursors: [], timer: 0, shots: [], asked: 0 };

function fillStreamChoices() {
  const select = $("#history-form").elements.namedItem("stream");
  const chosen = select.value;
  const ids = streams.map((s) => s.id);
  const have = [...select.options].slice(1).map((o) => o.value);
  if (ids.join("\n") === have.join("\n")) return;
  select.replaceChildren(new Option("all", ""), ...ids.map((id) => new Option(id, id)));
  select.value = ids.includes(chosen) ? chosen : "";
}

function historyQuery() {
  const f = $("#history-form").elements;
  const params = new URLSearchParams({ limit: String(HISTORY_PAGE) });
  for (const name of ["stream", "zone", "type", "class_name"]) {
    const value = f.namedItem(name).value.trim();
    if (value) params.set(name, value);
  }
  const since = f.namedItem("since").value;
  if (since) params.set("since", String(new Date(since).getTime() / 1000));
  if (historyState.before !== null) params.set("before_id", String(historyState.before));
  return params;
}

async function loadHistory() {
  clearTimeout(historyState.timer);
  const asked = ++historyState.asked;
  try {
    const page = await api(`/v1/events/history?${historyQuery()}`);
    if (asked !== historyState.asked) return;
    $("#history-error").textContent = "";
    renderHistory(page);
  } catch (err) {
    if (asked !== historyState.asked) return;
    $("#history-error").textContent = apiErrorText(err);
  }
  // The newest page follows new events; an older page stays as it is.
  if (historyState.before === null) historyState.timer = setTimeout(loadHistory, POLL_HISTORY_MS);
}

function renderHistory(page) {
  for (const url of historyState.shots) URL.revokeObjectURL(url);
  historyState.shots = [];
  const body = $("#history tbody");
  body.replaceChildren();
  for (const e of page.events) {
    const row = body.insertRow();
    row.dataset.eventId = String(e.id);
    row.dataset.time = String(e.time);
    cell(row, new Date(e.time * 1000).toLocaleString(), "num", "time");
    cell(row, e.source_id, "", "stream");
    const what = e.type === "line_cross" ? `line_cross ${e.direction}` : e.type;
    cell(row, e.dwell_s === null ? what : `${what} (${e.dwell_s.toFixed(1)} s inside)`, "", "event");
    cell(row, e.zone, "", "zone");
    cell(row, e.class_name, "", "class");
    cell(row, `#${e.track_id}`, "num", "track");
    const shot = row.insertCell();
    shot.dataset.label = "snapshot";
    const show = document.createElement("button");
    show.type = "button";
    show.textContent = "show";
    show.addEventListener("click", async () => {
      const response = await fetch(e.snapshot, { headers: authHeaders() }).catch(() => null);
      if (!response || !response.ok) {
        shot.textContent = "no longer kept";
        return;
      }
      const url = URL.createObjectURL(await response.blob());
      historyState.shots.push(url);
      const img = document.createElement("img");
      img.src = url;
      img.alt = `frame ${e.frame_index} of ${e.source_id}`;
      img.className = "thumb";
      shot.replaceChildren(img);
    });
    shot.append(show);
    const clipCell = row.insertCell();
    clipCell.dataset.label = "clip";
    const play = document.createElement("button");
    play.type = "button";
    play.textContent = "play";
    play.addEventListener("click", () => playClipOf(e, clipCell));
    clipCell.append(play);
  }
  $("#history-empty").hidden = page.events.length > 0;
  $("#history-older").disabled = page.next_before_id === null;
  $("#history-older").dataset.next = page.next_before_id ?? "";
  $("#history-newest").disabled = historyState.before === null;
  const pageNo = historyState.cursors.length + 1;
  $("#history-note").textContent = `page ${pageNo}; ${page.kept} event(s) kept`;
}

// The clip that holds an event (vdet records one around each, with `clips.folder` set),
// played in a dialog. Without a key the video element fetches it itself, with range
// requests (seeking); with a key it is fetched whole with the key in a header.
async function playClipOf(e, cellEl) {
  let listing;
  try {
    listing = await api(`/v1/streams/${encodeURIComponent(e.source_id)}/clips`);
  } catch (err) {
    cellEl.textContent = err instanceof ApiError && err.status === 404 ? "no clips" : "unavailable";
    return;
  }
  const clip = listing.clips.find((c) => c.start_time <= e.time && e.time <= c.end_time);
  if (!clip) {
    cellEl.textContent = "no clip yet";
    return;
  }
  const video = $("#clip-video");
  if (video.dataset.objectUrl) URL.revokeObjectURL(video.dataset.objectUrl);
  delete video.dataset.objectUrl;
  if (apiKey) {
    const response = await fetch(clip.url, { headers: authHeaders() });
    if (!response.ok) {
      cellEl.textContent = "no longer kept";
      return;
    }
    video.dataset.objectUrl = URL.createObjectURL(await response.blob());
    video.src = video.dataset.objectUrl;
  } else {
    video.src = clip.url;
  }
  video.dataset.clipId = clip.clip_id;
  $("#clip-title").textContent = `${e.source_id}: ${e.type} ${e.zone} (${e.class_name} #${e.track_id})`;
  const when = new Date(clip.start_time * 1000).toLocaleString();
  $("#clip-note").textContent = `${when}, ${clip.duration_s.toFixed(1)} s, ${clip.events.length} event(s)`;
  $("#clip-dialog").showModal();
  video.play().catch(() => {});
}

function setupClipDialog() {
  $("#clip-close").addEventListener("click", () => {
    const video = $("#clip-video");
    video.pause();
    $("#clip-dialog").close();
  });
}

function setupHistory() {
  $("#history-form").addEventListener("submit", (event) => {
    event.preventDefault();
    historyState.before = null;
    historyState.cursors = [];
    loadHistory();
  });
  $("#history-older").addEventListener("click", () => {
    historyState.cursors.push(historyState.before);
    historyState.before = Number($("#history-older").dataset.next);
    loadHistory();
  });
  $("#history-newest").addEventListener("click", () => {
    historyState.before = null;
    historyState.cursors = [];
    loadHistory();
  });
}

// --- start ------------------------------------------------------------------------------------

function start() {
  setupKeyDialog();
  setupAddForm();
  setupParamsForm();
  setupEditor();
  setupHistory();
  setupClipDialog();
  refreshGpus().then(refreshStreams).then(loadHistory);
  refreshTile();
  setInterval(refreshStreams, POLL_STREAMS_MS);
  setInterval(refreshGpus, POLL_GPU_MS);
}

start();
