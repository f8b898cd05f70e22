// `host:port` addresses as flags and configuration give them, IPv6 in brackets (`[::1]:9100`).

export interface HostPort {
  host: string;
  port: number;
}

/** Splits `host:port` or `[v6]:port` (port 0 allowed: pick one); undefined when malformed. */
export function parseHostPort(address: string): HostPort | undefined {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:[\]\s]+)):(\d{1,5})$/.exec(address);
  if (m === null) return undefined;
  const port = Number(m[3]);
  if (port > 65535) return undefined;
  return { host: m[1] ?? m[2] ?? '', port };
}
