// multipart/form-data request bodies (RFC 7578), as the E2B SDK sends file uploads: one part per
// file, its filename the full target path. The body is already in memory (bounded by the upload
// limit), so parts are sliced out of it rather than streamed.
import { AsbError } from '../../errors.ts';

export interface Part {
  name: string | undefined;
  filename: string | undefined;
  data: Buffer;
}

function malformed(why: string): AsbError {
  return new AsbError('BadRequest', `malformed multipart body: ${why}`);
}

export function boundaryOf(contentType: string): string {
  const m = /;\s*boundary=(?:"([^"]{1,70})"|([^\s;]{1,70}))/i.exec(contentType);
  const boundary = m?.[1] ?? m?.[2];
  if (boundary === undefined) throw new AsbError('BadRequest', 'Content-Type multipart/form-data needs a boundary parameter');
  return boundary;
}

/** A quoted parameter of Content-Disposition. Browsers and undici escape `"`, CR and LF as %22, %0D, %0A (HTML's form encoding). */
function param(disposition: string, key: string): string | undefined {
  const extended = new RegExp(`;\\s*${key}\\*=(?:UTF-8|utf-8)''([^;]*)`).exec(disposition);
  if (extended?.[1] !== undefined) {
    try {
      return decodeURIComponent(extended[1]);
    } catch {
      throw malformed(`${key}* is not percent-encoded UTF-8`);
    }
  }
  const m = new RegExp(`;\\s*${key}="((?:[^"\\\\]|\\\\.)*)"`).exec(disposition) ?? new RegExp(`;\\s*${key}=([^;\\s]+)`).exec(disposition);
  if (m?.[1] === undefined) return undefined;
  return m[1].replace(/\\(.)/g, '$1').replace(/%22/g, '"').replace(/%0D/gi, '\r').replace(/%0A/gi, '\n');
}

export function parseMultipart(body: Buffer, boundary: string): Part[] {
  const delimiter = Buffer.from(`--${boundary}`, 'latin1');
  const next = Buffer.from(`\r\n--${boundary}`, 'latin1');
  let pos = body.indexOf(delimiter);
  if (pos === -1) throw malformed(`no --${boundary} delimiter`);
  pos += delimiter.length;
  const parts: Part[] = [];
  for (;;) {
    if (body[pos] === 0x2d && body[pos + 1] === 0x2d) return parts; // the closing delimiter "--"
    const headerStart = body.indexOf('\r\n', pos);
    if (headerStart === -1) throw malformed('a delimiter is not followed by a line break');
    const headerEnd = body.indexOf('\r\n\r\n', headerStart);
    // A part with no headers at all has its blank line right after the delimiter's line break.
    const headerText = headerEnd === -1 || headerEnd < headerStart ? '' : body.subarray(headerStart + 2, headerEnd).toString('utf8');
    if (headerEnd === -1) throw malformed('a part has no blank line after its headers');
    const dataEnd = body.indexOf(next, headerEnd + 4);
    if (dataEnd === -1) throw malformed('the last part is not closed by a delimiter');
    let disposition = '';
    for (const line of headerText.split('\r\n')) {
      const colon = line.indexOf(':');
      if (colon !== -1 && line.slice(0, colon).trim().toLowerCase() === 'content-disposition') disposition = line.slice(colon + 1);
    }
    parts.push({ name: param(disposition, 'name'), filename: param(disposition, 'filename'), data: body.subarray(headerEnd + 4, dataEnd) });
    pos = dataEnd + next.length;
    if (parts.length > 10_000) throw malformed('more than 10000 parts');
  }
}
