// Waiting on a file a sandbox's own process writes, through the unmodified E2B JS SDK.
import type * as e2b from 'e2b';

/** The file's trimmed contents once it is there and not empty; polls for up to ~10 s. */
export async function waitForFile(sbx: e2b.Sandbox, path: string): Promise<string> {
  for (let i = 0; i < 100; i++) {
    const out = await sbx.commands.run(`cat ${path} 2>/dev/null || true`);
    if (out.stdout.trim() !== '') return out.stdout.trim();
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${path} never appeared`);
}
