// Browser client of the speech-to-text server: microphone -> AudioWorklet -> WebSocket
// (/v1/audio/stream, pcm_f32le at the AudioContext's rate), and a file upload through
// POST /v1/audio/transcriptions with stream=true (Server-Sent Events).
"use strict";

const $ = (id) => document.getElementById(id);
const state = { committed: "", partial: "", events: [], done: null, error: null };
window.sttState = state; // for tests and debugging

let socket = null;
let audioContext = null;
let mediaStream = null;
let workletNode = null;

function apiKey() {
  return $("apikey").value.trim();
}

function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: "Bearer " + key } : {};
}

function setStatus(text, isError = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", isError);
}

function render() {
  $("committed").textContent = state.committed;
  $("partial").textContent = state.partial;
}

async function loadModels() {
  try {
    const r = await fetch("/v1/models", { headers: authHeaders() });
    if (!r.ok) return;
    const body = await r.json();
    const select = $("model");
    const current = select.value;
    select.length = 1;
    for (const m of body.data || []) {
      const option = document.createElement("option");
      option.value = option.textContent = m.id;
      select.appendChild(option);
    }
    select.value = current;
  } catch (e) {
    /* the page still works with the server's default model */
  }
}

function streamUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  const url = new URL(scheme + "//" + location.host + "/v1/audio/stream");
  const key = apiKey();
  if (key) url.searchParams.set("api_key", key); // browsers cannot set headers on a WebSocket
  return url.toString();
}

function onServerEvent(event) {
  state.events.push(event.type);
  switch (event.type) {
    case "session.created":
    case "session.updated":
      break;
    case "transcript.text.partial":
      state.partial = event.text;
      break;
    case "transcript.text.delta":
      state.committed += event.delta;
      break;
    case "transcript.segment":
      break;
    case "transcript.text.done":
      state.done = event.text;
      state.partial = "";
      setStatus("done");
      break;
    case "error":
      state.error = event.error;
      setStatus("error: " + event.error.message, true);
      break;
  }
  render();
}

async function start() {
  $("start").disabled = true;
  setStatus("starting…");
  state.partial = "";
  state.done = null;
  state.error = null;
  if (state.committed) state.committed += "\n";
  render();
  try {
    mediaStream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    audioContext = new AudioContext();
    await audioContext.audioWorklet.addModule("/static/worklet.js");
  } catch (e) {
    setStatus("microphone unavailable: " + e.message, true);
    await stopAudio();
    $("start").disabled = false;
    return;
  }
  socket = new WebSocket(streamUrl());
  socket.binaryType = "arraybuffer";
  socket.onopen = () => {
    const session = { sample_rate: audioContext.sampleRate, encoding: "pcm_f32le" };
    if ($("model").value) session.model = $("model").value;
    if ($("language").value.trim()) session.language = $("language").value.trim();
    socket.send(JSON.stringify({ type: "session.update", session }));
    const source = audioContext.createMediaStreamSource(mediaStream);
    workletNode = new AudioWorkletNode(audioContext, "capture-processor");
    workletNode.port.onmessage = (e) => {
      if (socket && socket.readyState === WebSocket.OPEN) socket.send(e.data.buffer);
    };
    source.connect(workletNode);
    setStatus("listening (" + audioContext.sampleRate + " Hz)");
    $("stop").disabled = false;
  };
  socket.onmessage = (e) => onServerEvent(JSON.parse(e.data));
  socket.onclose = (e) => {
    if (e.code !== 1000 && !state.error) setStatus("connection closed (" + e.code + " " + e.reason + ")", true);
    socket = null;
    stopAudio();
    $("start").disabled = false;
    $("stop").disabled = true;
  };
}

async function stopAudio() {
  if (workletNode) {
    workletNode.port.postMessage("flush");
    workletNode.disconnect();
    workletNode = null;
  }
  if (mediaStream) {
    mediaStream.getTracks().forEach((t) => t.stop());
    mediaStream = null;
  }
  if (audioContext) {
    await audioContext.close();
    audioContext = null;
  }
}

async function stop() {
  $("stop").disabled = true;
  setStatus("finishing…");
  await stopAudio();
  if (socket && socket.readyState === WebSocket.OPEN) {
    socket.send(JSON.stringify({ type: "session.close" }));
  }
}

// ---- file upload (REST + SSE) ------------------------------------------------------------------
async function upload() {
  const file = $("file").files[0];
  const out = $("file-transcript");
  const status = $("file-status");
  if (!file) {
    status.textContent = "choose a file first";
    return;
  }
  out.textContent = "";
  status.textContent = "uploading…";
  status.classList.remove("error");
  const form = new FormData();
  form.append("file", file);
  form.append("stream", "true");
  if ($("model").value) form.append("model", $("model").value);
  if ($("language").value.trim()) form.append("language", $("language").value.trim());
  try {
    const r = await fetch("/v1/audio/transcriptions", { method: "POST", body: form, headers: authHeaders() });
    if (!r.ok) {
      const body = await r.json().catch(() => null);
      throw new Error(body && body.error ? body.error.message : "HTTP " + r.status);
    }
    status.textContent = "transcribing…";
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let pending = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      pending += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = pending.indexOf("\n\n")) >= 0) {
        const block = pending.slice(0, cut);
        pending = pending.slice(cut + 2);
        for (const line of block.split("\n")) {
          if (!line.startsWith("data:")) continue;
          const event = JSON.parse(line.slice(5));
          if (event.type === "transcript.text.delta") out.textContent += event.delta;
          else if (event.type === "transcript.text.done") {
            out.textContent = event.text;
            status.textContent = "done";
          } else if (event.type === "error") throw new Error(event.error.message);
        }
      }
    }
  } catch (e) {
    status.textContent = "error: " + e.message;
    status.classList.add("error");
  }
}

$("start").addEventListener("click", start);
$("stop").addEventListener("click", stop);
$("clear").addEventListener("click", () => {
  state.committed = "";
  state.partial = "";
  render();
});
$("upload").addEventListener("click", upload);
$("apikey").value = localStorage.getItem("stt-api-key") || "";
$("apikey").addEventListener("change", () => {
  localStorage.setItem("stt-api-key", apiKey());
  loadModels();
});
loadModels();
