// What one template build may use: it runs at most timeoutMs (default 10 min) and writes at most
// diskBytes of files (default 10 GiB, the engine enforces it), with the CPUs and memory its
// template asks for (within the maximums) or the defaults.
export interface BuildLimits {
  timeoutMs: number;
  diskBytes: number;
  defaultCpuCount: number;
  defaultMemoryMB: number;
  maxCpuCount: number;
  maxMemoryMB: number;
}

export const DEFAULT_BUILD_LIMITS: BuildLimits = Object.freeze({
  timeoutMs: 10 * 60_000,
  diskBytes: 10 * 1024 ** 3,
  defaultCpuCount: 2,
  defaultMemoryMB: 1024,
  maxCpuCount: 16,
  maxMemoryMB: 64 * 1024,
});
