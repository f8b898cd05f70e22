// A whole HTTP response as tests read it: the status, and the body parsed as JSON when it is
// JSON, else its text (a sandbox's own answer, /readyz's "ok").
import type { IncomingMessage } from 'node:http';

export interface HttpAnswer<T> {
  status: number;
  body: T;
}

/** Reads res to its end; rejects if the response errors midway. */
export function readAnswer<T>(res: IncomingMessage): Promise<HttpAnswer<T>> {
  return new Promise((resolveRead, reject) => {
    const chunks: Buffer[] = [];
    res.on('data', (chunk: Buffer) => chunks.push(chunk));
    res.on('error', reject);
    res.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      let body: unknown = text;
      try {
        body = JSON.parse(text);
      } catch {
        // not JSON: the text is the body
      }
      resolveRead({ status: res.statusCode ?? 0, body: body as T });
    });
  });
}
