// Terminals over plain HTTP: POST /v1/sandboxes/{id}/terminal-tokens issues a single-use token
// for opening the terminal WebSocket from a browser (token.ts); a plain GET of the
// terminal path (no Upgrade header) answers 400 naming what to do. The WebSocket itself is
// served by terminal.ts from the server's 'upgrade' event.
import { LABEL } from '../../api/types.ts';
import { AsbError } from '../../errors.ts';
import { TERMINAL_PATH_SUFFIX, TERMINAL_TOKENS_PATH_SUFFIX, type TerminalTokenView } from '../../terminal/contract.ts';
import { findSandbox, principalOf } from '../access.ts';
import type { WorkerContext } from '../deps.ts';
import type { Route } from '../../http/router.ts';
import type { TerminalTokens } from './token.ts';

export function terminalRoutes(w: WorkerContext, tokens: TerminalTokens): Route[] {
  return [
    {
      method: 'POST',
      pattern: `/v1/sandboxes/{id}${TERMINAL_TOKENS_PATH_SUFFIX}`,
      async handler(ctx) {
        const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
        const id = sandbox.metadata.name;
        // The token is bound to the owner team (none: ''), so it opens nothing once the sandbox changes hands.
        const team = sandbox.metadata.labels?.[LABEL.owner] ?? '';
        // And to the key asking, so revoking that key ends what the token opens (terminal.ts).
        const issued = tokens.issue(id, team, principalOf(ctx).prefix);
        const view: TerminalTokenView = {
          token: issued.token,
          expiresAt: new Date(issued.expiresAt).toISOString(),
          path: `/v1/sandboxes/${encodeURIComponent(id)}${TERMINAL_PATH_SUFFIX}`,
        };
        return { status: 201, json: view };
      },
    },
    {
      method: 'GET',
      pattern: `/v1/sandboxes/{id}${TERMINAL_PATH_SUFFIX}`,
      async handler(ctx) {
        const sandbox = await findSandbox(w, ctx, ctx.params.id ?? '');
        throw new AsbError('BadRequest', `/v1/sandboxes/${sandbox.metadata.name}${TERMINAL_PATH_SUFFIX} is a WebSocket endpoint: connect with "Upgrade: websocket" (the protocol is described in src/terminal/contract.ts), or run asb shell ${sandbox.metadata.name}`);
      },
    },
  ];
}
