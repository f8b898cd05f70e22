// Kubernetes resource quantities ("1Gi", "500m", "1e3", 2): the grammar of
// apimachinery/pkg/api/resource. We parse to a plain number (bytes, cores, ...): float
// precision is enough for sizes up to 2^53 bytes (8 PiB), far past any sandbox volume.

const QUANTITY = /^([+-]?(?:\d+(?:\.\d*)?|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$/;

const SUFFIX: Readonly<Record<string, number>> = {
  n: 1e-9, u: 1e-6, m: 1e-3, '': 1,
  k: 1e3, M: 1e6, G: 1e9, T: 1e12, P: 1e15, E: 1e18,
  Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, Pi: 2 ** 50, Ei: 2 ** 60,
};

/** The value of a quantity, or undefined when it is not one. YAML may give a bare number. */
export function parseQuantity(quantity: string | number): number | undefined {
  if (typeof quantity === 'number') return Number.isFinite(quantity) ? quantity : undefined;
  const m = QUANTITY.exec(quantity.trim() === quantity ? quantity : '');
  if (m === null) return undefined;
  const mantissa = Number(m[1]);
  const suffix = m[2] ?? '';
  const scale = SUFFIX[suffix] ?? 10 ** Number(suffix.slice(1));
  const value = mantissa * scale;
  return Number.isFinite(value) ? value : undefined;
}
