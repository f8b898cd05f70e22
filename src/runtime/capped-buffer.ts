// Captured output of a command, up to a cap: what is past it is dropped (and flagged), while the
// stream keeps being read so the process never blocks on a full pipe or socket.

/** The cap per stream when an ExecRequest sets no maxOutputBytes, in both runtimes. */
export const DEFAULT_MAX_OUTPUT = 10 * 1024 * 1024;

export class CappedBuffer {
  readonly #chunks: Buffer[] = [];
  #size = 0;
  truncated = false;
  readonly #max: number;

  constructor(max: number) {
    this.#max = max;
  }

  push(chunk: Buffer): void {
    const room = this.#max - this.#size;
    if (chunk.length > room) this.truncated = true;
    if (room <= 0) return;
    const kept = chunk.length > room ? chunk.subarray(0, room) : chunk;
    // Kept as given, not copied: a pipe's or WebSocket's chunks are fresh buffers the reader owns,
    // and bytes() copies them anyway (a 512 MiB readFile was copied one more time before).
    this.#chunks.push(kept);
    this.#size += kept.length;
  }

  bytes(): Uint8Array {
    return new Uint8Array(Buffer.concat(this.#chunks));
  }
}
