// ferry's status and chat page: polls GET /v1/ferry/status, draws each model's placement, and
// streams chat answers from POST /v1/chat/completions. Plain browser JavaScript, no libraries.
"use strict";

const POLL_MS = 1500;
const $ = (id) => document.getElementById(id);
const turns = [];

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}
const num = (x) => (x == null ? "–" : x.toFixed(1));
const pct = (x) => (x == null ? "–" : (100 * x).toFixed(0) + "%");

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text != null) e.textContent = text;
  return e;
}

function drawLive(live) {
  $("prompt-tps").textContent = num(live.tokens_per_s.prompt);
  $("gen-tps").textContent = num(live.tokens_per_s.generation);
  $("requests").textContent = live.requests.running + " / " + live.requests.waiting;
  const link = live.link;
  $("link").textContent = bytes(link.bytes_per_s) + "/s" +
    (link.measured_bytes_per_s ? " of " + bytes(link.measured_bytes_per_s) + "/s" : "");
  $("stall").textContent = Math.round(100 * (link.stall_seconds_per_s || 0)) + "%";
  $("tiers").textContent = (live.tier_decisions.stream || 0) + " / " + (live.tier_decisions.host || 0);
  $("expert-hits").textContent = pct(live.experts.hit_rate);
}

function drawBudget(node, b) {
  const bar = node.querySelector(".bar");
  bar.replaceChildren();
  const parts = [["weights", b.weights, "var(--device)"], ["slots", b.slots, "var(--slots)"],
    ["KV cache", b.kv_cache, "var(--kv)"], ["workspace", b.workspace, "var(--work)"],
    ["reserve", b.reserve, "var(--swapped)"]];
  const total = Math.max(b.budget, b.device_total, 1);
  for (const [name, size, colour] of parts) {
    const s = el("span");
    s.style.width = (100 * size / total) + "%";
    s.style.background = colour;
    s.title = name + ": " + bytes(size);
    bar.append(s);
  }
  node.querySelector(".legend").textContent = "budget " + bytes(b.budget) + ": " +
    parts.map(([n, s]) => n + " " + bytes(s)).join(", ") + "; host " + bytes(b.host);
}

function drawExperts(node, placement, live) {
  const block = node.querySelector(".experts-block");
  block.hidden = placement.experts.length === 0;
  if (block.hidden) return;
  const grid = node.querySelector(".experts");
  grid.replaceChildren();
  // The metrics count routed experts per kind, not per expert: cached experts are shaded by
  // the expert cache's hit rate.
  const shade = live.experts.hit_rate == null ? 1 : 0.35 + 0.65 * live.experts.hit_rate;
  for (const layer of placement.experts) {
    const row = el("div", "row");
    row.append(el("b", null, String(layer.layer)));
    for (const where of layer.experts) {
      const s = el("span", where);
      if (where === "cached") s.style.opacity = shade;
      row.append(s);
    }
    grid.append(row);
  }
  node.querySelector(".expert-note").textContent = placement.expert_cache_slots +
    " cache slots; routed: " + live.experts.hit + " hit, " + live.experts.miss + " miss, " +
    live.experts.host + " host";
}

function drawModel(m, live) {
  let node = document.querySelector('.model[data-id="' + CSS.escape(m.id) + '"]');
  if (!node) {
    node = $("model-template").content.firstElementChild.cloneNode(true);
    node.dataset.id = m.id;
    $("models").append(node);
  }
  node.querySelector(".name").textContent = m.id;
  node.querySelector(".status").textContent = m.status + (m.residency ? " · " + m.residency : "");
  const p = m.placement;
  node.querySelector(".mode").textContent = p ? "offload " + p.offload_mode : "no placement";
  const strip = node.querySelector(".strip");
  strip.replaceChildren();
  if (p) {
    drawBudget(node, p.budget);
    for (const layer of p.layers) {
      const s = el("span", layer.location, String(layer.index));
      s.setAttribute("role", "listitem");
      s.title = "layer " + layer.index + ": " + layer.location.replace("_", " ") + ", " + bytes(layer.bytes);
      strip.append(s);
    }
    drawExperts(node, p, live);
  }
  const kv = m.kv_cache, prefix = m.prefix_cache;
  node.querySelector(".kv").value = kv.fill;
  node.querySelector(".kv-text").textContent = kv.used_tokens + " / " + kv.capacity_tokens + " tokens";
  node.querySelector(".prefix").value = prefix.fill;
  node.querySelector(".prefix-text").textContent = prefix.tokens + " tokens, hit rate " + pct(prefix.hit_rate);
}

async function poll() {
  try {
    const r = await fetch("/v1/ferry/status", { headers: headers() });
    if (!r.ok) throw new Error("status " + r.status);
    const doc = await r.json();
    drawLive(doc.live);
    for (const m of doc.models) drawModel(m, doc.live);
    $("conn").textContent = "live";
  } catch (e) {
    $("conn").textContent = "status unavailable (" + e.message + ")";
  }
  setTimeout(poll, POLL_MS);
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const list = await r.json();
    const select = $("model");
    const chosen = select.value;
    select.replaceChildren();
    for (const m of list.data || []) select.append(new Option(m.id, m.id));
    if (chosen) select.value = chosen;
  } catch (e) {
    setTimeout(loadModels, POLL_MS);
  }
}

function bubble(role, text) {
  const b = el("div", "msg " + role, text);
  $("transcript").append(b);
  $("transcript").scrollTop = $("transcript").scrollHeight;
  return b;
}

// Reads an SSE body, calling onData with each `data:` payload.
async function readEvents(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split("\n")) {
        if (line.startsWith("data:")) onData(line.slice(5).trim());
      }
    }
  }
}

async function send(event) {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text) return;
  $("message").value = "";
  $("send").disabled = true;
  turns.push({ role: "user", content: text });
  bubble("user", text);
  const answer = bubble("assistant", "");
  let reply = "";
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(chatRequest(turns)),
    });
    if (!r.ok) {
      const err = await r.json().catch(() => ({}));
      throw new Error((err.error && err.error.message) || "HTTP " + r.status);
    }
    await readEvents(r.body, (data) => {
      if (data === "[DONE]") return;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      for (const choice of chunk.choices || []) {
        reply += (choice.delta && choice.delta.content) || "";
      }
      answer.textContent = reply;
    });
    answer.dataset.done = "true";
    turns.push({ role: "assistant", content: reply });
  } catch (e) {
    answer.classList.add("error");
    answer.textContent = (reply ? reply + "\n" : "") + "error: " + e.message;
    answer.dataset.done = "error";
    turns.pop();
  } finally {
    $("send").disabled = false;
  }
}

$("send-form").addEventListener("submit", send);
$("api-key").addEventListener("change", loadModels);
loadModels();
poll();

// The chat request: an empty temperature field sends none, so the model's sampling defaults
// (its setting, its files, else llama.cpp's) apply as they do for any client.
function chatRequest(turns) {
  const request = {
    model: $("model").value,
    messages: turns,
    stream: true,
    max_tokens: Number($("max-tokens").value),
  };
  const temperature = $("temperature").value.trim();
  if (temperature !== "") request.temperature = Number(temperature);
  return request;
}
