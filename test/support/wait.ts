// Polls a condition until it holds or a deadline passes: for end-to-end tests that watch real
// processes change state (a sandbox hibernating, a pool filling), where no event is at hand.
export async function waitFor<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 60_000, intervalMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await fn();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, intervalMs));
  }
}
