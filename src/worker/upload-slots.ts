// How many uploads run at once, per key and on the whole worker. Uploads stream into the sandbox
// (src/runtime/file-upload.ts), so each holds little memory (~300 KiB at most: the first 256 KiB
// read to see whether the body is small, a socket read, the pipe into the sandbox, zlib's
// window), but each also holds a process in the sandbox and a share of
// the worker's CPU; one tenant must not take all of either. Over a bound the upload is refused at
// once with 429 and Retry-After rather than queued: a queue would hold the request's socket (and
// whatever the client keeps sending into it) for an unknown time, while a 429 tells the client
// at once when to come back (the E2B SDKs raise RateLimitError for a 429).
import { AsbError } from '../errors.ts';
import { Slots, type SlotBounds } from './slots.ts';

/** Uploads at once per key (an API key's prefix, or a sandbox's access token); the probe's 8 concurrent uploads from one key still fit. */
export const DEFAULT_UPLOADS_PER_KEY = 8;
/** Uploads at once on one worker, all keys together: 32 × ~300 KiB is ~10 MiB of buffers, and 32 `cat` processes. */
export const DEFAULT_UPLOADS_TOTAL = 32;
/** An upload of the 64 MiB limit takes ~0.5 s on loopback: a second later a slot is likely free. */
export const UPLOAD_RETRY_AFTER_S = 1;

export type UploadBounds = SlotBounds;

/** Upload slots per key (an API key's prefix, or a sandbox's access token) and on the worker. */
export class UploadSlots extends Slots {
  /** Runs `upload` in a slot for `key`, or throws TooManyRequests (429, Retry-After) naming the bound. */
  async run<T>(key: string, who: string, upload: () => Promise<T>): Promise<T> {
    const admission = this.admit(key);
    if (admission.kind === 'refused') {
      const where = admission.scope === 'key' ? `${who} already has ${admission.limit} uploads in flight` : `this worker already has ${admission.limit} uploads in flight`;
      throw new AsbError('TooManyRequests', `${where}, the most it takes at once; retry when one has finished`, { retryAfterS: UPLOAD_RETRY_AFTER_S });
    }
    try {
      return await upload();
    } finally {
      admission.release();
    }
  }
}
