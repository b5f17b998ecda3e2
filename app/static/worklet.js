// AudioWorklet: collects the microphone's first channel and posts ~100 ms Float32Array chunks
// (at the AudioContext's sample rate) to the page, which sends them as 16-bit PCM.
class CaptureProcessor extends AudioWorkletProcessor {
  constructor() {
    super();
    this.size = Math.round(sampleRate / 10);
    this.buffer = new Float32Array(this.size);
    this.filled = 0;
    this.port.onmessage = (e) => {
      if (e.data === "flush" && this.filled > 0) {
        this.port.postMessage(this.buffer.slice(0, this.filled));
        this.filled = 0;
      }
    };
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    let offset = 0;
    while (offset < channel.length) {
      const n = Math.min(channel.length - offset, this.size - this.filled);
      this.buffer.set(channel.subarray(offset, offset + n), this.filled);
      this.filled += n;
      offset += n;
      if (this.filled === this.size) {
        this.port.postMessage(this.buffer);
        this.buffer = new Float32Array(this.size);
        this.filled = 0;
      }
    }
    return true;
  }
}

registerProcessor("capture-processor", CaptureProcessor);
