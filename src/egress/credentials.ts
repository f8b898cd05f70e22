// Credential injection rules, pure: "for requests to host H (optionally under path prefix P),
// set header X to secret S". The egress proxy applies them outside the sandbox, so the sandbox
// sends requests without the real key and never holds it. Envoy terminates TLS only for the
// hosts these rules name (src/egress/egress-envoy.ts); every other host passes through unopened.

export interface CredentialRule {
  /** Stable id (API and metrics). */
  readonly id: string;
  /** Exact name ("api.example.com") or one-level-or-deeper wildcard ("*.example.com"). */
  readonly host: string;
  /** Only requests whose path starts with this ("/v1/"); absent: every path. */
  readonly pathPrefix?: string;
  /** Header to set (lower case); the sandbox's own value of it is replaced. */
  readonly header: string;
  /** Name of the secret whose value becomes the header value (Bearer prefixes belong in the secret). */
  readonly secret: string;
}

export interface CredentialSource {
  /** The rules that apply to one sandbox's traffic. */
  rulesFor(sandbox: string): readonly CredentialRule[];
  /** A secret's value; undefined when it was deleted (the rule then sets nothing). */
  secretValue(name: string): string | undefined;
}

/** "*.example.com" matches "a.example.com" and "a.b.example.com", not "example.com". */
export function hostMatches(pattern: string, domain: string): boolean {
  if (pattern.startsWith('*.')) return domain.endsWith(pattern.slice(1)) && domain.length > pattern.length - 1;
  return pattern === domain;
}

/** The headers to set on one request; the longest matching path prefix wins per header. */
export function credentialHeaders(src: CredentialSource, sandbox: string, domain: string, path: string): { name: string; value: string }[] {
  const best = new Map<string, CredentialRule>();
  for (const rule of src.rulesFor(sandbox)) {
    if (!hostMatches(rule.host, domain)) continue;
    if (rule.pathPrefix !== undefined && !path.startsWith(rule.pathPrefix)) continue;
    const seen = best.get(rule.header);
    if (seen === undefined || (rule.pathPrefix ?? '').length > (seen.pathPrefix ?? '').length) best.set(rule.header, rule);
  }
  const out: { name: string; value: string }[] = [];
  for (const [name, rule] of best) {
    const value = src.secretValue(rule.secret);
    if (value !== undefined) out.push({ name, value });
  }
  return out;
}

/** The hosts whose TLS the proxy must terminate: every host some rule names. */
export function interceptedHosts(rules: readonly CredentialRule[]): string[] {
  return [...new Set(rules.map((r) => r.host))].sort();
}
