// Browser client of the speech-to-text server: microphone -> AudioWorklet -> WebSocket on the
// OpenAI Realtime transcription protocol (/v1/realtime?intent=transcription; 16-bit PCM at the
// AudioContext's rate, server VAD turns, with this server's partial-text extension), and a file
// upload through POST /v1/audio/transcriptions with stream=true (Server-Sent Events), with speakers
// (diarized_json) when asked.
"use strict";

const $ = (id) => document.getElementById(id);
const DELTA = "conversation.item.input_audio_transcription.delta";
const PARTIAL = "conversation.item.input_audio_transcription.partial";
const COMPLETED = "conversation.item.input_audio_transcription.completed";
// committed: text that will not change; partial: the tail that may; done: the whole text once
// stopped and every item completed
const state = { committed: "", partial: "", events: [], done: null, error: null };
window.sttState = state; // for tests and debugging

let socket = null;
let audioContext = null;
let mediaStream = null;
let workletNode = null;
let stopping = false;
let sessionText = ""; // this session's text (the page keeps earlier sessions above it)
const waiting = new Set(); // items committed, not yet completed

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

function realtimeUrl() {
  const scheme = location.protocol === "https:" ? "wss:" : "ws:";
  return scheme + "//" + location.host + "/v1/realtime?intent=transcription&partials=true";
}

async function clientSecret(sampleRate) {
  // a short-lived key made for this session's settings: the server's key never goes on the
  // WebSocket (browsers cannot set its headers: the secret travels as a subprotocol, as OpenAI's)
  const transcription = {};
  if ($("model").value) transcription.model = $("model").value;
  if ($("language").value.trim()) transcription.language = $("language").value.trim();
  const input = { format: { type: "audio/pcm", rate: sampleRate }, transcription };
  const r = await fetch("/v1/realtime/client_secrets", {
    method: "POST",
    headers: { ...authHeaders(), "Content-Type": "application/json" },
    body: JSON.stringify({
      expires_after: { anchor: "created_at", seconds: 60 },
      session: { type: "transcription", audio: { input } },
    }),
  });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error ? body.error.message : "HTTP " + r.status);
  return body.value;
}

function append(text) {
  state.committed += text;
  sessionText += text;
}

function finishIfDone() {
  if (!stopping || waiting.size > 0 || state.done !== null) return;
  state.done = sessionText.trim();
  state.partial = "";
  setStatus("done");
  if (socket) socket.close(1000, "done");
}

function onServerEvent(event) {
  state.events.push(event.type);
  switch (event.type) {
    case PARTIAL:
      state.partial = event.text;
      break;
    case DELTA:
      append(event.delta);
      state.partial = "";
      break;
    case "input_audio_buffer.committed":
      waiting.add(event.item_id);
      break;
    case COMPLETED:
      waiting.delete(event.item_id);
      if (!/\s$/.test(sessionText) && sessionText) append(" "); // items are sentences apart
      finishIfDone();
      break;
    case "error":
      if (event.error.code === "input_audio_buffer_commit_empty") {
        finishIfDone(); // stopped after a turn had ended: nothing left to commit
        break;
      }
      state.error = event.error;
      setStatus("error: " + event.error.message, true);
      break;
  }
  render();
}

function pcm16Base64(samples) {
  const bytes = new Uint8Array(samples.length * 2);
  const view = new DataView(bytes.buffer);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    view.setInt16(2 * i, s < 0 ? s * 32768 : s * 32767, true);
  }
  let binary = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    binary += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(binary);
}

async function start() {
  $("start").disabled = true;
  setStatus("starting…");
  state.partial = "";
  state.done = null;
  state.error = null;
  stopping = false;
  sessionText = "";
  waiting.clear();
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
  let secret;
  try {
    secret = await clientSecret(audioContext.sampleRate);
  } catch (e) {
    setStatus("cannot start a session: " + e.message, true);
    await stopAudio();
    $("start").disabled = false;
    return;
  }
  socket = new WebSocket(realtimeUrl(), ["realtime", "openai-insecure-api-key." + secret]);
  socket.onopen = () => {
    const source = audioContext.createMediaStreamSource(mediaStream);
    workletNode = new AudioWorkletNode(audioContext, "capture-processor");
    workletNode.port.onmessage = (e) => {
      if (socket && socket.readyState === WebSocket.OPEN) {
        socket.send(JSON.stringify({ type: "input_audio_buffer.append", audio: pcm16Base64(e.data) }));
      }
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
  stopping = true;
  if (socket && socket.readyState === WebSocket.OPEN) {
    // the speech still in the buffer becomes the last item; its completed ends the session
    socket.send(JSON.stringify({ type: "input_audio_buffer.commit" }));
  }
}

// ---- file upload (REST + SSE) ------------------------------------------------------------------
// With "Speakers" the request asks for diarized_json: each transcript.text.segment event is one
// speaker's turn, shown as a line with its label (A, B, ... or a known speaker's name); each
// speaker gets the next of the page's colours in order of appearance.
const SPEAKER_COLOURS = 6;

function appendSegment(out, speakers, event) {
  if (!speakers.has(event.speaker)) speakers.set(event.speaker, speakers.size % SPEAKER_COLOURS);
  const line = document.createElement("div");
  line.className = "segment speaker-" + speakers.get(event.speaker);
  line.dataset.speaker = event.speaker;
  const who = document.createElement("span");
  who.className = "speaker";
  who.textContent = event.speaker;
  const text = document.createElement("span");
  text.textContent = event.text.trim();
  line.append(who, text);
  out.append(line);
}

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
  const withSpeakers = $("speakers").checked;
  if (withSpeakers) form.append("response_format", "diarized_json");
  const speakers = new Map();
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
          else if (event.type === "transcript.text.segment") appendSegment(out, speakers, event);
          else if (event.type === "transcript.text.done") {
            if (!withSpeakers) out.textContent = event.text;
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
