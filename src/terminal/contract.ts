// The terminal protocol: one WebSocket per session into a PTY inside a sandbox. Served by every
// worker (src/worker/) and by the hub, which proxies it to the owning worker (src/hub/); reachable
// straight through the edge Envoy as well (api.<domain> or an IP host, path below). The worker,
// the hub, `asb shell` and the web console all follow this file; docs/api-and-cli.md documents it.
//
// Open:   GET /v1/sandboxes/{id}/terminal?cols=<1-1000>&rows=<1-1000>[&command=<argv0>&command=<argv1>...]
//         Upgrade: websocket. Authenticated by EITHER `Authorization: Bearer <API key>` (CLI)
//         OR `?token=<terminal token>` (browsers cannot set headers on a WebSocket). A token is
//         issued by POST /v1/sandboxes/{id}/terminal-tokens (API key; answer TerminalTokenView),
//         works once, for that sandbox only, and expires after TERMINAL_TOKEN_TTL_MS.
//         Refusals happen before the upgrade, as ordinary HTTP answers (problem+json):
//         401 (no/bad key or token, token used or expired), 404 (no such sandbox, or not yours),
//         409 (sandbox not running: resume it first), 400 (bad cols/rows/command).
// Frames: client → server  binary: bytes typed (stdin of the PTY)
//                          text:   a TerminalClientControl (JSON)
//         server → client  binary: PTY output
//                          text:   a TerminalServerControl (JSON); `exit` is the last frame
// Close:  TERMINAL_CLOSE codes below. The server closes with `normal` right after `exit`.
// Idle:   no frame either way for the idle timeout (default 15 min, worker flag) → close `idle`.
// Backpressure: the server reads the PTY only while the socket's send buffer is under
//         TERMINAL_HIGH_WATER_BYTES (a stalled client stalls the shell, never grows memory), and
//         stops reading the socket while the PTY has not accepted the last input. The hub's
//         proxy pauses each side while the other side's buffer is over the same mark.

export const TERMINAL_PATH_SUFFIX = '/terminal';
export const TERMINAL_TOKENS_PATH_SUFFIX = '/terminal-tokens';

/** A terminal token lives this long (unused). */
export const TERMINAL_TOKEN_TTL_MS = 60_000;

/** Stop reading the PTY while this many bytes wait to be sent to the client. */
export const TERMINAL_HIGH_WATER_BYTES = 256 * 1024;

export const TERMINAL_CLOSE = {
  /** The shell exited (after the exit frame). */
  normal: 1000,
  /** The server is shutting down. */
  goingAway: 1001,
  /** A frame that breaks this protocol (bad JSON control, unknown type). */
  protocolError: 1002,
  /** The sandbox stopped (hibernated, deleted) under the session. */
  sandboxGone: 4001,
  /** Idle timeout. */
  idle: 4002,
  /** The API key that opened the session (by header, or through the terminal token it got) was revoked. */
  keyRevoked: 4003,
  /** Internal error opening or running the PTY. */
  internal: 1011,
} as const;

export type TerminalClientControl = { type: 'resize'; cols: number; rows: number };

export type TerminalServerControl =
  /** The shell's exit status (128+n for signal n). */
  | { type: 'exit'; code: number }
  /** Sent once right after the upgrade: which sandbox and cluster answered. */
  | { type: 'ready'; sandboxId: string; cluster: string };

export interface TerminalTokenView {
  token: string;
  /** ISO time after which the token is refused. */
  expiresAt: string;
  /** The path to open with `?token=`, relative to the API base. */
  path: string;
}
