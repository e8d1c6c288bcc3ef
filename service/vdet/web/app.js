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
let autoOpened = false;
const processedBefore = new Map(); // id -> [frames_processed, time]
const detectFps = new Map();
const gpuOf = new Map();

function fmt(value, digits = 1) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

async function refreshStreams() {
  if ($("#key-dialog").open) return; // waiting for the key: no point asking again
  try {
    const data = await api("/v1/streams");
    streams = data.streams;
    const now = performance.now();
    for (const s of streams) {
      const before = processedBefore.get(s.id);
      const processed = s.status.frames_processed;
      if (before && now > before[1]) {
        detectFps.set(s.id, ((processed - before[0]) * 1000) / (now - before[1]));
      }
      processedBefore.set(s.id, [processed, now]);
    }
    $("#streams-error").textContent = "";
    $("#conn").textContent = "";
    renderStreams();
    if (!autoOpened && !live && streams.length) {
      autoOpened = true; // the first stream's live view, once; then the operator picks
      openLive(streams[0].id);
    }
  } catch (err) {
    $("#conn").textContent = "disconnected";
    $("#streams-error").textContent = err instanceof ApiError ? err.message : "server unreachable";
  }
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

function cell(row, text, className) {
  const td = row.insertCell();
  td.textContent = text;
  if (className) td.className = className;
  return td;
}

function renderStreams() {
  const body = $("#streams tbody");
  body.replaceChildren();
  $("#streams-empty").hidden = streams.length > 0;
  for (const s of streams) {
    const st = s.status;
    const row = body.insertRow();
    row.dataset.streamId = s.id;
    if (live && live.id === s.id) row.classList.add("selected");
    const idCell = row.insertCell();
    const view = document.createElement("button");
    view.type = "button";
    view.textContent = s.id;
    view.title = `live view of ${s.id}`;
    view.addEventListener("click", () => openLive(s.id));
    idCell.append(view);
    const state = document.createElement("span");
    state.className = `state state-${st.state}`;
    state.textContent = st.state;
    row.insertCell().append(state);
    cell(row, fmt(st.fps), "num");
    cell(row, fmt(detectFps.get(s.id)), "num");
    cell(row, String(st.frames_dropped), "num");
    cell(row, String(st.frames_skipped ?? 0), "num");
    cell(row, String(st.reconnects), "num");
    cell(row, gpuOf.get(s.id) ?? (s.spec.gpu ?? "–"));
    cell(row, st.pipeline_error || st.last_error || "", "err");
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "danger";
    remove.textContent = "Remove";
    remove.addEventListener("click", () => removeStream(s.id, remove));
    row.insertCell().append(remove);
  }
  if (live) {
    const current = streams.find((s) => s.id === live.id);
    if (current) live.stream = current;
    else closeLive(); // removed, here or elsewhere
  }
}

const armedRemovals = new Set(); // a second click within 4 s confirms

async function removeStream(id, button) {
  if (!armedRemovals.has(id)) {
    armedRemovals.add(id);
    button.textContent = "Click again to remove";
    setTimeout(() => armedRemovals.delete(id), 4000);
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
  showShots(live, []);
  live = null;
  $("#live-section").hidden = true;
  renderStreams();
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
  loadZones(view);
  loadShots(view);
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

// --- start ------------------------------------------------------------------------------------

function start() {
  setupKeyDialog();
  setupAddForm();
  setupParamsForm();
  refreshGpus().then(refreshStreams);
  setInterval(refreshStreams, POLL_STREAMS_MS);
  setInterval(refreshGpus, POLL_GPU_MS);
}

start();
