// How a webhook delivery is signed, and how a receiver checks it (docs/events.md). The
// signature is HMAC-SHA256, keyed with the webhook's secret, over
// `<timestamp>.<raw body>`, where the timestamp (Unix seconds) is the asb-timestamp header: a
// receiver that refuses timestamps more than a few minutes from its clock refuses a replayed
// delivery, and the body cannot be moved to another timestamp without the secret.
import { createHmac, timingSafeEqual } from 'node:crypto';

export const SIGNATURE_HEADER = 'asb-signature';
export const TIMESTAMP_HEADER = 'asb-timestamp';
/** What a receiver should tolerate between the timestamp and its clock. */
export const DEFAULT_TOLERANCE_S = 300;

export function sign(secret: string, timestampS: number, body: string): string {
  return `v1=${createHmac('sha256', secret).update(`${String(timestampS)}.${body}`).digest('hex')}`;
}

export type Verdict = { ok: true } | { ok: false; why: string };

/** The check a receiver makes: the signature matches and the timestamp is recent. */
export function verify(secret: string, headers: { signature: string | undefined; timestamp: string | undefined }, body: string, nowS: number, toleranceS = DEFAULT_TOLERANCE_S): Verdict {
  if (headers.signature === undefined || headers.timestamp === undefined) return { ok: false, why: 'missing signature or timestamp header' };
  if (!/^\d{1,12}$/.test(headers.timestamp)) return { ok: false, why: 'timestamp is not Unix seconds' };
  const ts = Number(headers.timestamp);
  if (Math.abs(nowS - ts) > toleranceS) return { ok: false, why: `timestamp ${headers.timestamp} is more than ${String(toleranceS)} s from now` };
  const want = Buffer.from(sign(secret, ts, body));
  const got = Buffer.from(headers.signature);
  if (want.length !== got.length || !timingSafeEqual(want, got)) return { ok: false, why: 'signature does not match' };
  return { ok: true };
}
