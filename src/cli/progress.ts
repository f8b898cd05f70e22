// A spinner with elapsed time while the CLI waits (create, resume). It draws on stderr and only
// when stderr is a terminal, so pipes and logs see nothing but the result on stdout.
import type { Clock, Timer } from '../base/clock.ts';
import { formatDuration } from './output.ts';

export interface ProgressStream {
  isTTY?: boolean;
  write(chunk: string): unknown;
}

// 80 ms per frame is about 12 fps: smooth to the eye, negligible CPU.
const FRAME_MS = 80;
const FRAMES = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

export class Spinner {
  readonly #stream: ProgressStream;
  readonly #clock: Clock;
  readonly #label: string;
  readonly #startedAt: number;
  #frame = 0;
  #timer: Timer | undefined;
  #closed = false;

  constructor(stream: ProgressStream, clock: Clock, label: string) {
    this.#stream = stream;
    this.#clock = clock;
    this.#label = label;
    this.#startedAt = clock.now();
    if (stream.isTTY === true) this.#tick();
  }

  /** Milliseconds since the spinner started. */
  elapsedMs(): number {
    return this.#clock.now() - this.#startedAt;
  }

  #tick(): void {
    if (this.#closed) return;
    const glyph = FRAMES[this.#frame % FRAMES.length] ?? '-';
    this.#frame++;
    // \r returns to the line start, \x1b[K clears what a longer previous frame left behind.
    this.#stream.write(`\r${glyph} ${this.#label} ${formatDuration(this.elapsedMs())}\x1b[K`);
    this.#timer = this.#clock.after(FRAME_MS, () => this.#tick());
  }

  /** Stops and erases the spinner line. Idempotent. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#timer?.cancel();
    if (this.#stream.isTTY === true) this.#stream.write('\r\x1b[K');
  }
}

/** Runs work with a spinner shown meanwhile; the spinner is gone before the result is printed. */
export async function withSpinner<T>(stream: ProgressStream, clock: Clock, label: string, work: () => Promise<T>): Promise<T> {
  const spinner = new Spinner(stream, clock, label);
  try {
    return await work();
  } finally {
    spinner.close();
  }
}
