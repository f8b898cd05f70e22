// The hub process: `node src/hub/hub-main.ts [--flag value]...` (flags and ASB_HUB_* variables
// in src/hub/hub-config.ts). Prints one JSON line `{"ready":true,"url":...}` on stdout when it
// serves; logs go to stderr. SIGINT/SIGTERM close it in order.
import { startHub } from './hub.ts';
import { parseHubConfig } from './hub-config.ts';
import { runMain } from '../base/process-main.ts';

runMain({
  name: 'hub',
  parse: parseHubConfig,
  async start(config, log) {
    const hub = await startHub(config, { log });
    return { ready: { url: hub.url }, close: () => hub.close() };
  },
});
