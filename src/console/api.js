// The console's calls to the hub: the API key from sessionStorage as a Bearer token, answers as
// JSON, refusals as an ApiError carrying the problem document's detail.
const KEY = 'asb.apiKey';

export class ApiError extends Error {
  constructor(status, code, detail) {
    super(detail);
    this.status = status;
    this.code = code;
  }
}

export function storedKey() {
  return sessionStorage.getItem(KEY);
}

export function storeKey(key) {
  if (key === null) sessionStorage.removeItem(KEY);
  else sessionStorage.setItem(KEY, key);
}

/** A call with an explicit key (the login check) or the stored one. */
export async function api(method, path, { key = storedKey(), json } = {}) {
  const headers = { authorization: `Bearer ${key ?? ''}` };
  if (json !== undefined) headers['content-type'] = 'application/json';
  let res;
  try {
    res = await fetch(path, { method, headers, body: json === undefined ? undefined : JSON.stringify(json) });
  } catch (err) {
    throw new ApiError(0, 'Network', `the hub did not answer: ${err.message}`);
  }
  const text = await res.text();
  let body;
  try {
    body = text === '' ? undefined : JSON.parse(text);
  } catch {
    body = undefined;
  }
  if (!res.ok) {
    const detail = typeof body?.detail === 'string' ? body.detail : `${res.status} ${res.statusText}: ${text.slice(0, 200)}`;
    throw new ApiError(res.status, body?.code ?? 'Unknown', detail);
  }
  return body;
}
